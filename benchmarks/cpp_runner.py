"""The C++ runner against the Python runtimes and eager PyTorch, in one run (CPU).

Forward latency: ``hfx-run DIR --inputs ... --repeat N`` (the ExecuTorch C++ runtime, program loaded
once, N timed runs after a warm-up) against ``executorch.runtime`` from Python on the same ``.pte``
and against eager PyTorch on the same inputs: MiniLM (batch 1, 128 tokens) and the tiny Llama prefill
(batch 1, 16 tokens).
Generation: tokens per second of ``hfx-run DIR --generate`` (greedy, loop time) against
``ExportedGenerator`` on ``executorch.runtime`` and eager ``generate()``: 32 new tokens from a 16-token
prompt, tiny Llama and a ~100M-parameter Llama config (random weights); each after one untimed
warm-up generation (``hfx-run --warmup``), so the runtime's first-run work is not counted.

Usage: ``python benchmarks/cpp_runner.py [--repeat 50] [--json benchmarks/results/cpp_runner.json]``
(``make cpp`` first). Ratios are ``× eager`` (speed: higher is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers as tf  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import command_line  # noqa: E402
from generation_speed import CONFIGS  # noqa: E402

from hf_exporters.generation import ExportedGenerator, export_generation_folder  # noqa: E402
from hf_exporters.pipeline import default_model_path, export_to_folder, load_checkpoint  # noqa: E402
from hf_exporters.runtime.cpp_runner import hfx_run  # noqa: E402
from hf_exporters.runtime.et_runner import ExecutorchRunner  # noqa: E402


def _mean_seconds(fn, repeat: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat


def forward_rows(root: Path, repeat: int) -> list[dict]:
    from safetensors.torch import save_file

    minilm, tokenizer, task = load_checkpoint(default_model_path())
    text = " ".join(["exported models run the same numbers"] * 40)
    minilm_inputs = dict(tokenizer([text], truncation=True, max_length=128, padding="max_length", return_tensors="pt"))
    minilm_inputs = {k: v for k, v in minilm_inputs.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    llama = _llama("tiny")
    ids = torch.randint(3, CONFIGS["tiny"]["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(0))
    llama_inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    rows = []
    for name, model, inputs in (("MiniLM (1 x 128)", minilm, minilm_inputs), ("tiny Llama prefill (1 x 16)", llama, llama_inputs)):
        folder = root / re.sub(r"\W+", "-", name)
        manifest = export_to_folder(model, inputs, "executorch", folder, dynamic=True, validate=False)
        save_file({s["name"]: t.contiguous() for s, t in zip(manifest["inputs"], inputs.values())}, root / "inputs.safetensors")
        done = subprocess.run([str(hfx_run()), str(folder), "--inputs", str(root / "inputs.safetensors"), "--repeat", str(repeat)],
                              capture_output=True, text=True, check=True)
        cpp = float(re.search(r"latency: ([0-9.]+) ms", done.stdout).group(1)) / 1e3
        runner = ExecutorchRunner(folder / "model.pte")
        python = _mean_seconds(lambda: runner(inputs), repeat)
        with torch.no_grad():
            eager = _mean_seconds(lambda: model(**inputs), repeat)
        rows.append({"model": name, "eager_ms": eager * 1e3, "executorch_python_ms": python * 1e3, "hfx_run_ms": cpp * 1e3,
                     "executorch_python_x_eager": eager / python, "hfx_run_x_eager": eager / cpp})
    return rows


def _llama(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tf.LlamaConfig(**CONFIGS[name], eos_token_id=None, max_position_embeddings=512)).eval()


def generation_rows(root: Path, new_tokens: int = 32, prompt_len: int = 16) -> list[dict]:
    rows = []
    for name in ("tiny", "100m"):
        model = _llama(name)
        checkpoint = root / f"{name}-ckpt"
        model.save_pretrained(checkpoint)
        folder = root / f"{name}-gen-pte"
        export_generation_folder(checkpoint, "executorch", folder, validate=False)
        prompt = torch.randint(3, CONFIGS[name]["vocab_size"], (1, prompt_len), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(prompt)
        with torch.no_grad():
            model.generate(prompt, attention_mask=mask, max_new_tokens=2, do_sample=False)  # warm-up
            started = time.perf_counter()
            eager_ids = model.generate(prompt, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
            eager = new_tokens / (time.perf_counter() - started)
        generator = ExportedGenerator.from_pretrained(folder, load_preprocessor=False)
        generator.generate(prompt, attention_mask=mask, max_new_tokens=2)
        started = time.perf_counter()
        python_ids = generator.generate(prompt, attention_mask=mask, max_new_tokens=new_tokens)
        python = new_tokens / (time.perf_counter() - started)
        done = subprocess.run([str(hfx_run()), str(folder), "--generate", "--input-ids", ",".join(map(str, prompt[0].tolist())),
                               "--max-new-tokens", str(new_tokens), "--warmup"], capture_output=True, text=True, check=True)
        cpp = float(re.search(r"([0-9.]+) tokens/s", done.stdout).group(1))
        cpp_ids = [int(i) for i in re.search(r"^ids: (\S+)$", done.stdout, re.M).group(1).split(",")]
        rows.append({"model": "tiny Llama" if name == "tiny" else "~100M Llama", "eager_tokens_per_s": eager,
                     "executorch_python_tokens_per_s": python, "hfx_run_tokens_per_s": cpp,
                     "executorch_python_x_eager": python / eager, "hfx_run_x_eager": cpp / eager,
                     "ids_equal_eager": {"python": python_ids.tolist() == eager_ids.tolist(), "hfx_run": cpp_ids == eager_ids[0].tolist()}})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "cpp_runner.json")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="hfx-bench-") as tmp:
        forward = forward_rows(Path(tmp), args.repeat)
        generation = generation_rows(Path(tmp))
    print("| model | eager ms | executorch.runtime (Python) ms | × eager | hfx-run (C++) ms | × eager |")
    print("|---|---|---|---|---|---|")
    for r in forward:
        print(f"| {r['model']} | {r['eager_ms']:.2f} | {r['executorch_python_ms']:.2f} | {r['executorch_python_x_eager']:.2f} | "
              f"{r['hfx_run_ms']:.2f} | {r['hfx_run_x_eager']:.2f} |")
    print("\n| model | eager tokens/s | ExportedGenerator (executorch.runtime) | × eager | hfx-run --generate | × eager | ids equal eager |")
    print("|---|---|---|---|---|---|---|")
    for r in generation:
        same = "yes" if all(r["ids_equal_eager"].values()) else str(r["ids_equal_eager"])
        print(f"| {r['model']} | {r['eager_tokens_per_s']:.1f} | {r['executorch_python_tokens_per_s']:.1f} | {r['executorch_python_x_eager']:.2f} | "
              f"{r['hfx_run_tokens_per_s']:.1f} | {r['hfx_run_x_eager']:.2f} | {same} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"command": command_line(), "forward": forward, "generation": generation,
                                     "torch_threads": torch.get_num_threads()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
