"""ExecuTorch export time against issue targets, as a user pays it: the first export in a fresh process.

For each model (all-MiniLM-L6-v2 at the CLI's example shape, and the 2-layer Llama of ``export_time.py``,
static and with dynamic shapes), each measurement runs in its own Python process, after imports and
model loading, so one-time work (XNNPACK's pattern graphs, first-call caches) counts as it does for
``hf-exporters export``:

- ``executorch``: ``ExecutorchExporter`` (xnnpack), first export and a second one in the same process;
- ``executorch without``: the same with the workarounds named by ``--without`` left out (default: this
  round's: ``_patch_graph_modules_compiled_on_first_use``, the graph modules the lowering makes compiling
  their Python code on first use instead of on every change; the earlier rounds' were the exporters leaving
  the process's older objects out of the garbage collector's passes (``existing_objects_frozen``), the
  dispatcher's CIA operators walked once per set of registrations, the edge verifier's dtype check
  reading the nodes' recorded values, torch's ``auto_functionalized`` removal left to programs holding
  such a call, the lazily built XNNPACK pattern graphs, the shared provenance records and the skipped
  edge-conversion passes, ``--without`` names any of them);
- ``onnx``: ``OnnxExporter`` on the same model and inputs (the issue's "at most 3x our ONNX export").

Rounds are interleaved (every variant once per round), the median over ``--rounds`` is reported with the
load average seen, beside the seconds each export spent in the garbage collector (``gc.callbacks``), which
varies less than the wall time on a shared machine. Every variant's ``.pte`` is hashed, so "the same program" is checked too.

Writes ``benchmarks/results/executorch_export_targets.json`` and prints a Markdown table.

Usage: ``python benchmarks/executorch_export_targets.py [--rounds 3] [--models minilm,llama,llama-dynamic]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import write_results  # noqa: E402

WITHOUT = "_patch_graph_modules_compiled_on_first_use"

CHILD = r"""
import hashlib, json, os, sys, time, warnings
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")
import torch, transformers
transformers.utils.logging.set_verbosity_error()
torch.set_num_threads(2)
from hf_exporters import ExecutorchConfig, ExecutorchExporter, OnnxConfig, OnnxExporter, registry
from hf_exporters.pipeline import build_inputs, default_model_path, load_checkpoint
from hf_exporters.workarounds.executorch import lowering_speed

model_name, variant, without = sys.argv[1], sys.argv[2], sys.argv[3]
if model_name == "minilm":
    model, tokenizer, _ = load_checkpoint(default_model_path())
    inputs, dynamic = build_inputs(model, tokenizer), False
else:
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 256, (2, 7))
    inputs, dynamic = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, model_name == "llama-dynamic"
if variant == "executorch without":
    names = set(without.split(","))
    if "_patch_xnnpack_passes_skip_absent_operators_lazy" in names:
        # the pattern graphs built up front, as before they were built lazily
        rules = lowering_speed._may_match_patterns
        def eager(required, build):
            patterns = lowering_speed._pattern_targets(build())
            return lambda gm, targets: lowering_speed._may_match(targets, patterns)
        lowering_speed._may_match_patterns = eager
    if "existing_objects_frozen" in names:
        import contextlib
        from hf_exporters.exporters import dynamo, executorch, onnx
        for module in (dynamo, executorch, onnx):  # nothing frozen, and nothing frozen later either
            module.existing_objects_frozen = lambda: contextlib.nullcontext(lambda: None)
    registry._REGISTRY[:] = [w for w in registry._REGISTRY if w.func.__name__ not in names]
import gc
collecting, collected = [0.0], [0.0]  # the garbage collector's time (its callbacks), within each export
def _timed(phase, info):
    if phase == "start":
        collecting[0] = time.perf_counter()
    else:
        collected[0] += time.perf_counter() - collecting[0]
gc.callbacks.append(_timed)
seconds, gc_seconds, digest = [], [], None
for _ in range(2):
    collected[0] = 0.0
    start = time.perf_counter()
    if variant == "onnx":
        result = OnnxExporter().export(model, inputs, OnnxConfig(dynamic=dynamic))
    else:
        result = ExecutorchExporter().export(model, inputs, ExecutorchConfig(dynamic=dynamic, backend="xnnpack"))
        digest = hashlib.sha256(result.buffer).hexdigest()[:16]
    seconds.append(time.perf_counter() - start)
    gc_seconds.append(collected[0])
print(json.dumps({"first": seconds[0], "second": seconds[1], "first_gc": gc_seconds[0], "second_gc": gc_seconds[1], "pte_sha256": digest}))
"""

MODELS = {"minilm": "MiniLM static", "llama": "tiny Llama static", "llama-dynamic": "tiny Llama dynamic"}
VARIANTS = ("executorch", "executorch without", "onnx")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="minilm,llama,llama-dynamic")
    parser.add_argument("--without", default=WITHOUT)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "executorch_export_targets.json")
    args = parser.parse_args()
    samples: dict[tuple[str, str], list[dict]] = {}
    loads = []
    for _ in range(args.rounds):
        for model in args.models.split(","):
            for variant in VARIANTS:
                loads.append(os.getloadavg()[0])
                run = subprocess.run([sys.executable, "-c", CHILD, model, variant, args.without], capture_output=True, text=True)
                if run.returncode != 0:
                    raise SystemExit(f"{model} {variant} failed:\n{run.stderr[-2000:]}")
                sample = json.loads(run.stdout.strip().splitlines()[-1])
                samples.setdefault((model, variant), []).append(sample)
                print(model, variant, sample, flush=True)
    rows = []
    for (model, variant), runs in samples.items():
        rows.append(
            {
                "model": MODELS[model],
                "variant": variant,
                "first_s": statistics.median(r["first"] for r in runs),
                "second_s": statistics.median(r["second"] for r in runs),
                "first_gc_s": statistics.median(r["first_gc"] for r in runs),
                "second_gc_s": statistics.median(r["second_gc"] for r in runs),
                "pte_sha256": sorted({r["pte_sha256"] for r in runs if r["pte_sha256"]}),
                "samples": runs,
            }
        )
    by = {(r["model"], r["variant"]): r for r in rows}
    for r in rows:
        ours = by[(r["model"], "executorch")]
        onnx = by[(r["model"], "onnx")]
        r["first_over_executorch"] = r["first_s"] / ours["first_s"]
        r["executorch_first_over_onnx_first"] = ours["first_s"] / onnx["first_s"]
    write_results(args.out, rows, loads, rounds=args.rounds, without=args.without.split(","))
    print(f"\nload average {min(loads):.1f} to {max(loads):.1f}, median of {args.rounds} rounds\n")
    print("| model | variant | first export s | (in collections) | second export s | (in collections) | first / with | .pte same |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        same = "-" if r["variant"] == "onnx" else ("yes" if r["pte_sha256"] == by[(r["model"], "executorch")]["pte_sha256"] else "no")
        print(
            f"| {r['model']} | {r['variant']} | {r['first_s']:.2f} | {r['first_gc_s']:.2f} | {r['second_s']:.2f} | {r['second_gc_s']:.2f} "
            f"| {r['first_over_executorch']:.2f} | {same} |"
        )
    for model in dict.fromkeys(r["model"] for r in rows):
        print(f"{model}: ExecuTorch first export / ONNX first export = {by[(model, 'executorch')]['executorch_first_over_onnx_first']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
