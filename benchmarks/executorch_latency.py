"""Latency of XNNPACK ``.pte`` programs in executorch.runtime against eager PyTorch float32 on CPU, in one run.

Exports the embedded all-MiniLM-L6-v2 with ``ExecutorchExporter`` (XNNPACK) in each ``--variants`` entry:
``dynamic`` (one program for every batch and length), ``static`` (one program per batch at ``--seq``
tokens), ``static-8da8w`` and ``static-8da4w`` (its linear layers quantized, ``ExecutorchConfig.quantize``)
and ``static-fp16`` (the model cast to float16). Loads each ``.pte`` with ``executorch.runtime`` and times
``forward`` against eager PyTorch on the same inputs (real sentences padded or cut to ``--seq`` tokens),
for each batch size: median and p90 of ``--runs`` runs after ``--warmup`` warm-ups, every engine
interleaved in rotating order each round so that machine load hits all alike. Also reports each export's
time, partition count and file size, and each program's largest difference from float32 eager on the
timed inputs (quantized and float16 programs differ by design).

Writes ``benchmarks/results/executorch_latency.json`` and prints a Markdown table.

Usage: ``python benchmarks/executorch_latency.py [--batches 1,8] [--seq 128] [--runs 30] [--variants dynamic,static,static-8da8w]``
"""

from __future__ import annotations

import argparse
import copy
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


def _export(exporter, model, example, variant: str, folder: Path) -> tuple[object, dict[str, object]]:
    """The runner of ``variant``'s ``.pte`` written under ``folder``, and what its export took."""
    config = ExecutorchConfig(backend="xnnpack", dynamic=variant == "dynamic")
    if variant.endswith(("8da8w", "8da4w")):
        config.quantize = variant.rsplit("-", 1)[1]
    if variant.endswith("fp16"):
        model = copy.deepcopy(model).half()
        example = {k: v for k, v in example.items()}
    started = time.perf_counter()
    result = exporter.run(model, example, config)
    seconds = time.perf_counter() - started
    path = exporter.save(result.program, folder / variant)
    return exporter.load_runner(path), {
        "export_seconds": round(seconds, 2), "partitions": result.partitions["forward"], "size_mb": round(path.stat().st_size / 1e6, 2)
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variants", default="dynamic,static,static-8da8w")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "executorch_latency.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tokenizer, _ = load_checkpoint(default_model_path())
    batches = [int(b) for b in args.batches.split(",")]
    variants = args.variants.split(",")

    exporter = ExecutorchExporter()
    rows, exports = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        runners = {}
        if "dynamic" in variants:
            runners["dynamic"], exports["dynamic"] = _export(exporter, model, inputs_for(tokenizer, 2, args.seq), "dynamic", Path(tmp))
        for batch in batches:
            inputs = inputs_for(tokenizer, batch, args.seq)
            for variant in variants:
                if variant != "dynamic":
                    runners[variant], exports[f"{variant} batch {batch}"] = _export(
                        exporter, model, inputs, variant, Path(tmp) / f"b{batch}"
                    )
            expected = eager_outputs(model, inputs)
            engines = {"eager PyTorch": lambda inputs=inputs: model(**inputs)}
            diffs = {}
            for variant in variants:
                runner = runners[variant]
                fed = {k: (v.half() if variant.endswith("fp16") and v.is_floating_point() else v) for k, v in inputs.items()}
                diffs[variant] = max(d.max_abs_diff for d in compare_leaves(expected, runner(fed), atol=1e-3))
                engines[f"executorch {variant}"] = lambda runner=runner, fed=fed: runner(fed)
            samples = interleaved_ms(engines, args.runs, args.warmup)
            eager = statistics.median(samples["eager PyTorch"])
            for name, values in samples.items():
                median = statistics.median(values)
                variant = name.removeprefix("executorch ")
                rows.append(
                    {
                        "batch": batch,
                        "seq": args.seq,
                        "engine": name,
                        "median_ms": round(median, 2),
                        "p90_ms": round(percentile(values, 0.9), 2),
                        "min_ms": round(min(values), 2),
                        "ratio_to_eager": round(median / eager, 3),
                        "max_abs_diff_vs_eager": diffs.get(variant),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)

    result = {
        "meta": {
            "command": "python benchmarks/executorch_latency.py " + " ".join(sys.argv[1:]),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "executorch": __import__("importlib.metadata").metadata.version("executorch"),
            "runs": args.runs,
            "warmup": args.warmup,
            "exports": exports,
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("\n| batch | engine | median ms | p90 ms | ratio to eager |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['engine']} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} | {r['ratio_to_eager']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
