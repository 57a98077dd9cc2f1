"""ExecuTorch programs against eager PyTorch float32, in one run: fp32, fp16, 8da8w and 8da4w, through
``executorch.runtime`` (Python) and ``hfx-run`` (C++), beside optimum-executorch's export of the same Llama.

**MiniLM forward** (the embedded all-MiniLM-L6-v2, ``--seq`` tokens of real sentences, each of ``--batches``):
one static XNNPACK program per batch and variant (``fp32``; ``fp16``: ``--dtype float16``; ``8da8w`` and
``8da4w``: ``--quantize``, int8 dynamic activations with int8 weights per channel or int4 weights in groups
of 32). Engines: eager PyTorch float32 (``torch.set_num_threads(2)``), each ``.pte`` loaded once with
``executorch.runtime``, and ``hfx-run DIR --inputs ... --repeat R`` (one process a round, program loaded once,
its own median of R runs after a warm-up). Each of ``--rounds`` rounds times every engine ``--runs`` times,
engines in a rotating order; the figure is the median of the rounds' medians, with their min and max.
Also: each program's size on disk and its largest difference from float32 eager's ``last_hidden_state``.

**Llama generation** (``generation_speed.CONFIGS["100m"]``: 99.5M parameters, random weights, seed 0; a
``--prompt-len`` prompt then ``--new-tokens`` greedy tokens, batch 1): generation folders with the key/value
cache in the program (``--kv-cache program --max-seq-len 128``, ExecuTorch's LLM operators; how ExecuTorch's
LLM runner drives a program) in fp32, fp16, 8da8w and 8da4w, the last two with int8 embeddings
(``--qembedding 8w``), exported with ``export_generation_folder(validate=False)`` (random weights: the
accuracy check measures nothing a real checkpoint would). Engines:

- eager float32: the model's forward on the prompt (prefill), then one forward per token over its
  ``DynamicCache`` (no ``generate()`` overhead);
- ``executorch.runtime``: the program's method driven by position from Python, the same loop for every
  ``.pte`` (ours and optimum-executorch's): prompt at positions ``0..T-1``, then each token at the next;
- ``hfx-run --generate --warmup`` on our folders (its printed prefill ms and decode tokens/s);
- optimum-executorch 1.1.0's export of the same checkpoint (``optimum-cli export executorch --recipe xnnpack
  --use_custom_sdpa --use_custom_kv_cache --max_seq_len 128`` with ``--dtype float16``, ``--qlinear 8da8w|8da4w
  --qlinear_group_size 32 --qembedding 8w``), in ``benchmarks/.venv-optimum-executorch``
  (``setup_optimum_executorch_env.sh``: it cannot be installed beside our pins), run by the loop above.

**MiniLM alone** (``--sections isolated``): eager float32 and the static fp32 ``.pte`` each timed in a fresh
process of its own (``--runs`` forwards after 5 warm-ups), alternating for ``--rounds`` rounds. In one process
the engines' thread pools (torch's OpenMP threads and XNNPACK's pthreadpool, each spinning a while after a
run) can slow whichever engine runs next; apart, neither can.

**MiniLM accuracy** (``--sections accuracy``, no timing): each static batch-8 program's mean-pooled sentence
embeddings against float32 eager over the 40 shipped sentences (min and mean cosine, nearest-neighbour
agreement: the accuracy check a quantized export runs), with ``8da8w-8w`` and ``8da4w-8w`` adding
``--qembedding 8w``, and each ``.pte``'s size.

Figures: prefill milliseconds and decode tokens/s (the steps after the first token), medians over the rounds
with min and max; ``.pte`` size on disk; whether the ids equal eager float32's.

Usage: ``python benchmarks/executorch_runtimes.py [--rounds 5] [--runs 5] [--batches 1,8] [--seq 128]
[--sections minilm,llama,isolated,accuracy] [--variants fp32,fp16,8da8w,8da4w] [--json benchmarks/results/executorch_runtimes.json]``
(``make cpp`` first). Ratios: ``× eager`` is eager's time over the engine's (above 1: faster than eager).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import write_results  # noqa: E402
from executorch_latency import inputs_for  # noqa: E402
from generation_speed import CONFIGS, _model  # noqa: E402

transformers.utils.logging.set_verbosity_error()

from hf_exporters.generation import export_generation_folder  # noqa: E402
from hf_exporters.pipeline import default_model_path, export_to_folder, load_checkpoint  # noqa: E402
from hf_exporters.runtime.cpp_runner import hfx_run  # noqa: E402
from hf_exporters.runtime.et_runner import ExecutorchRunner  # noqa: E402

OPTIMUM_EXECUTORCH = Path(__file__).resolve().parent / ".venv-optimum-executorch" / "bin" / "optimum-cli"
#: variant -> (export --dtype, --quantize, --qembedding for generation)
VARIANTS = {"fp32": (None, None, None), "fp16": ("float16", None, None), "8da8w": (None, "8da8w", "8w"), "8da4w": (None, "8da4w", "8w")}
MAX_SEQ_LEN = 128


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _size_mb(path: Path) -> float:
    return round(path.stat().st_size / 1e6, 2)


def _rounds(engines: dict[str, object], rounds: int, loads: list[float]) -> dict[str, list[float]]:
    """Each engine's per-round figure (a callable returning it) over ``rounds`` rounds, the engines' order
    rotated by one each round."""
    names = list(engines)
    figures: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        loads.append(os.getloadavg()[0])
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            figures[name].append(engines[name]())
    return figures


def _median_ms(fn, runs: int) -> float:
    samples = []
    with torch.no_grad():
        for _ in range(runs):
            started = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def minilm_rows(root: Path, batches: list[int], seq: int, variants: list[str], rounds: int, runs: int, loads: list[float]) -> list[dict]:
    from safetensors.torch import save_file

    model, tokenizer, _ = load_checkpoint(default_model_path())
    rows = []
    for batch in batches:
        inputs = {k: v for k, v in inputs_for(tokenizer, batch, seq).items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.no_grad():
            expected = model(**inputs).last_hidden_state
        engines = {"eager": lambda inputs=inputs: _median_ms(lambda: model(**inputs), runs)}
        about: dict[str, dict] = {}
        for variant in variants:
            dtype, quantize, _ = VARIANTS[variant]
            folder = root / f"minilm-b{batch}-{variant}"
            started = time.perf_counter()
            exported = copy.deepcopy(model) if dtype else model  # --dtype casts the model it is given in place
            manifest = export_to_folder(exported, dict(inputs), "executorch", folder, dynamic=False, validate=False, dtype=dtype, quantize=quantize)
            export_s = time.perf_counter() - started
            runner = ExecutorchRunner(folder / "model.pte")
            fed = dict(inputs)
            got = torch.as_tensor(runner(fed)[0]).float()
            about[variant] = {"size_mb": _size_mb(folder / "model.pte"), "export_s": round(export_s, 1),
                              "partitions": manifest.get("partitions", {}).get("forward"),
                              "max_abs_diff_vs_eager_fp32": float((got - expected).abs().max())}
            save_file({s["name"]: t.contiguous() for s, t in zip(manifest["inputs"], inputs.values())}, folder / "inputs.safetensors")
            engines[f"{variant} executorch.runtime"] = lambda runner=runner, fed=fed: _median_ms(lambda: runner(fed), runs)

            def cpp(folder=folder) -> float:
                done = subprocess.run([str(hfx_run()), str(folder), "--inputs", str(folder / "inputs.safetensors"), "--repeat", str(runs)],
                                      capture_output=True, text=True, check=True)
                return float(re.search(r"median ([0-9.]+) ms", done.stdout).group(1))

            engines[f"{variant} hfx-run"] = cpp
        figures = _rounds(engines, rounds, loads)
        eager = statistics.median(figures["eager"])
        for name, values in figures.items():
            variant, _, runtime = name.partition(" ")
            stats = _stats(values)
            rows.append({"model": "MiniLM", "batch": batch, "seq": seq, "variant": "eager fp32" if name == "eager" else variant,
                         "runtime": runtime or "PyTorch", **{f"{k}_ms": round(v, 2) for k, v in stats.items()},
                         "x_eager": round(eager / stats["median"], 3), **about.get(variant, {})})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _forward_alone(target: str, batch: int, seq: int, runs: int) -> float:
    """Median ms of ``runs`` forwards of MiniLM (eager when ``target`` is ``eager``, else the ``.pte`` at that
    path) in this process, after 5 warm-ups, with nothing else loaded: the ``--worker`` side of ``isolated_rows``."""
    model, tokenizer, _ = load_checkpoint(default_model_path())
    inputs = {k: v for k, v in inputs_for(tokenizer, batch, seq).items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    if target == "eager":
        fn = lambda: model(**inputs)  # noqa: E731
    else:
        runner = ExecutorchRunner(target)
        fn = lambda: runner(inputs)  # noqa: E731
    with torch.no_grad():
        for _ in range(5):
            fn()
    return _median_ms(fn, runs)


def isolated_rows(root: Path, batches: list[int], seq: int, rounds: int, runs: int, loads: list[float]) -> list[dict]:
    """Eager float32 against the static fp32 ``.pte`` (executorch.runtime), each in a fresh process per
    measurement, alternating, ``rounds`` times: no engine shares a process, so neither one's thread pool (torch's
    OpenMP threads, XNNPACK's pthreadpool, both spinning a while after each run) can slow the other."""
    model, tokenizer, _ = load_checkpoint(default_model_path())
    rows = []
    for batch in batches:
        inputs = {k: v for k, v in inputs_for(tokenizer, batch, seq).items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        folder = root / f"minilm-b{batch}-fp32-alone"
        export_to_folder(model, dict(inputs), "executorch", folder, dynamic=False, validate=False)

        def measure(target: str, batch: int = batch) -> float:
            done = subprocess.run([sys.executable, __file__, "--worker", target, str(batch), str(seq), str(runs)],
                                  capture_output=True, text=True, check=True)
            return float(done.stdout.strip().splitlines()[-1])

        figures = _rounds({"eager": lambda: measure("eager"), "fp32": lambda folder=folder: measure(str(folder / "model.pte"))}, rounds, loads)
        eager = statistics.median(figures["eager"])
        for name, values in figures.items():
            stats = _stats(values)
            rows.append({"model": "MiniLM", "batch": batch, "seq": seq, "variant": "eager fp32" if name == "eager" else name,
                         "runtime": "PyTorch" if name == "eager" else "executorch.runtime", "process": "its own, fresh each round",
                         **{f"{k}_ms": round(v, 2) for k, v in stats.items()}, "x_eager": round(eager / stats["median"], 3)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def accuracy_rows(root: Path, seq: int, loads: list[float]) -> list[dict]:
    """Each MiniLM program's sentence embeddings against float32 eager over the 40 shipped sentences (the accuracy
    check a quantized export runs: ``hf_exporters.runtime.embedding_accuracy``), and its size on disk; static
    programs at batch 8 and ``seq`` tokens, ``8da8w-8w`` / ``8da4w-8w`` with ``--qembedding 8w`` too. No timing."""
    from hf_exporters.pipeline import forward_parameters
    from hf_exporters.runtime.embedding_accuracy import embedding_accuracy, sentence_batches

    model, tokenizer, _ = load_checkpoint(default_model_path())
    batches = sentence_batches(tokenizer, forward_parameters(model), batch=8, length=seq)
    rows = []
    for variant in ("fp32", "fp16", "8da8w", "8da8w-8w", "8da4w", "8da4w-8w"):
        loads.append(os.getloadavg()[0])
        dtype, quantize, _ = VARIANTS[variant.removesuffix("-8w")]
        folder = root / f"minilm-accuracy-{variant}"
        exported = copy.deepcopy(model) if dtype else model
        export_to_folder(exported, dict(batches[0]), "executorch", folder, dynamic=False, validate=False, dtype=dtype, quantize=quantize,
                         quantize_embeddings="8w" if variant.endswith("-8w") else None)
        runner = ExecutorchRunner(folder / "model.pte")
        measured = embedding_accuracy(model, lambda inputs, runner=runner: [torch.as_tensor(runner(inputs)[0]).float()], batches)
        rows.append({"model": "MiniLM", "batch": 8, "seq": seq, "variant": variant, "size_mb": _size_mb(folder / "model.pte"),
                     **{k: v for k, v in measured.as_dict().items() if k != "thresholds"}, "thresholds": measured.thresholds})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _llama(checkpoint: Path) -> torch.nn.Module:
    """generation_speed's ~100M Llama (seed 0), saved to ``checkpoint`` for both exporters."""
    model = _model("100m")
    model.save_pretrained(checkpoint)
    return model


def _eager_generation(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> tuple[float, float, list[int]]:
    """(prefill ms, decode tokens/s, ids) of a greedy loop over the model's forward and its DynamicCache."""
    with torch.no_grad():
        started = time.perf_counter()
        out = model(input_ids=prompt, use_cache=True)
        prefill = time.perf_counter() - started
        ids = prompt[0].tolist() + [int(out.logits[0, -1].argmax())]
        past = out.past_key_values
        started = time.perf_counter()
        for _ in range(new_tokens - 1):
            out = model(input_ids=torch.tensor([[ids[-1]]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            ids.append(int(out.logits[0, -1].argmax()))
        decode = time.perf_counter() - started
    return prefill * 1e3, (new_tokens - 1) / decode, ids


def _program_generation(method, prompt: torch.Tensor, new_tokens: int) -> tuple[float, float, list[int]]:
    """The same for a program holding its cache: ``method.execute([input_ids (1, q), cache_position (q,)])``."""
    length = prompt.shape[1]
    started = time.perf_counter()
    logits = method.execute([prompt, torch.arange(length)])[0]
    prefill = time.perf_counter() - started
    ids = prompt[0].tolist() + [int(logits[0, -1].argmax())]
    started = time.perf_counter()
    for _ in range(new_tokens - 1):
        logits = method.execute([torch.tensor([[ids[-1]]]), torch.tensor([len(ids) - 1])])[0]
        ids.append(int(logits[0, -1].argmax()))
    decode = time.perf_counter() - started
    return prefill * 1e3, (new_tokens - 1) / decode, ids


def _optimum_export(checkpoint: Path, folder: Path, variant: str) -> str | None:
    """optimum-executorch's export of ``checkpoint`` as ``variant`` into ``folder``; an error line, or None."""
    if not OPTIMUM_EXECUTORCH.exists():
        return f"optimum-executorch environment not found ({OPTIMUM_EXECUTORCH.parent.parent}); create it with bash benchmarks/setup_optimum_executorch_env.sh"
    dtype, quantize, embeddings = VARIANTS[variant]
    command = [str(OPTIMUM_EXECUTORCH), "export", "executorch", "--model", str(checkpoint), "--task", "text-generation", "--recipe", "xnnpack",
               "--use_custom_sdpa", "--use_custom_kv_cache", "--max_seq_len", str(MAX_SEQ_LEN), "--output_dir", str(folder)]
    if dtype:
        command += ["--dtype", dtype]
    if quantize:
        command += ["--qlinear", quantize, "--qembedding", embeddings] + (["--qlinear_group_size", "32"] if quantize == "8da4w" else [])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(command, capture_output=True, text=True, check=False, env={**env, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0 or not (folder / "model.pte").exists():
        return "optimum-cli export executorch failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    return None


def llama_rows(root: Path, variants: list[str], rounds: int, prompt_len: int, new_tokens: int, optimum: bool, loads: list[float]) -> list[dict]:
    checkpoint = root / "llama-100m"
    model = _llama(checkpoint)
    prompt = torch.randint(3, CONFIGS["100m"]["vocab_size"], (1, prompt_len), generator=torch.Generator().manual_seed(0))
    engines: dict[str, object] = {}
    about: dict[str, dict] = {}
    results: dict[str, list[tuple[float, float, list[int]]]] = {}

    def eager() -> int:
        results.setdefault("eager", []).append(_eager_generation(model, prompt, new_tokens))
        return 0

    engines["eager"] = eager
    for variant in variants:
        dtype, quantize, embeddings = VARIANTS[variant]
        folder = root / f"llama-{variant}"
        started = time.perf_counter()
        manifest = export_generation_folder(checkpoint, "executorch", folder, kv_cache="program", max_seq_len=MAX_SEQ_LEN, validate=False,
                                            dtype=dtype, quantize=quantize, quantize_embeddings=embeddings)
        about[f"{variant} ours"] = {"size_mb": _size_mb(folder / "model.pte"), "export_s": round(time.perf_counter() - started, 1)}
        method = ExecutorchRunner(folder / "model.pte", manifest["parts"]["decode"]["method"]).method

        def python(name=f"{variant} ours executorch.runtime", method=method) -> int:
            results.setdefault(name, []).append(_program_generation(method, prompt, new_tokens))
            return 0

        def cpp(name=f"{variant} ours hfx-run", folder=folder) -> int:
            done = subprocess.run([str(hfx_run()), str(folder), "--generate", "--input-ids", ",".join(map(str, prompt[0].tolist())),
                                   "--max-new-tokens", str(new_tokens), "--warmup"], capture_output=True, text=True, check=True)
            prefill = float(re.search(r"^prefill: ([0-9.]+) ms", done.stdout, re.M).group(1))
            decode = float(re.search(r"decode: \d+ steps, ([0-9.]+) tokens/s", done.stdout).group(1))
            ids = [int(i) for i in re.search(r"^ids: (\S+)$", done.stdout, re.M).group(1).split(",")]
            results.setdefault(name, []).append((prefill, decode, ids))
            return 0

        engines[f"{variant} ours executorch.runtime"] = python
        engines[f"{variant} ours hfx-run"] = cpp
        if optimum:
            other = root / f"optimum-{variant}"
            started = time.perf_counter()
            error = _optimum_export(checkpoint, other, variant)
            about[f"{variant} optimum-executorch"] = {"error": error} if error else {
                "size_mb": _size_mb(other / "model.pte"), "export_s": round(time.perf_counter() - started, 1)}
            if error is None:
                other_method = ExecutorchRunner(other / "model.pte", "forward").method

                def theirs(name=f"{variant} optimum-executorch executorch.runtime", method=other_method) -> int:
                    results.setdefault(name, []).append(_program_generation(method, prompt, new_tokens))
                    return 0

                engines[f"{variant} optimum-executorch executorch.runtime"] = theirs
    for name, fn in engines.items():  # one untimed run each: XNNPACK packs its weights at the first execution
        if name != "eager" and not name.endswith("hfx-run"):
            fn()
            results[name].clear()
    _rounds(engines, rounds, loads)
    eager_prefill = statistics.median(r[0] for r in results["eager"])
    eager_decode = statistics.median(r[1] for r in results["eager"])
    eager_ids = results["eager"][0][2]
    rows = []
    for name in engines:
        runs = results[name]
        variant, _, rest = name.partition(" ")
        exporter, _, runtime = rest.rpartition(" ")
        prefill, decode = _stats([r[0] for r in runs]), _stats([r[1] for r in runs])
        rows.append({"model": "Llama ~100M", "variant": "eager fp32" if name == "eager" else variant, "exporter": exporter or "-",
                     "runtime": runtime if name != "eager" else "PyTorch", "prompt_len": prompt_len, "new_tokens": new_tokens,
                     **{f"prefill_{k}_ms": round(v, 2) for k, v in prefill.items()},
                     **{f"decode_{k}_tokens_per_s": round(v, 1) for k, v in decode.items()},
                     "prefill_x_eager": round(eager_prefill / prefill["median"], 3), "decode_x_eager": round(decode["median"] / eager_decode, 3),
                     "ids_equal_eager_fp32": runs[0][2] == eager_ids, **about.get(f"{variant} {exporter}", {})})
        print(json.dumps(rows[-1]), flush=True)
    for name, entry in about.items():
        if "error" in entry:
            rows.append({"model": "Llama ~100M", "variant": name.split(" ")[0], "exporter": "optimum-executorch", **entry})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default="minilm,llama")
    parser.add_argument("--variants", default="fp32,fp16,8da8w,8da4w")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5, help="MiniLM: timed runs of each engine per round")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--no-optimum", action="store_true", help="leave out optimum-executorch's exports")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "executorch_runtimes.json")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.worker:
        target, batch, seq, runs = args.worker
        print(_forward_alone(target, int(batch), int(seq), int(runs)))
        return 0
    variants = args.variants.split(",")
    loads: list[float] = []
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="hfx-bench-") as tmp:
        if "minilm" in args.sections:
            rows += minilm_rows(Path(tmp), [int(b) for b in args.batches.split(",")], args.seq, variants, args.rounds, args.runs, loads)
        if "accuracy" in args.sections:
            rows += accuracy_rows(Path(tmp), args.seq, loads)
        if "isolated" in args.sections:
            rows += isolated_rows(Path(tmp), [int(b) for b in args.batches.split(",")], args.seq, args.rounds, args.runs, loads)
        if "llama" in args.sections:
            rows += llama_rows(Path(tmp), variants, args.rounds, args.prompt_len, args.new_tokens, not args.no_optimum, loads)
    from importlib import metadata

    write_results(args.json, rows, loads, torch_threads=torch.get_num_threads(), rounds=args.rounds, runs=args.runs,
                  versions={name: metadata.version(name) for name in ("torch", "transformers", "executorch", "torchao")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
