"""Tokens per second of ExportedGenerator on each backend vs eager ``generate()`` on CPU, with peak memory.

Models: a tiny Llama and a ~100M-parameter Llama config (random weights; no hub access). For each
backend the generation parts are exported, written to a folder, loaded with
``ExportedGenerator.from_pretrained`` and timed on the same greedy request as eager ``generate()``.
Each measurement runs in a fresh subprocess so peak resident memory (``ru_maxrss``) is its own.

Usage::

    python benchmarks/generation_speed.py [--models tiny,100m] [--backends dynamo,onnx,executorch]
        [--new-tokens 32] [--prompt-len 16] [--json out.json]

Output: one row per (model, backend): tokens/s, ratio to eager tokens/s, peak RSS (MiB) and ratio to
eager's peak RSS, and whether the ids equal eager's.
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

CONFIGS = {
    "tiny": dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    # ~100M parameters: 32000 x 640 embeddings (20.5M) x2 untied + 8 layers of ~7.4M
    "100m": dict(vocab_size=32000, hidden_size=640, intermediate_size=1792, num_hidden_layers=8, num_attention_heads=10, num_key_value_heads=5),
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

    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    inputs = _inputs(model_name, prompt_len)
    if backend == "eager":
        model = _model(model_name)
        run = lambda: model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)  # noqa: E731
    else:
        from hf_exporters.generation import ExportedGenerator

        generator = ExportedGenerator.from_pretrained(folder, load_preprocessor=False)
        run = lambda: generator.generate(**inputs, max_new_tokens=new_tokens)  # noqa: E731
    with torch.no_grad():
        run()  # warm-up (first-call allocation, ORT session warm-up)
        started = time.perf_counter()
        ids = run()
        seconds = time.perf_counter() - started
    return {"tokens_per_s": new_tokens / seconds, "peak_rss_mib": _peak_mib(), "ids": ids.tolist()}


def export(model_name: str, backend: str, folder: str, prompt_len: int) -> float:
    """Export the model's generation parts with ``backend`` into ``folder``; returns seconds."""
    from hf_exporters.generation import export_for_generation
    from hf_exporters.pipeline import make_config, make_exporter

    model = _model(model_name)
    exporter = make_exporter(backend)
    started = time.perf_counter()
    artifacts = export_for_generation(exporter, model, _inputs(model_name, prompt_len), make_config(exporter, True, None))
    artifacts.save_pretrained(folder, validate=False)
    return time.perf_counter() - started


def _subprocess(*args: str) -> dict:
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
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, model_name, backend, folder, extra = args.worker
        if kind == "export":
            print(json.dumps({"export_s": export(model_name, backend, folder, int(extra))}))
        else:
            new_tokens, prompt_len = map(int, extra.split(":"))
            print(json.dumps(worker(model_name, backend, folder, new_tokens, prompt_len)))
        return

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_name in args.models.split(","):
            timing = f"{args.new_tokens}:{args.prompt_len}"
            eager = _subprocess("run", model_name, "eager", "-", timing)
            rows.append({"model": model_name, "backend": "eager", **eager, "speed_ratio": 1.0, "memory_ratio": 1.0, "ids_equal": True})
            for backend in args.backends.split(","):
                folder = os.path.join(tmp, f"{model_name}-{backend}")
                exported = _subprocess("export", model_name, backend, folder, str(args.prompt_len))
                if "error" in exported:
                    rows.append({"model": model_name, "backend": backend, "error": exported["error"]})
                    continue
                result = _subprocess("run", model_name, backend, folder, timing)
                if "error" not in result and "error" not in eager:
                    result["speed_ratio"] = result["tokens_per_s"] / eager["tokens_per_s"]
                    result["memory_ratio"] = result["peak_rss_mib"] / eager["peak_rss_mib"]
                    result["ids_equal"] = result["ids"] == eager["ids"]
                rows.append({"model": model_name, "backend": backend, **exported, **result})
    print(f"{'model':6} {'backend':11} {'tok/s':>9} {'x eager':>8} {'peak MiB':>9} {'x eager':>8} {'ids==eager':>10}")
    for row in rows:
        if "error" in row:
            print(f"{row['model']:6} {row['backend']:11} error: {row['error']}")
            continue
        print(
            f"{row['model']:6} {row['backend']:11} {row['tokens_per_s']:9.1f} {row['speed_ratio']:8.2f} "
            f"{row['peak_rss_mib']:9.0f} {row['memory_ratio']:8.2f} {str(row['ids_equal']):>10}"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([{k: v for k, v in r.items() if k != "ids"} for r in rows], handle, indent=2)


if __name__ == "__main__":
    main()
