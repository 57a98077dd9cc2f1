"""Prefill and decode of a generation folder lowered in one ``to_edge_transform_and_lower`` call (one
multi-method ``.pte``) against one call per part (two ``.pte`` files, as ``export_for_generation`` writes).

Exports the tiny Llama's generation parts with ``ExecutorchExporter`` (XNNPACK, dynamic shapes, as the
folder does), keeping each part's traced program; then lowers both programs in one call under the same
Stage 3 patches, runs every method of both artifacts through ``executorch.runtime`` on the parts'
example inputs, and reports lowering seconds, ``.pte`` bytes and the largest difference between the
two artifacts' outputs.

Writes ``benchmarks/results/executorch_multimethod.json``.

Usage: ``python benchmarks/executorch_multimethod.py [--layers 2] [--hidden 64] [--vocab 256]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.set_verbosity_error()

from hf_exporters import ExecutorchConfig, ExecutorchExporter, registry  # noqa: E402
from hf_exporters.generation import export_for_generation  # noqa: E402
from hf_exporters.runtime.et_runner import INPUT_MUTATIONS_METHOD  # noqa: E402
from hf_exporters.shapes import size_oblivious_sizes  # noqa: E402


def run_method(buffer: bytes, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(buffer)
    return [t.clone() for t in program.load_method(method).execute(inputs) if isinstance(t, torch.Tensor)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "executorch_multimethod.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    import executorch.exir as exir
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    sdpa.get_graphs(), bilinear_2d.get_graphs()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=4, num_key_value_heads=2, eos_token_id=None,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(1, args.vocab, (1, 8), generator=torch.Generator().manual_seed(1))

    captured: list[dict[str, Any]] = []
    original = exir.to_edge_transform_and_lower

    def capturing(programs: Any, *a: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        edge = original(programs, *a, **kw)
        captured.append({"program": programs, "constant_methods": kw.get("constant_methods"), "lower_seconds": time.perf_counter() - start})
        return edge

    exir.to_edge_transform_and_lower = capturing
    try:
        start = time.perf_counter()
        parts = export_for_generation(ExecutorchExporter(), model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, ExecutorchConfig())
        separate_seconds = time.perf_counter() - start
    finally:
        exir.to_edge_transform_and_lower = original
    names = list(parts)
    programs = {name: entry["program"] for name, entry in zip(names, captured)}
    separate = {name: parts[name].buffer for name in names}

    with registry.apply_patches("executorch.xnnpack", stage="Stage 3: ExecuTorch patches"), size_oblivious_sizes():
        start = time.perf_counter()
        edge = exir.to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()], constant_methods=captured[0]["constant_methods"])
        combined_lower = time.perf_counter() - start
        start = time.perf_counter()
        combined = edge.to_executorch().buffer
        combined_emit = time.perf_counter() - start

    diffs = {}
    for name in names:
        leaves = [t for t in pytree.tree_leaves(programs[name].example_inputs) if isinstance(t, torch.Tensor)]
        want = run_method(separate[name], "forward", leaves)
        got = run_method(combined, name, leaves)
        diffs[name] = max(float((g - w).abs().max()) for g, w in zip(got, want))
    result = {
        "parts": names,
        "separate": {
            "lower_seconds": {n: round(e["lower_seconds"], 2) for n, e in zip(names, captured)},
            "export_seconds_all_stages": round(separate_seconds, 2),
            "pte_bytes": {n: len(b) for n, b in separate.items()},
            "pte_bytes_total": sum(len(b) for b in separate.values()),
        },
        "combined": {"lower_seconds": round(combined_lower, 2), "to_executorch_seconds": round(combined_emit, 2), "pte_bytes": len(combined)},
        "max_abs_diff_combined_vs_separate": diffs,
        "config_method": INPUT_MUTATIONS_METHOD,
        "load_average": os.getloadavg(),
        "model": {"layers": args.layers, "hidden": args.hidden, "vocab": args.vocab},
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
