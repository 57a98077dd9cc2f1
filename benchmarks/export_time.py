"""Export time: hf-exporters against bare library calls and against the exporters shipped in transformers.

Engines per backend, on the same model and inputs:

* dynamo: our ``DynamoExporter``, a bare ``torch.export.export`` call, ``transformers.exporters.DynamoExporter``;
* onnx: our ``OnnxExporter``, a bare ``torch.onnx.export(..., dynamo=True)``, ``transformers.exporters.OnnxExporter``,
  all at the same opset (``--opset``, default 23, ours' default);
* executorch: our ``ExecutorchExporter`` (xnnpack), a bare ``torch.export`` + ``to_edge_transform_and_lower``
  (``XnnpackPartitioner``) + ``to_executorch``, ``transformers.exporters.ExecutorchExporter``.

Every sample runs in a fresh Python process (one warm-up export, then one timed export), so no engine
inherits another's state (a bare ``torch.export`` of a model returning a ``DynamicCache`` fails unless a
pytree registration is left in the process: here it is not). ``--rounds`` interleaved rounds run every
engine once each; the median and the spread are reported, with ratios to ours. A bare call that fails is
a result: its error is reported.

Writes ``benchmarks/results/export_time.json`` (with the exact command and the load average) and prints a
Markdown table for ``benchmarks/README.md``.

Usage: ``python benchmarks/export_time.py [--backends dynamo,onnx,executorch] [--rounds 3] [--opset 23]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import write_results  # noqa: E402

MODELS = ("MiniLM static", "MiniLM dynamic", "tiny Llama prefill dynamic")
ENGINES = ("ours", "bare", "transformers.exporters")

CHILD = r"""
import copy, json, os, sys, time, warnings
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")
import torch, transformers
transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
torch.set_num_threads(os.cpu_count() or 1)
backend, model_name, engine, opset = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
dynamic = "dynamic" in model_name
if model_name.startswith("MiniLM"):
    from hf_exporters.pipeline import build_inputs, default_model_path, load_checkpoint
    model, tokenizer, _ = load_checkpoint(default_model_path())
    inputs = build_inputs(model, tokenizer)
else:
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 256, (2, 7))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
shapes = {k: {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO} for k in inputs} if dynamic else None

def run():
    if engine == "ours":
        from hf_exporters import DynamoConfig, DynamoExporter, ExecutorchConfig, ExecutorchExporter, OnnxConfig, OnnxExporter
        if backend == "dynamo":
            return DynamoExporter().export(model, inputs, DynamoConfig(dynamic=dynamic))
        if backend == "onnx":
            return OnnxExporter().export(model, inputs, OnnxConfig(dynamic=dynamic, opset_version=opset))
        return ExecutorchExporter().export(model, inputs, ExecutorchConfig(dynamic=dynamic, backend="xnnpack"))
    if engine == "bare":
        if backend == "onnx":
            return torch.onnx.export(model, (), kwargs=copy.deepcopy(inputs), dynamic_shapes=shapes, dynamo=True, opset_version=opset)
        program = torch.export.export(model, (), copy.deepcopy(inputs), dynamic_shapes=shapes)
        if backend == "dynamo":
            return program
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower
        return to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    from transformers import exporters as upstream
    if backend == "dynamo":
        return upstream.DynamoExporter().export(model, dict(inputs), upstream.DynamoConfig(dynamic=dynamic))
    if backend == "onnx":
        return upstream.OnnxExporter().export(model, dict(inputs), upstream.OnnxConfig(dynamic=dynamic, opset_version=opset))
    return upstream.ExecutorchExporter().export(model, dict(inputs), upstream.ExecutorchConfig(dynamic=dynamic))

try:
    run()  # warm-up: imports and first-call caches
    start = time.perf_counter()
    run()
    print(json.dumps({"seconds": time.perf_counter() - start, "error": None}))
except Exception as error:
    print(json.dumps({"seconds": None, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default="dynamo,onnx,executorch")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--opset", type=int, default=23)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "export_time.json")
    args = parser.parse_args()
    samples: dict[tuple[str, str, str], list[dict]] = {}
    loads = []
    for _ in range(args.rounds):
        for backend in args.backends.split(","):
            for model in args.models.split(","):
                for engine in ENGINES:
                    loads.append(os.getloadavg()[0])
                    done = subprocess.run(
                        [sys.executable, "-c", CHILD, backend, model, engine, str(args.opset)], capture_output=True, text=True
                    )
                    lines = done.stdout.strip().splitlines()
                    sample = json.loads(lines[-1]) if done.returncode == 0 and lines else {"seconds": None, "error": (done.stderr.strip().splitlines() or ["crashed"])[-1][:160]}
                    samples.setdefault((backend, model, engine), []).append(sample)
                    print(backend, model, engine, sample, flush=True)
    rows = []
    for (backend, model, engine), runs in samples.items():
        times = [r["seconds"] for r in runs if r["seconds"] is not None]
        errors = sorted({r["error"] for r in runs if r["error"]})
        rows.append(
            {
                "backend": backend,
                "model": model,
                "engine": engine,
                "seconds": statistics.median(times) if times else None,
                "min": min(times) if times else None,
                "max": max(times) if times else None,
                "runs": len(times),
                "errors": errors,
            }
        )
    ours = {(r["backend"], r["model"]): r["seconds"] for r in rows if r["engine"] == "ours"}
    for r in rows:
        mine = ours.get((r["backend"], r["model"]))
        r["ratio_to_ours"] = r["seconds"] / mine if r["seconds"] and mine else None
    write_results(args.out, rows, loads, rounds=args.rounds, opset=args.opset)
    print(f"\nload average {min(loads):.1f} to {max(loads):.1f}; median of {args.rounds} fresh-process samples\n")
    print("| backend | model | engine | median export s | min-max | ratio to ours |\n|---|---|---|---|---|---|")
    for r in rows:
        secs = f"{r['seconds']:.2f}" if r["seconds"] is not None else f"failed ({'; '.join(r['errors'])})"
        spread = f"{r['min']:.2f}-{r['max']:.2f}" if r["seconds"] is not None else "-"
        ratio = f"{r['ratio_to_ours']:.2f}" if r["ratio_to_ours"] is not None else "-"
        print(f"| {r['backend']} | {r['model']} | {r['engine']} | {secs} | {spread} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
