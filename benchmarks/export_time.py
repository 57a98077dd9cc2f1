"""Export time: hf-exporters against a bare call and against the exporters shipped in transformers.

For each model and each backend, in one process and one run:

* dynamo: our ``DynamoExporter``, a bare ``torch.export.export`` call (no patches, no pytree
  registration; may fail where ours passes), and ``transformers.exporters.DynamoExporter``;
* onnx: our ``OnnxExporter`` and ``transformers.exporters.OnnxExporter``;
* executorch: our ``ExecutorchExporter`` (xnnpack) and ``transformers.exporters.ExecutorchExporter``.

Each export runs ``--repeat`` times after one warm-up (the warm-up pays imports and first-call
caches); the median is reported, with ratios against ours. Writes ``benchmarks/results/export_time.json``
and prints a Markdown table for ``benchmarks/README.md``.

Usage: ``python benchmarks/export_time.py [--backends dynamo,onnx,executorch] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

from hf_exporters import DynamoConfig, DynamoExporter, ExecutorchConfig, OnnxConfig  # noqa: E402
from hf_exporters.pipeline import build_inputs, default_model_path, load_checkpoint  # noqa: E402


def models() -> dict[str, tuple[torch.nn.Module, dict[str, Any], bool]]:
    minilm, tokenizer, _ = load_checkpoint(default_model_path())
    minilm_inputs = build_inputs(minilm, tokenizer)
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 256, (2, 7))
    prefill = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return {
        "MiniLM static": (minilm, minilm_inputs, False),
        "MiniLM dynamic": (minilm, minilm_inputs, True),
        "tiny Llama prefill dynamic": (llama, prefill, True),
    }


def engines(backend: str) -> dict[str, Callable[[torch.nn.Module, dict[str, Any], bool], Any]]:
    from transformers import exporters as upstream

    if backend == "dynamo":
        return {
            "ours": lambda m, x, d: DynamoExporter().export(m, x, DynamoConfig(dynamic=d)),
            "bare torch.export": lambda m, x, d: torch.export.export(
                m, (), copy.deepcopy(x), dynamic_shapes=({k: {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO} for k in x} if d else None)
            ),
            "transformers.exporters": lambda m, x, d: upstream.DynamoExporter().export(m, dict(x), upstream.DynamoConfig(dynamic=d)),
        }
    if backend == "onnx":
        from hf_exporters import OnnxExporter

        return {
            "ours": lambda m, x, d: OnnxExporter().export(m, x, OnnxConfig(dynamic=d)),
            "transformers.exporters": lambda m, x, d: upstream.OnnxExporter().export(m, dict(x), upstream.OnnxConfig(dynamic=d)),
        }
    if backend == "executorch":
        from hf_exporters import ExecutorchExporter

        return {
            "ours": lambda m, x, d: ExecutorchExporter().export(m, x, ExecutorchConfig(dynamic=d, backend="xnnpack")),
            "transformers.exporters": lambda m, x, d: upstream.ExecutorchExporter().export(
                m, dict(x), upstream.ExecutorchConfig(dynamic=d)
            ),
        }
    raise SystemExit(f"unknown backend {backend!r}")


def time_one(fn: Callable[[], Any], repeat: int) -> tuple[float | None, str | None]:
    try:
        fn()  # warm-up
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples), None
    except Exception as error:  # noqa: BLE001 - a failing engine is a result too
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default="dynamo,onnx,executorch")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "export_time.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = []
    for backend in args.backends.split(","):
        for model_name, (model, inputs, dynamic) in models().items():
            results = {}
            for engine, export in engines(backend).items():
                seconds, error = time_one(lambda: export(model, inputs, dynamic), args.repeat)
                results[engine] = {"seconds": seconds, "error": error}
            ours = results["ours"]["seconds"]
            for engine, result in results.items():
                ratio = result["seconds"] / ours if ours and result["seconds"] else None
                rows.append({"backend": backend, "model": model_name, "engine": engine, **result, "ratio_to_ours": ratio})
                print(json.dumps(rows[-1]), flush=True)
    meta = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "repeat": args.repeat,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print("\n| backend | model | engine | median export s | ratio to ours |\n|---|---|---|---|---|")
    for r in rows:
        secs = f"{r['seconds']:.2f}" if r["seconds"] is not None else f"failed ({r['error']})"
        ratio = f"{r['ratio_to_ours']:.2f}" if r["ratio_to_ours"] is not None else "-"
        print(f"| {r['backend']} | {r['model']} | {r['engine']} | {secs} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
