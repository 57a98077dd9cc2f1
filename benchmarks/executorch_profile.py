"""Where ExecuTorch export time goes, and where XNNPACK's partitions end.

For each model (``--models``, default all): exports it with ``ExecutorchExporter`` (XNNPACK) once with
timers wrapped around ExecuTorch's lowering, and reports

- the export split by phase: our trace (``torch.export`` and our stages), then inside
  ``to_edge_transform_and_lower``: every ``run_decompositions`` call (count, seconds), the conversion
  to the edge dialect, the partitioner, XNNPACK ``preprocess`` per partition (nodes, seconds, and the
  seconds of each pass of XNNPACK's pass pipeline summed over partitions), the rest of ``to_backend``
  (cutting the partitions out, copying each partition's program), and ``to_executorch`` with the
  serialisation of the buffer;
- the number of XNNPACK partitions (``executorch_call_delegate`` calls), and every operator left to
  portable kernels between them, with the reason the XNNPACK partitioner gave for refusing it
  (``WhyNoPartition``), or "no XNNPACK config" when no config claims the operator.

Timers are wall clock, so under load they stretch; the shares (each phase over the lowering in the same
export) move far less. ``--cprofile`` adds a cProfile pass per model (its top functions by cumulative
time), which is robust to load but slows everything about 1.5 to 2 times.

Work done once per process (XNNPACK's pattern graphs for SDPA and bilinear upsampling, each built with
``torch.export`` and ``to_edge`` the first time a partition is preprocessed) is done before the first
export and reported on its own.

Writes ``benchmarks/results/executorch_profile.json`` and prints Markdown tables.

Usage: ``python benchmarks/executorch_profile.py [--models minilm,llama-static,llama-dynamic,llama-100m]
[--without WORKAROUND,...] [--out PATH]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import json
import os
import platform
import pstats
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import command_line  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.set_verbosity_error()

from hf_exporters import ExecutorchConfig, ExecutorchExporter, registry  # noqa: E402
from hf_exporters.pipeline import build_inputs, default_model_path, load_checkpoint  # noqa: E402

LLAMA_CONFIGS = {
    # the 2-layer Llama of benchmarks/export_time.py
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    # ~100M parameters, as in benchmarks/generation_speed.py
    "100m": dict(vocab_size=32000, hidden_size=640, intermediate_size=1792, num_hidden_layers=8, num_attention_heads=10, num_key_value_heads=5),
}


def build_models(names: list[str]) -> dict[str, tuple[torch.nn.Module, dict[str, Any], bool]]:
    """``name -> (model, inputs, dynamic)``; Llamas from configs with random weights (seed 0)."""
    out: dict[str, tuple[torch.nn.Module, dict[str, Any], bool]] = {}
    for name in names:
        if name.startswith("minilm"):
            model, tokenizer, _ = load_checkpoint(default_model_path())
            out[name] = (model, build_inputs(model, tokenizer), name.endswith("dynamic"))
            continue
        size = "100m" if "100m" in name else "tiny"
        torch.manual_seed(0)
        llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_CONFIGS[size])).eval()
        ids = torch.randint(0, LLAMA_CONFIGS[size]["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1))
        out[name] = (llama, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, name.endswith("dynamic"))
    return out


@contextlib.contextmanager
def without(names: list[str]) -> Iterator[None]:
    """The registry without the workarounds ``names`` (restored after)."""
    saved = registry._REGISTRY[:]
    missing = set(names) - {w.func.__name__ for w in saved}
    if missing:
        raise LookupError(sorted(missing))
    registry._REGISTRY[:] = [w for w in saved if w.func.__name__ not in names]
    try:
        yield
    finally:
        registry._REGISTRY[:] = saved


class Recorder:
    """Wall-clock timers wrapped around ExecuTorch functions for one export; restored on exit."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self.partitions: list[dict[str, Any]] = []
        self.pass_seconds: collections.Counter[str] = collections.Counter()
        self.all_pass_seconds: collections.Counter[str] = collections.Counter()
        self.all_pass_calls: collections.Counter[str] = collections.Counter()
        self.why: dict[str, str] = {}
        self.edge_program: Any = None
        self._stack = contextlib.ExitStack()

    def _wrap(self, owner: Any, attribute: str, label: str, static: bool = False, after: Callable[..., None] | None = None) -> None:
        original = getattr(owner, attribute)
        raw = owner.__dict__[attribute] if isinstance(owner, type) and attribute in owner.__dict__ else original

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                result = original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.seconds[label] += elapsed
                self.calls[label] += 1
            if after is not None:
                after(elapsed, args, result)
            return result

        setattr(owner, attribute, staticmethod(timed) if static else timed)
        self._stack.callback(setattr, owner, attribute, raw)

    def __enter__(self) -> Recorder:
        from executorch.backends.xnnpack import _passes as xnnpack_passes
        from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
        from executorch.exir.backend import backend_api
        from executorch.exir.backend.utils import WhyNoPartition
        from executorch.exir.program import _program

        self._wrap(torch.export.ExportedProgram, "run_decompositions", "run_decompositions")
        self._wrap(_program, "_generate_edge_program", "edge dialect (_generate_edge_program)")
        import executorch.exir as exir

        self._wrap(exir, "to_edge_transform_and_lower", "to_edge_transform_and_lower")
        self._wrap(_program.EdgeProgramManager, "to_backend", "to_backend")
        def keep_edge(elapsed: float, args: Any, result: Any) -> None:
            self.edge_program = args[0].exported_program()  # the lowered edge graph, node names as partitioned

        self._wrap(_program.EdgeProgramManager, "to_executorch", "to_executorch", after=keep_edge)
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        self._wrap(XnnpackPartitioner, "partition", "partitioner (XnnpackPartitioner.partition)")
        self._wrap(backend_api, "lower_all_submodules_to_backend", "lower_all_submodules_to_backend")

        def partition_done(elapsed: float, args: Any, result: Any) -> None:
            program = args[0]
            nodes = sum(n.op == "call_function" for n in program.graph.nodes)
            self.partitions.append({"nodes": nodes, "seconds": round(elapsed, 3)})

        self._wrap(XnnpackBackend, "preprocess", "XNNPACK preprocess", static=True, after=partition_done)

        original_transform = xnnpack_passes._transform

        def transform(ep: Any, pass_: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original_transform(ep, pass_, *args, **kwargs)
            finally:
                self.pass_seconds[type(pass_).__name__] += time.perf_counter() - start

        xnnpack_passes._transform = transform
        self._stack.callback(setattr, xnnpack_passes, "_transform", original_transform)

        from torch.fx.passes.infra.pass_base import PassBase

        original_pass_call = PassBase.__call__
        depth = [0]

        def pass_call(this: Any, graph_module: Any) -> Any:
            depth[0] += 1
            start = time.perf_counter()
            try:
                return original_pass_call(this, graph_module)
            finally:
                depth[0] -= 1
                if depth[0] == 0:  # a pass's own time, not counted again for passes it runs
                    self.all_pass_seconds[type(this).__name__] += time.perf_counter() - start
                    self.all_pass_calls[type(this).__name__] += 1

        PassBase.__call__ = pass_call
        self._stack.callback(setattr, PassBase, "__call__", original_pass_call)

        original_why = WhyNoPartition.__call__

        def why(this: Any, node: torch.fx.Node, reason: str) -> None:
            self.why.setdefault(node.name, reason)
            original_why(this, node, reason)

        WhyNoPartition.__call__ = why
        self._stack.callback(setattr, WhyNoPartition, "__call__", original_why)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()


def warm_xnnpack_patterns() -> float:
    """Build XNNPACK's pattern graphs (SDPA, bilinear upsampling) as its first ``preprocess`` does; seconds."""
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa

    start = time.perf_counter()
    sdpa.get_graphs()
    bilinear_2d.get_graphs()
    return time.perf_counter() - start


def xnnpack_targets() -> set[str]:
    """Operator names (``add.Tensor``) some XNNPACK partitioner config claims."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS

    return {config.target_name for config in ALL_PARTITIONER_CONFIGS}


def boundaries(program: Any, why: dict[str, str]) -> tuple[int, list[dict[str, Any]]]:
    """Partition count and the operators run outside XNNPACK in the lowered edge ``program``: op, count,
    reasons (from ``why``, keyed by node name)."""
    claimed = xnnpack_targets()
    partitions = 0
    ops: dict[str, dict[str, Any]] = {}
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if name == "executorch_call_delegate":
            partitions += 1
            continue
        if name in ("getitem", "alloc") or name.startswith("sym_"):
            continue
        op = str(node.target).replace("<EdgeOpOverload: ", "").split(">")[0].split(":")[0]
        op = op.removeprefix("aten.").removesuffix(".out").removesuffix("_out")
        entry = ops.setdefault(op, {"op": op, "count": 0, "reasons": collections.Counter()})
        entry["count"] += 1
        reason = why.get(node.name)
        if reason is None:
            base = op.split(".")[0]
            known = any(t.split(".")[0] == base for t in claimed)
            reason = "claimed by a config, refused without a reason" if known else "no XNNPACK config"
        entry["reasons"][reason] += 1
    rows = sorted(ops.values(), key=lambda e: -e["count"])
    for row in rows:
        row["reasons"] = dict(row["reasons"].most_common())
    return partitions, rows


def profile_one(name: str, model: torch.nn.Module, inputs: dict[str, Any], dynamic: bool, use_cprofile: bool) -> dict[str, Any]:
    config = ExecutorchConfig(backend="xnnpack", dynamic=dynamic)
    with Recorder() as rec:
        start = time.perf_counter()
        manager = ExecutorchExporter().export(model, inputs, config)
        serialise_start = time.perf_counter()
        size = len(manager.buffer)
        serialise = time.perf_counter() - serialise_start
        total = time.perf_counter() - start
    partitions, outside = boundaries(rec.edge_program, rec.why)
    lower = rec.seconds["to_edge_transform_and_lower"]
    backend = rec.seconds["to_backend"]
    preprocess = rec.seconds["XNNPACK preprocess"]
    partitioner = rec.seconds["partitioner (XnnpackPartitioner.partition)"]
    phases = {
        "trace (torch.export + our stages)": total - lower - rec.seconds["to_executorch"] - serialise,
        "run_decompositions": rec.seconds["run_decompositions"],
        "edge dialect (_generate_edge_program)": rec.seconds["edge dialect (_generate_edge_program)"],
        "partitioner": partitioner,
        "XNNPACK preprocess": preprocess,
        "rest of to_backend (cut out, copy partitions)": backend - partitioner - preprocess,
        "rest of to_edge_transform_and_lower": lower
        - rec.seconds["run_decompositions"]
        - rec.seconds["edge dialect (_generate_edge_program)"]
        - backend,
        "to_executorch (emit)": rec.seconds["to_executorch"],
        "serialise (buffer)": serialise,
    }
    result = {
        "model": name,
        "dynamic": dynamic,
        "export_seconds": round(total, 2),
        "lowering_seconds": round(lower, 2),
        "phases": {k: {"seconds": round(v, 2), "share_of_export": round(v / total, 3)} for k, v in phases.items()},
        "run_decompositions_calls": rec.calls["run_decompositions"],
        "edge_dialect_calls": rec.calls["edge dialect (_generate_edge_program)"],
        "partitions": partitions,
        "preprocess_calls": rec.calls["XNNPACK preprocess"],
        "preprocess_per_partition": rec.partitions,
        "xnnpack_pass_seconds": {k: round(v, 3) for k, v in rec.pass_seconds.most_common()},
        "outside_xnnpack": outside,
        "pass_seconds_all": {k: [rec.all_pass_calls[k], round(v, 3)] for k, v in rec.all_pass_seconds.most_common()},
        "pte_bytes": size,
    }
    if use_cprofile:
        profiler = cProfile.Profile()
        profiler.enable()
        ExecutorchExporter().export(model, inputs, config).buffer
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
        result["cprofile_top"] = text.getvalue()
    return result


def print_tables(rows: list[dict[str, Any]]) -> None:
    phases = list(rows[0]["phases"])
    print("\n| phase | " + " | ".join(r["model"] for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    print("| export s (total) | " + " | ".join(f"{r['export_seconds']:.1f}" for r in rows) + " |")
    for phase in phases:
        cells = [f"{r['phases'][phase]['seconds']:.1f} ({100 * r['phases'][phase]['share_of_export']:.0f} %)" for r in rows]
        print(f"| {phase} | " + " | ".join(cells) + " |")
    print("| run_decompositions calls | " + " | ".join(str(r["run_decompositions_calls"]) for r in rows) + " |")
    print("| XNNPACK partitions | " + " | ".join(str(r["partitions"]) for r in rows) + " |")
    print("| preprocess s per partition (mean) | " + " | ".join(
        f"{sum(p['seconds'] for p in r['preprocess_per_partition']) / max(1, len(r['preprocess_per_partition'])):.2f}" for r in rows
    ) + " |")
    for r in rows:
        print(f"\n{r['model']}: XNNPACK passes (seconds over {r['preprocess_calls']} partitions): "
              + ", ".join(f"{k} {v:.2f}" for k, v in list(r["xnnpack_pass_seconds"].items())[:8]))
        print(f"\n{r['model']}: operators outside XNNPACK")
        print("\n| op | count | reason |\n|---|---|---|")
        for o in r["outside_xnnpack"]:
            print(f"| `{o['op']}` | {o['count']} | " + "; ".join(f"{k} ({v})" for k, v in o["reasons"].items()) + " |")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="minilm,llama-static,llama-dynamic,llama-100m")
    parser.add_argument("--without", default="", help="workaround function names to leave out, comma-separated")
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "executorch_profile.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    names = [n for n in args.models.split(",") if n]
    models = build_models(names)
    left_out = [n for n in args.without.split(",") if n]
    warm = warm_xnnpack_patterns()
    print(f"one-time per process: XNNPACK pattern graphs {warm:.1f} s", flush=True)
    rows = []
    with without(left_out) if left_out else contextlib.nullcontext():
        for name, (model, inputs, dynamic) in models.items():
            load = os.getloadavg()[0]
            row = profile_one(name, model, inputs, dynamic, args.cprofile)
            row["load_average_1min_before"] = load
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("cprofile_top", "outside_xnnpack")}), flush=True)
    result = {
        "meta": {
            "command": command_line(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "threads": torch.get_num_threads(),
            "load_average_end": os.getloadavg(),
            "torch": torch.__version__,
            "executorch": __import__("importlib.metadata").metadata.version("executorch"),
            "without": left_out,
            "xnnpack_pattern_graphs_seconds_once_per_process": round(warm, 2),
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_tables(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
