"""ExecuTorch export time with and without a set of workarounds, interleaved in one process.

For each model (the models of ``executorch_profile.py``), exports it with ``ExecutorchExporter``
(XNNPACK) ``--rounds`` times in each variant, the variants alternating and their order reversed every
other round so that machine load hits both alike; reports the median export seconds of each, the ratio
(without / with: above 1, the workarounds make the export faster), the XNNPACK partition counts, the
``.pte`` bytes and the largest difference from eager PyTorch of each variant's ``.pte`` output (run by
``executorch.runtime``, first output).

The default set is this project's lowering-speed and decoder-partition workarounds; XNNPACK's pattern
graphs (built once per process) are built before the first export.

Writes ``benchmarks/results/executorch_lowering_ab.json`` and prints a Markdown table.

Usage: ``python benchmarks/executorch_lowering_ab.py [--models llama-static,minilm] [--rounds 2] [--without A,B]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import command_line  # noqa: E402
from executorch_profile import build_models, warm_xnnpack_patterns, without  # noqa: E402

import torch  # noqa: E402

from hf_exporters import ExecutorchConfig, ExecutorchExporter  # noqa: E402
from hf_exporters.runtime.et_runner import ExecutorchRunner  # noqa: E402

DEFAULT_WITHOUT = (
    "_patch_xnnpack_passes_skip_absent_operators,_patch_no_third_decomposition_when_nothing_is_left,"
    "_patch_xnnpack_decoder_decompositions,_fix_attention_on_repeated_heads_as_grouped"
)


def partitions(manager) -> int:
    return sum(getattr(n.target, "__name__", "") == "executorch_call_delegate" for n in manager.exported_program().graph.nodes)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="llama-static,llama-dynamic,minilm,llama-100m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--without", default=DEFAULT_WITHOUT)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "executorch_lowering_ab.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    left_out = [n for n in args.without.split(",") if n]
    warm_xnnpack_patterns()
    rows = []
    for name, (model, inputs, dynamic) in build_models(args.models.split(",")).items():
        with torch.no_grad():
            want = model(**inputs)[0]
        seconds: dict[str, list[float]] = {"with": [], "without": []}
        facts: dict[str, dict] = {}
        loads = []
        for round_index in range(args.rounds):
            order = ["with", "without"] if round_index % 2 == 0 else ["without", "with"]
            for variant in order:
                loads.append(os.getloadavg()[0])
                context = contextlib.nullcontext() if variant == "with" else without(left_out)
                with context:
                    start = time.perf_counter()
                    manager = ExecutorchExporter().export(model, inputs, ExecutorchConfig(backend="xnnpack", dynamic=dynamic))
                    buffer = manager.buffer
                    seconds[variant].append(time.perf_counter() - start)
                got = ExecutorchRunner(buffer)(inputs)[0]
                facts[variant] = {
                    "partitions": partitions(manager),
                    "pte_bytes": len(buffer),
                    "max_abs_diff_vs_eager": float((got - want).abs().max()),
                }
                print(name, variant, f"{seconds[variant][-1]:.1f} s", facts[variant], f"load {loads[-1]:.1f}", flush=True)
        with_s, without_s = statistics.median(seconds["with"]), statistics.median(seconds["without"])
        rows.append({
            "model": name,
            "dynamic": dynamic,
            "with_seconds": [round(s, 2) for s in seconds["with"]],
            "without_seconds": [round(s, 2) for s in seconds["without"]],
            "ratio_without_over_with": round(without_s / with_s, 2),
            "with": facts["with"],
            "without": facts["without"],
            "max_abs_eager": float(want.abs().max()),
            "load_average_1min": [round(x, 1) for x in loads],
        })
    result = {"meta": {"command": command_line(), "without": left_out, "rounds": args.rounds, "torch": torch.__version__}, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| model | export s with | export s without | without / with | partitions with / without | max abs diff with / without | load |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {statistics.median(r['with_seconds']):.1f} | {statistics.median(r['without_seconds']):.1f} "
            f"| {r['ratio_without_over_with']:.2f} | {r['with']['partitions']} / {r['without']['partitions']} "
            f"| {r['with']['max_abs_diff_vs_eager']:.1e} / {r['without']['max_abs_diff_vs_eager']:.1e} "
            f"| {min(r['load_average_1min']):.1f}-{max(r['load_average_1min']):.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
