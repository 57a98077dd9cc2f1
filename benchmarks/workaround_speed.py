"""Export-time workarounds that exist for speed: each one timed with and without it.

Three cases, each on the sweep's tiny model of the class that showed the cost:

* ``swin-dynamic-trace``: ``DynamoExporter`` with dynamic shapes on SwinModel, with and without
  ``_patch_floordiv_cancels_without_simplify`` (floor divisions reduced without ``sympy.simplify``);
* ``qwen35moe-dynamic-load``: ``load_exported_program`` of Qwen3_5MoeTextModel exported with dynamic
  shapes, with and without ``_patch_parse_each_size_expression_once``;
* ``exaone-vision-onnx``: ``OnnxExporter`` (static) on Exaone4_5_VisionModel, with and without
  ``_patch_multi_output_match_checks_the_first_node_first`` (the optimizer's multi-output rewrite).

Every measurement runs in a fresh process (sympy's and torch's caches would otherwise carry over
from one to the next), the two variants alternating, ``--repeat`` times each; the median is
reported with the ratio without/with. Writes ``benchmarks/results/workaround_speed.json`` and prints a
Markdown table for ``benchmarks/README.md``.

Usage: ``python benchmarks/workaround_speed.py [--cases a,b] [--repeat 1]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import command_line  # noqa: E402

CASES = {
    "swin-dynamic-trace": "_patch_floordiv_cancels_without_simplify",
    "qwen35moe-dynamic-load": "_patch_parse_each_size_expression_once",
    "exaone-vision-onnx": "_patch_multi_output_match_checks_the_first_node_first",
}


def measure(case: str, without: bool) -> float:
    """Seconds of the timed step of ``case`` in this process, with the workaround removed when ``without``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    from hf_exporters import DynamoConfig, DynamoExporter, OnnxConfig, registry
    from hf_exporters.exporters.dynamo import load_exported_program
    from hf_exporters.exporters.onnx import OnnxExporter
    from hf_exporters.sweep.inputs import build_inputs
    from hf_exporters.sweep.job import build_model

    name = CASES[case]
    if not any(w.func.__name__ == name for w in registry._REGISTRY):
        raise LookupError(f"no registered workaround named {name}")

    def drop() -> None:
        if without:
            registry._REGISTRY[:] = [w for w in registry._REGISTRY if w.func.__name__ != name]

    if case == "swin-dynamic-trace":
        model = build_model("SwinModel")
        inputs = build_inputs(model)
        drop()
        start = time.perf_counter()
        DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
        return time.perf_counter() - start
    if case == "qwen35moe-dynamic-load":
        model = build_model("Qwen3_5MoeTextModel")
        inputs = build_inputs(model)
        exporter = DynamoExporter()
        with tempfile.TemporaryDirectory() as folder:
            path = exporter.save(exporter.export(model, inputs, DynamoConfig(dynamic=True)), folder)
            drop()
            start = time.perf_counter()
            load_exported_program(path, "Qwen3_5MoeTextModel")
            return time.perf_counter() - start
    if case == "exaone-vision-onnx":
        model = build_model("Exaone4_5_VisionModel")
        inputs = build_inputs(model)
        drop()
        start = time.perf_counter()
        OnnxExporter().export(model, inputs, OnnxConfig())
        return time.perf_counter() - start
    raise ValueError(f"unknown case {case!r}; known: {', '.join(CASES)}")


def run_child(case: str, without: bool) -> float:
    command = [sys.executable, __file__, "--child", case] + (["--without"] if without else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{case} ({'without' if without else 'with'}) failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--without", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "workaround_speed.json"))
    args = parser.parse_args()
    if args.child:
        print(measure(args.child, args.without))
        return

    import torch
    import transformers

    rows = []
    for case in [c for c in args.cases.split(",") if c]:
        if case not in CASES:
            parser.error(f"unknown case {case!r}; known: {', '.join(CASES)}")
        times: dict[str, list[float]] = {"with": [], "without": []}
        for _ in range(args.repeat):
            for variant in ("without", "with"):
                times[variant].append(run_child(case, variant == "without"))
        with_s, without_s = statistics.median(times["with"]), statistics.median(times["without"])
        rows.append({"case": case, "workaround": CASES[case], "with_s": with_s, "without_s": without_s, "ratio": without_s / with_s, "samples": times})
        print(f"{case}: with {with_s:.1f} s, without {without_s:.1f} s", file=sys.stderr)
    result = {
        "command": command_line(),
        "rows": rows,
        "repeat": args.repeat,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()},
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print("| case | workaround | with s | without s | without / with |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['case']} | `{row['workaround']}` | {row['with_s']:.1f} | {row['without_s']:.1f} | {row['ratio']:.2f} |")


if __name__ == "__main__":
    main()
