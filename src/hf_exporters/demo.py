"""``make demo``: the main job on real input.

Exports the embedded all-MiniLM-L6-v2 (real weights, tokenizer and sentences) and a tiny
LlamaForCausalLM (a small config saved with ``save_pretrained`` and loaded back) at a prefill step
and at a decode step with a filled DynamicCache, through every backend, each with dynamic shapes and
checked against eager PyTorch in the backend's runtime on two input sizes. Then, per backend, it runs
``hf-exporters export --task text-generation`` on the tiny Llama checkpoint (with a word-level
tokenizer) and ``hf-exporters generate DIR --prompt ... --max-new-tokens 8 --compare-eager`` on the
folder written, which generates from the folder alone and compares the ids with eager ``generate()``. Last, the C++ runner ``hfx-run`` (``make
cpp``) runs the tiny Llama's ExecuTorch prefill folder against eager outputs and generates from its
ExecuTorch text-generation folder.
Prints a table and writes ``reports/demo.json``: a list of rows ``{model, backend, status,
max_abs_diff, export_seconds}`` (generation rows: ``{model, backend, status, same_ids_as_eager,
tokens_per_second, export_seconds}``).

Usage: ``python -m hf_exporters.demo [--backends dynamo,onnx,executorch] [--out out/demo]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BACKENDS = ("dynamo", "onnx", "executorch")


def _tiny_llama(folder: Path) -> Any:
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return transformers.AutoModelForCausalLM.from_pretrained(folder).eval()


def write_word_tokenizer(folder: Path, vocab_size: int) -> None:
    """Save a word-level fast tokenizer (letters and ``w<i>`` words) to ``folder``: no hub access needed."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{chr(ord("a") + i): 3 + i for i in range(26)}}
    vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)


def _cli(*args: str) -> tuple[int, str]:
    """Run ``hf-exporters ARGS`` in a fresh process; return its exit status and output."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "hf_exporters.cli", *args], capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr


def run_generation(backends: list[str], checkpoint: Path, out: Path, prompt: str = "a b c d e f", runtime: str = "python") -> list[dict[str, Any]]:
    """Export ``checkpoint`` with ``--task text-generation`` per backend and generate from each folder
    with ``--compare-eager`` (``--runtime cpp``: the ExecuTorch folder through the C++ runner's
    bindings); one row per backend."""
    import re

    rows = []
    for backend in backends:
        folder = out / f"tiny-llama-generation-{backend}"
        row: dict[str, Any] = {"model": "tiny-llama text-generation", "backend": backend, "max_abs_diff": None}
        started = time.perf_counter()
        code, text = _cli("export", "--model", str(checkpoint), "--backend", backend, "--task", "text-generation", "--output", str(folder), "--overwrite")
        row["export_seconds"] = round(time.perf_counter() - started, 3)
        if code == 0:
            runtime_args = ["--runtime", runtime] if backend == "executorch" else []
            code, text = _cli("generate", str(folder), "--prompt", prompt, "--max-new-tokens", "8", "--compare-eager", *runtime_args)
        speed = re.search(r"([0-9.]+) tokens/s", text)
        same = "equal to eager generate(): yes" in text
        row.update(
            status="ok" if code == 0 and same else "failed",
            same_ids_as_eager=same,
            tokens_per_second=float(speed.group(1)) if speed else None,
            folder=str(folder),
        )
        if row["status"] != "ok":
            row["error"] = next((line for line in reversed(text.splitlines()) if line.strip()), f"exit status {code}")
        rows.append(row)
        print(_format_row(row), flush=True)
    return rows


def run_cpp(llama: Any, prefill: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    """The C++ runner on the tiny Llama's ExecuTorch folders: ``hfx-run`` forward parity on the prefill
    export (eager outputs as ``--expect``) and greedy generation from the text-generation folder,
    compared with eager ``generate()``."""
    import re
    import subprocess

    import torch
    from safetensors.torch import save_file

    from .runtime.compare import eager_outputs
    from .runtime.cpp_runner import hfx_run
    from .errors import HfExportersError

    rows: list[dict[str, Any]] = []
    try:
        binary = str(hfx_run())
    except HfExportersError as error:
        return [{"model": "tiny-llama hfx-run", "backend": "executorch", "status": "failed", "max_abs_diff": None, "export_seconds": 0.0, "error": str(error)}]
    folder = out / "tiny-llama-prefill-executorch"
    manifest = json.loads((folder / "export.json").read_text())
    save_file({spec["name"]: t.contiguous() for spec, t in zip(manifest["inputs"], prefill.values())}, out / "hfx-inputs.safetensors")
    names = [o["name"] for o in manifest["outputs"]]
    save_file({n: t.contiguous() for n, (_, t) in zip(names, eager_outputs(llama, prefill))}, out / "hfx-expected.safetensors")
    done = subprocess.run([binary, str(folder), "--inputs", str(out / "hfx-inputs.safetensors"), "--expect", str(out / "hfx-expected.safetensors"),
                           "--atol", "1e-3"], capture_output=True, text=True, check=False)
    diffs = [float(d) for d in re.findall(r"max abs diff (\S+)", done.stdout)]
    row: dict[str, Any] = {"model": "tiny-llama prefill, hfx-run (C++)", "backend": "executorch", "export_seconds": 0.0,
                           "status": "ok" if done.returncode == 0 and diffs else "failed", "max_abs_diff": max(diffs) if diffs else None}
    if row["status"] != "ok":
        row["error"] = (done.stderr or done.stdout).strip().splitlines()[-1] if (done.stderr or done.stdout).strip() else f"exit status {done.returncode}"
    rows.append(row)
    print(_format_row(row), flush=True)

    prompt = [5, 17, 33, 2, 71, 9]
    with torch.no_grad():
        eager = llama.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=8, do_sample=False)
    eos = llama.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    done = subprocess.run([binary, str(out / "tiny-llama-generation-executorch"), "--generate", "--input-ids", ",".join(map(str, prompt)),
                           "--max-new-tokens", "8", *(["--eos-token-id", str(eos)] if eos is not None else [])],
                          capture_output=True, text=True, check=False)
    ids = re.search(r"^ids: (\S+)$", done.stdout, re.M)
    speed = re.search(r"([0-9.]+) tokens/s", done.stdout)
    same = bool(ids) and [int(i) for i in ids.group(1).split(",")] == eager[0].tolist()
    row = {"model": "tiny-llama generation, hfx-run (C++)", "backend": "executorch", "export_seconds": 0.0, "max_abs_diff": None,
           "status": "ok" if done.returncode == 0 and same else "failed", "same_ids_as_eager": same,
           "tokens_per_second": float(speed.group(1)) if speed else None}
    if row["status"] != "ok":
        row["error"] = (done.stderr.strip() or f"ids {ids.group(1) if ids else None} != eager {eager[0].tolist()}")
    rows.append(row)
    print(_format_row(row), flush=True)
    return rows


def _llama_inputs(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (2, 7), generator=generator)
    prefill = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
    with torch.no_grad():
        cache = model(**prefill, use_cache=True).past_key_values
    decode = {
        "input_ids": torch.randint(0, model.config.vocab_size, (2, 1), generator=generator),
        "attention_mask": torch.ones(2, 8, dtype=torch.long),
        "past_key_values": cache,
    }
    return prefill, decode


def run(backends: list[str], out: Path, report: Path, runtime: str = "python") -> list[dict[str, Any]]:
    from .errors import HfExportersError
    from .pipeline import build_inputs, default_model_path, export_to_folder, load_checkpoint

    minilm, tokenizer, task = load_checkpoint(default_model_path())
    minilm_inputs = build_inputs(minilm, tokenizer)
    llama = _tiny_llama(out / "tiny-llama-checkpoint")
    prefill, decode = _llama_inputs(llama)
    jobs = [
        ("all-MiniLM-L6-v2", minilm, minilm_inputs, tokenizer, task),
        ("tiny-llama prefill", llama, prefill, None, "text-generation"),
        ("tiny-llama decode (DynamicCache)", llama, decode, None, "text-generation"),
    ]
    rows = []
    for backend in backends:
        for name, model, inputs, preprocessor, job_task in jobs:
            folder = out / f"{name.split()[0]}-{name.split()[1] if ' ' in name else 'model'}-{backend}"
            started = time.perf_counter()
            row: dict[str, Any] = {"model": name, "backend": backend}
            try:
                manifest = export_to_folder(
                    model, inputs, backend, folder, dynamic=True, preprocessor=preprocessor, task=job_task, overwrite=True
                )
                row.update(
                    status="ok",
                    max_abs_diff=max(p["max_abs_diff"] for p in manifest["parity"]),
                    export_seconds=manifest["export_seconds"],
                    input_sets=len(manifest["parity"]),
                    atol=manifest["atol"],
                    folder=str(folder),
                )
            except HfExportersError as error:
                row.update(
                    status="failed",
                    max_abs_diff=None,
                    export_seconds=round(time.perf_counter() - started, 3),
                    error=str(error).splitlines()[0],
                )
            rows.append(row)
            print(_format_row(row), flush=True)
    checkpoint = out / "tiny-llama-checkpoint"
    write_word_tokenizer(checkpoint, llama.config.vocab_size)
    rows += run_generation(backends, checkpoint, out, runtime=runtime)
    if "executorch" in backends:
        rows += run_cpp(llama, prefill, out)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def _format_row(row: dict[str, Any]) -> str:
    diff = "-" if row["max_abs_diff"] is None else f"{row['max_abs_diff']:.2e}"
    text = f"{row['model']:<34} {row['backend']:<11} {row['status']:<7} {diff:>10} {row['export_seconds']:>8.2f}s"
    if "same_ids_as_eager" in row and row["status"] == "ok":
        text += f"  same ids as eager generate(), {row['tokens_per_second']} tokens/s"
    if row["status"] != "ok":
        text += f"  {row.get('error', '')}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated backends")
    parser.add_argument("--out", default="out/demo", type=Path, help="folder for the exported artifacts")
    parser.add_argument("--report", default="reports/demo.json", type=Path, help="where to write the rows")
    parser.add_argument("--runtime", default="python", choices=("python", "cpp"),
                        help="runtime of the ExecuTorch generation row: executorch.runtime or the C++ runner (hfx-run runs either way)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" notes
    warnings.filterwarnings("ignore")
    print(f"{'model':<34} {'backend':<11} {'status':<7} {'max|diff|':>10} {'export':>9}")
    rows = run([b for b in args.backends.split(",") if b], args.out, args.report, runtime=args.runtime)
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"{ok}/{len(rows)} exports match eager (within tolerance; same token ids for generation); rows written to {args.report}")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
