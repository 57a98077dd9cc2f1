"""Tokens per second of ExportedGenerator on each backend vs eager ``generate()`` on CPU, with peak memory.

Models: a tiny Llama and a ~100M-parameter Llama config (random weights; no hub access). For each
backend the generation parts are exported, written to a folder, loaded with
``ExportedGenerator.from_pretrained`` and timed on the same greedy request as eager ``generate()``.
Each measurement runs in a fresh subprocess so peak resident memory (``ru_maxrss``) is its own.

Usage::

    python benchmarks/generation_speed.py [--models tiny,100m] [--backends dynamo,onnx,executorch]
        [--new-tokens 32] [--prompt-len 16] [--rounds 3] [--json out.json]

Every engine runs on all cores (eager PyTorch with ``torch.set_num_threads(os.cpu_count())``; onnxruntime's
CPU provider and ExecuTorch's XNNPACK thread pool use one thread per core by default). ``--rounds``
interleaved rounds run every engine once each, in a fresh process.

``--backends`` may also name quantized variants: ``executorch-8da4w`` / ``executorch-8da8w`` (torchao linears,
``--qembedding 8w`` embeddings, XNNPACK kernels) and ``onnx-int8`` (onnxruntime's dynamic int8). Their folders
are written without the next-token accuracy check: the weights are random, so the check measures
nothing a real checkpoint would show (``8da4w`` of a random model is refused by it).

``executorch-program`` and ``executorch-8da4w-program`` hold the key/value cache in the program (``--kv-cache
program``: one method driven by position, no cache tensor in or out of a step) instead of passing it through
every step, written and attended with ExecuTorch's LLM operators (``llama::update_cache``,
``llama::custom_sdpa``); ``executorch-program-torch-sdpa`` and ``executorch-8da4w-program-torch-sdpa`` are the
same with ``--no-custom-sdpa`` (torch's attention over the whole static cache).

``--backends`` may also name ``optimum``: optimum-onnx's export of the same weights
(``main_export(task="text-generation-with-past")`` of the checkpoint written with ``save_pretrained``) run by
its ``ORTModelForCausalLM.generate``, both in ``benchmarks/.venv-optimum`` (``setup_optimum_env.sh``; optimum-onnx
needs transformers < 4.58), on all cores as onnxruntime's default.

Output: one row per (model, backend): median tokens/s with its spread over the rounds, ratio to eager
tokens/s, the prompt's forward (``prefill_ms``: a request for one new token, median of 5) and each decode step
(``decode_ms_per_token``: the whole request less that, over the steps after the first token), medians over
the rounds, peak RSS (MiB) and ratio to eager's peak RSS, the folder's size on disk (MiB: optimum's without
the checkpoint copy it was exported from) and whether the
ids equal eager's (a quantized folder's need not); the results file holds the exact command, the
parameter counts and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import command_line  # noqa: E402

OPTIMUM_PYTHON = os.environ.get("OPTIMUM_PYTHON", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".venv-optimum", "bin", "python"))

CONFIGS = {
    "tiny": dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    # ~100M parameters (99.5M): 32000 x 768 embeddings (24.6M) x2 untied + 8 layers of 6.3M (attention 1.6M, MLP 4.7M)
    "100m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4),
}


def _model(name: str):
    import torch
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(**CONFIGS[name], eos_token_id=None, max_position_embeddings=512)
    return tf.LlamaForCausalLM(config).eval()


def _inputs(name: str, prompt_len: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, CONFIGS[name]["vocab_size"], (1, prompt_len), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(model_name: str, backend: str, folder: str, new_tokens: int, prompt_len: int) -> dict:
    """One measurement in this process: ``backend == "eager"`` times ``model.generate``; otherwise
    the folder (already exported) is loaded and timed. Returns a JSON-able dict."""
    import torch

    # every engine on all cores: onnxruntime's CPU provider and ExecuTorch's XNNPACK thread pool default to
    # one thread per core, eager PyTorch is given the same
    torch.set_num_threads(os.cpu_count() or 1)
    inputs = _inputs(model_name, prompt_len)
    if backend == "eager":
        model = _model(model_name)
        run = lambda n: model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)  # noqa: E731
    elif backend == "optimum":  # in the optimum environment
        from optimum.onnxruntime import ORTModelForCausalLM

        model = ORTModelForCausalLM.from_pretrained(folder)
        run = lambda n: model.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)  # noqa: E731
    else:
        from hf_exporters.generation import ExportedGenerator

        generator = ExportedGenerator.from_pretrained(folder, load_preprocessor=False)
        run = lambda n: generator.generate(**inputs, max_new_tokens=n)  # noqa: E731
    with torch.no_grad():
        run(new_tokens)  # warm-up (first-call allocation, ORT session warm-up)
        prefills = []
        for _ in range(5):  # the prompt's forward and the first token alone: the median of 5
            started = time.perf_counter()
            run(1)
            prefills.append(time.perf_counter() - started)
        prefill = sorted(prefills)[2]
        started = time.perf_counter()
        ids = run(new_tokens)
        seconds = time.perf_counter() - started
    return {
        "tokens_per_s": new_tokens / seconds,
        "prefill_ms": prefill * 1e3,
        # each decode step: the whole request less the prompt's forward, over the steps after the first token
        "decode_ms_per_token": (seconds - prefill) * 1e3 / max(new_tokens - 1, 1),
        "peak_rss_mib": _peak_mib(),
        "ids": ids.tolist(),
        "torch_threads": torch.get_num_threads(),
    }


def export(model_name: str, backend: str, folder: str, prompt_len: int) -> float:
    """Export the model's generation parts with ``backend`` into ``folder``; returns seconds."""
    from hf_exporters.generation import export_for_generation
    from hf_exporters.pipeline import make_config, make_exporter

    model = _model(model_name)
    if backend == "optimum":
        checkpoint = os.path.join(folder, "checkpoint")
        model.save_pretrained(checkpoint)
        started = time.perf_counter()
        code = "import sys; from optimum.exporters.onnx import main_export; main_export(sys.argv[1], output=sys.argv[2], task='text-generation-with-past', device='cpu')"
        done = subprocess.run([OPTIMUM_PYTHON, "-c", code, checkpoint, folder], capture_output=True, text=True, check=False, env=_optimum_env())
        if done.returncode != 0:
            raise RuntimeError("optimum main_export failed: " + (done.stderr.strip().splitlines() or ["?"])[-1])
        return time.perf_counter() - started
    base, quantize, embeddings, kv_cache, custom_sdpa = (*VARIANTS.get(backend, (backend, None, None)), "io", True)[:5]
    exporter = make_exporter(base)
    started = time.perf_counter()
    config = make_config(exporter, True, None, quantize=quantize, quantize_embeddings=embeddings)
    artifacts = export_for_generation(exporter, model, _inputs(model_name, prompt_len), config, kv_cache=kv_cache, custom_sdpa=custom_sdpa)
    artifacts.save_pretrained(folder, validate=False)
    return time.perf_counter() - started


#: variants ``--backends`` may name: (backend, --quantize, --qembedding[, --kv-cache[, --custom-sdpa]])
VARIANTS = {
    "executorch-program": ("executorch", None, None, "program"),
    "executorch-8da4w-program": ("executorch", "8da4w", "8w", "program"),
    "executorch-program-torch-sdpa": ("executorch", None, None, "program", False),
    "executorch-8da4w-program-torch-sdpa": ("executorch", "8da4w", "8w", "program", False),
    "executorch-8da4w": ("executorch", "8da4w", "8w"),
    "executorch-8da8w": ("executorch", "8da8w", "8w"),
    "onnx-int8": ("onnx", "int8-dynamic", None),
}


def _folder_mib(folder: str) -> float:
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(folder) for f in files) / 2**20


def _optimum_env() -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    return env


def _subprocess(*args: str) -> dict:
    if args[0] == "run" and args[2] == "optimum":
        if not os.path.exists(OPTIMUM_PYTHON):
            return {"error": f"optimum environment not found ({OPTIMUM_PYTHON}); create it with: bash benchmarks/setup_optimum_env.sh"}
        out = subprocess.run([OPTIMUM_PYTHON, __file__, "--worker", *args], capture_output=True, text=True, check=False, env=_optimum_env())
    else:
        out = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,100m")
    parser.add_argument("--backends", default="dynamo,onnx,executorch")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds: every engine once per round, each in a fresh process")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, model_name, backend, folder, extra = args.worker
        if kind == "export":
            seconds = export(model_name, backend, folder, int(extra))
            # optimum's folder holds the checkpoint it was exported from: not part of the artifact
            print(json.dumps({"export_s": seconds, "folder_mib": _folder_mib(folder) - _folder_mib(os.path.join(folder, "checkpoint"))}))
        else:
            new_tokens, prompt_len = map(int, extra.split(":"))
            print(json.dumps(worker(model_name, backend, folder, new_tokens, prompt_len)))
        return

    import statistics

    rows = []
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_name in args.models.split(","):
            timing = f"{args.new_tokens}:{args.prompt_len}"
            engines = ["eager"]
            exported: dict[str, dict] = {}
            for backend in args.backends.split(","):
                folder = os.path.join(tmp, f"{model_name}-{backend}")
                exported[backend] = _subprocess("export", model_name, backend, folder, str(args.prompt_len))
                if "error" not in exported[backend]:
                    engines.append(backend)
            samples: dict[str, list[dict]] = {engine: [] for engine in engines}
            for _ in range(args.rounds):
                for engine in engines:
                    loads.append(os.getloadavg()[0])
                    folder = "-" if engine == "eager" else os.path.join(tmp, f"{model_name}-{engine}")
                    samples[engine].append(_subprocess("run", model_name, engine, folder, timing))
            summary = {}
            for engine, runs in samples.items():
                ok = [r for r in runs if "error" not in r]
                if not ok:
                    summary[engine] = {"error": runs[0]["error"]}
                    continue
                speeds = [r["tokens_per_s"] for r in ok]
                summary[engine] = {
                    "tokens_per_s": statistics.median(speeds),
                    "tokens_per_s_min": min(speeds),
                    "tokens_per_s_max": max(speeds),
                    "prefill_ms": statistics.median(r["prefill_ms"] for r in ok),
                    "decode_ms_per_token": statistics.median(r["decode_ms_per_token"] for r in ok),
                    "decode_ms_per_token_min": min(r["decode_ms_per_token"] for r in ok),
                    "decode_ms_per_token_max": max(r["decode_ms_per_token"] for r in ok),
                    "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in ok),
                    "torch_threads": ok[0]["torch_threads"],
                    "runs": len(ok),
                    "ids": ok[0]["ids"],
                }
            eager = summary["eager"]
            for engine in ["eager", *args.backends.split(",")]:
                if engine != "eager" and engine not in summary:
                    rows.append({"model": model_name, "backend": engine, "error": exported[engine]["error"]})
                    continue
                result = dict(summary[engine])
                if "error" not in result and "error" not in eager:
                    result["speed_ratio"] = result["tokens_per_s"] / eager["tokens_per_s"]
                    result["memory_ratio"] = result["peak_rss_mib"] / eager["peak_rss_mib"]
                    result["ids_equal"] = result["ids"] == eager["ids"]
                rows.append({"model": model_name, "backend": engine, **exported.get(engine, {}), **result})
    print(f"rounds {args.rounds}, load average {min(loads):.1f} to {max(loads):.1f}")
    print(f"{'model':6} {'backend':17} {'tok/s':>9} {'min-max':>15} {'x eager':>8} {'prefill ms':>10} {'ms/step':>8} {'peak MiB':>9} {'x eager':>8} {'disk MiB':>9} {'ids==eager':>10}")
    for row in rows:
        if "error" in row:
            print(f"{row['model']:6} {row['backend']:17} error: {row['error']}")
            continue
        spread = f"{row['tokens_per_s_min']:.1f}-{row['tokens_per_s_max']:.1f}"
        print(
            f"{row['model']:6} {row['backend']:17} {row['tokens_per_s']:9.1f} {spread:>15} {row['speed_ratio']:8.2f} "
            f"{row['prefill_ms']:10.1f} {row['decode_ms_per_token']:8.2f} "
            f"{row['peak_rss_mib']:9.0f} {row['memory_ratio']:8.2f} {row.get('folder_mib', 0.0):9.1f} {str(row['ids_equal']):>10}"
        )
    if args.json:
        meta = {
            "command": command_line(),
            "rounds": args.rounds,
            "cpus": os.cpu_count(),
            "load_average_1min": {"min": min(loads), "max": max(loads)},
            "parameters": {name: _parameters(name) for name in args.models.split(",")},
            "date": time.strftime("%Y-%m-%d"),
        }
        with open(args.json, "w") as handle:
            json.dump({"meta": meta, "rows": [{k: v for k, v in r.items() if k != "ids"} for r in rows]}, handle, indent=2)


def _parameters(name: str) -> int:
    return sum(p.numel() for p in _model(name).parameters())


if __name__ == "__main__":
    main()
