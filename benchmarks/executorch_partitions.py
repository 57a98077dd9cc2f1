"""XNNPACK partitions with and without the partition workarounds, in one run.

For each batch size, exports the model (``--model``: the embedded all-MiniLM-L6-v2, or a Llama
built from a config with random weights: ``llama-tiny``, 2 layers, or ``llama-100m``) with
``ExecutorchExporter`` (XNNPACK, static shapes, sequence ``--seq``) twice: as the exporter does and
with the model's partition workarounds left out (MiniLM: ``_patch_xnnpack_attention_and_layer_norm_decompositions``;
Llama: ``_patch_xnnpack_decoder_decompositions`` and ``_fix_attention_on_repeated_heads_as_grouped``). Reports,
for each: the number of XNNPACK partitions (``executorch_call_delegate`` calls), the operators left
to portable kernels between them, the export time, XNNPACK ``preprocess`` calls and seconds, and the
latency of ``forward`` in ``executorch.runtime`` against eager PyTorch (median of ``--runs`` rounds,
the three engines interleaved, order alternating each round), with parity on the timed inputs.

Writes ``benchmarks/results/executorch_partitions.json`` and prints a Markdown table.

Usage: ``python benchmarks/executorch_partitions.py [--model minilm] [--batches 1,8] [--seq 128] [--runs 20] [--out PATH]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _timing import command_line, interleaved_ms  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.set_verbosity_error()

from hf_exporters import ExecutorchConfig, ExecutorchExporter, registry  # noqa: E402
from hf_exporters.pipeline import SAMPLE_TEXTS, default_model_path, load_checkpoint  # noqa: E402
from hf_exporters.runtime import compare_leaves, eager_outputs  # noqa: E402
from hf_exporters.runtime.et_runner import ExecutorchRunner  # noqa: E402

WORKAROUNDS = {
    "minilm": ["_patch_xnnpack_attention_and_layer_norm_decompositions"],
    "llama": ["_patch_xnnpack_decoder_decompositions", "_fix_attention_on_repeated_heads_as_grouped"],
}
LLAMA_CONFIGS = {
    "llama-tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    "llama-100m": dict(vocab_size=32000, hidden_size=640, intermediate_size=1792, num_hidden_layers=8, num_attention_heads=10, num_key_value_heads=5),
}
SENTENCES = SAMPLE_TEXTS + [
    "The quick brown fox jumps over the lazy dog.",
    "Latency is measured as the median of many runs.",
    "ExecuTorch runs the program with the XNNPACK delegate.",
    "Sentence embeddings place similar meanings close together.",
]


@contextlib.contextmanager
def without(names: list[str]):
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


@contextlib.contextmanager
def preprocess_timer(totals: dict):
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    original = XnnpackBackend.preprocess

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals["preprocess_calls"] += 1
            totals["preprocess_seconds"] += time.perf_counter() - start

    XnnpackBackend.preprocess = staticmethod(timed)
    try:
        yield
    finally:
        XnnpackBackend.preprocess = staticmethod(original)


def export(model, inputs, with_workaround: bool, workarounds: list[str]) -> dict:
    totals = collections.Counter()
    exporter = ExecutorchExporter()
    context = contextlib.nullcontext() if with_workaround else without(workarounds)
    with context, preprocess_timer(totals):
        start = time.perf_counter()
        manager = exporter.export(model, inputs, ExecutorchConfig(backend="xnnpack", dynamic=False))
        seconds = time.perf_counter() - start
    outside = collections.Counter()
    partitions = 0
    for node in manager.exported_program().graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if name == "executorch_call_delegate":
            partitions += 1
        elif name != "getitem":
            outside[str(node.target).split(":")[0].replace("<EdgeOpOverload: ", "")] += 1
    return {
        "runner": ExecutorchRunner(manager.buffer),
        "partitions": partitions,
        "portable_ops": dict(outside.most_common()),
        "export_seconds": round(seconds, 2),
        "preprocess_calls": totals["preprocess_calls"],
        "preprocess_seconds": round(totals["preprocess_seconds"], 2),
        "pte_bytes": len(manager.buffer),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="minilm", choices=["minilm", *LLAMA_CONFIGS])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "executorch_partitions.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.model == "minilm":
        model, tokenizer, _ = load_checkpoint(default_model_path())
        workarounds = WORKAROUNDS["minilm"]
    else:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_CONFIGS[args.model])).eval()
        workarounds = WORKAROUNDS["llama"]
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa

    sdpa.get_graphs(), bilinear_2d.get_graphs()  # built once per process by the first preprocess: not in either export's time
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        if args.model == "minilm":
            texts = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
            inputs = dict(tokenizer(texts, padding="max_length", truncation=True, max_length=args.seq, return_tensors="pt"))
        else:
            ids = torch.randint(0, LLAMA_CONFIGS[args.model]["vocab_size"], (batch, args.seq), generator=torch.Generator().manual_seed(batch))
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        variants = {"with the workaround": export(model, inputs, True, workarounds), "without": export(model, inputs, False, workarounds)}
        engines = {f".pte {name}": (lambda r=v["runner"]: r(inputs)) for name, v in variants.items()}
        engines["eager PyTorch"] = lambda: model(**inputs)
        samples = interleaved_ms(engines, args.runs, args.warmup)
        eager_ms = statistics.median(samples["eager PyTorch"])
        for name, variant in variants.items():
            median = statistics.median(samples[f".pte {name}"])
            diff = max(d.max_abs_diff for d in compare_leaves(eager_outputs(model, inputs), variant["runner"](inputs), atol=1e-3))
            row = {
                "model": args.model,
                "batch": batch,
                "seq": args.seq,
                "variant": name,
                **{k: v for k, v in variant.items() if k != "runner"},
                "median_ms": round(median, 2),
                "eager_median_ms": round(eager_ms, 2),
                "ratio_to_eager": round(median / eager_ms, 3),
                "max_abs_diff_vs_eager": diff,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {
        "meta": {
            "command": command_line(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
            "torch": torch.__version__,
            "executorch": __import__("importlib.metadata").metadata.version("executorch"),
            "runs": args.runs,
            "model": args.model,
            "workarounds_left_out_in_without": workarounds,
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| batch | variant | partitions | export s | preprocess s | .pte ms | eager ms | .pte / eager | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['variant']} | {r['partitions']} | {r['export_seconds']:.1f} | {r['preprocess_seconds']:.1f} "
            f"| {r['median_ms']:.1f} | {r['eager_median_ms']:.1f} | {r['ratio_to_eager']:.2f} | {r['max_abs_diff_vs_eager']:.1e} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
