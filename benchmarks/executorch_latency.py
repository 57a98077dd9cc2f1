"""Latency of the XNNPACK ``.pte`` in executorch.runtime against eager PyTorch on CPU, in one run.

Exports the embedded all-MiniLM-L6-v2 with ``ExecutorchExporter`` (XNNPACK, dynamic shapes), loads the
``.pte`` with ``executorch.runtime``, and times ``forward`` against eager PyTorch on the same inputs
(real sentences padded or cut to ``--seq`` tokens), for each batch size: median and p90 of ``--runs``
runs after ``--warmup`` warm-ups, the two engines interleaved in alternating order each round so that
machine load hits both alike. Also reports the export time and checks parity on the timed inputs.

Writes ``benchmarks/results/executorch_latency.json`` and prints a Markdown table.

Usage: ``python benchmarks/executorch_latency.py [--batches 1,8] [--seq 128] [--runs 30]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved_ms  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.set_verbosity_error()

from hf_exporters import ExecutorchConfig, ExecutorchExporter  # noqa: E402
from hf_exporters.pipeline import SAMPLE_TEXTS, default_model_path, load_checkpoint  # noqa: E402
from hf_exporters.runtime import compare_leaves, eager_outputs  # noqa: E402

SENTENCES = SAMPLE_TEXTS + [
    "The quick brown fox jumps over the lazy dog.",
    "Latency is measured as the median of many runs.",
    "ExecuTorch runs the program with the XNNPACK delegate.",
    "Sentence embeddings place similar meanings close together.",
    "Two cores are shared by every process on this machine.",
    "A padded batch has the same length in every row.",
]


def inputs_for(tokenizer, batch: int, seq: int) -> dict[str, torch.Tensor]:
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
    return dict(tokenizer(texts, padding="max_length", truncation=True, max_length=seq, return_tensors="pt"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "executorch_latency.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tokenizer, _ = load_checkpoint(default_model_path())
    batches = [int(b) for b in args.batches.split(",")]

    exporter = ExecutorchExporter()
    example = inputs_for(tokenizer, 2, args.seq)
    started = time.perf_counter()
    manager = exporter.export(model, example, ExecutorchConfig(backend="xnnpack", dynamic=True))
    export_seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as folder:
        runner = exporter.load_runner(exporter.save(manager, folder))

    rows = []
    for batch in batches:
        inputs = inputs_for(tokenizer, batch, args.seq)
        diff = max(d.max_abs_diff for d in compare_leaves(eager_outputs(model, inputs), runner(inputs), atol=1e-3))
        engines = {"executorch (xnnpack)": lambda: runner(inputs), "eager PyTorch": lambda: model(**inputs)}
        samples = interleaved_ms(engines, args.runs, args.warmup)
        ours = statistics.median(samples["executorch (xnnpack)"])
        for name, values in samples.items():
            median = statistics.median(values)
            rows.append(
                {
                    "batch": batch,
                    "seq": args.seq,
                    "engine": name,
                    "median_ms": round(median, 2),
                    "p90_ms": round(percentile(values, 0.9), 2),
                    "min_ms": round(min(values), 2),
                    "ratio_to_executorch": round(median / ours, 3),
                    "max_abs_diff_vs_eager": diff if name.startswith("executorch") else None,
                }
            )
            print(json.dumps(rows[-1]), flush=True)

    result = {
        "meta": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "executorch": __import__("importlib.metadata").metadata.version("executorch"),
            "runs": args.runs,
            "warmup": args.warmup,
            "export_seconds": round(export_seconds, 2),
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| batch | engine | median ms | p90 ms | ratio to .pte |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['engine']} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} | {r['ratio_to_executorch']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
