"""A generation folder's parts as the methods of one ExecuTorch program (``ExecutorchConfig(one_program=True)``,
the default) against one program per part (``one_program=False``), as ``export_for_generation`` writes them.

For each model (the 2-layer tiny Llama of ``export_time.py`` and a 4-layer Llama with hidden size 256), each
mode runs in its own Python process, after imports and model loading: ``export_for_generation`` (XNNPACK,
dynamic shapes), ``save_pretrained`` (with the parity check), then ``ExportedGenerator`` loads the folder and
generates ``--new-tokens`` greedy tokens from a 16-token prompt (one untimed warm-up call first). Reported per
mode: export seconds (all stages), the seconds of the lowering and serialisation, ``.pte`` bytes on disk, the
folder's load seconds, decode tokens/s, the process's peak resident memory, and the generated ids (both modes
must give the same).

Rounds are interleaved (both modes once per round); the median over ``--rounds`` is reported with the load
average seen.

Writes ``benchmarks/results/executorch_multimethod.json`` and prints a Markdown table.

Usage: ``python benchmarks/executorch_multimethod.py [--rounds 3] [--models tiny,small] [--new-tokens 32]``
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

MODELS = {"tiny": {"layers": 2, "hidden": 64, "vocab": 256}, "small": {"layers": 4, "hidden": 256, "vocab": 4096}}

CHILD = r"""
import json, os, resource, sys, tempfile, time, warnings
from pathlib import Path
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")
import torch, transformers
transformers.utils.logging.set_verbosity_error()
torch.set_num_threads(2)
from hf_exporters import ExecutorchConfig, ExecutorchExporter
from hf_exporters.generation import ExportedGenerator, export_for_generation

spec, one, new_tokens = json.loads(sys.argv[1]), sys.argv[2] == "one", int(sys.argv[3])
torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=spec["vocab"], hidden_size=spec["hidden"], intermediate_size=2 * spec["hidden"],
                                  num_hidden_layers=spec["layers"], num_attention_heads=4, num_key_value_heads=2, eos_token_id=None)
model = transformers.LlamaForCausalLM(config).eval()
ids = torch.randint(1, spec["vocab"], (1, 16), generator=torch.Generator().manual_seed(1))
inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
with tempfile.TemporaryDirectory() as tmp:
    started = time.perf_counter()
    artifacts = export_for_generation(ExecutorchExporter(), model, inputs, ExecutorchConfig(one_program=one))
    export_seconds = time.perf_counter() - started
    lowering = {name: sum(v for k, v in result.stage_seconds.items() if k.startswith(("lowering", "serialisation")))
                for name, result in artifacts.results.items()}
    artifacts.save_pretrained(Path(tmp) / "folder")
    pte_bytes = sum(p.stat().st_size for p in (Path(tmp) / "folder").rglob("*.pte"))
    del artifacts
    started = time.perf_counter()
    generator = ExportedGenerator.from_pretrained(Path(tmp) / "folder")
    load_seconds = time.perf_counter() - started
    generator.generate(**inputs, max_new_tokens=2)
    started = time.perf_counter()
    out = generator.generate(**inputs, max_new_tokens=new_tokens)
    generate_seconds = time.perf_counter() - started
print(json.dumps({
    "export_seconds": export_seconds,
    # one program: one lowering shared by the parts; otherwise one per part
    "lowering_seconds": max(lowering.values()) if one else sum(lowering.values()),
    "pte_bytes": pte_bytes,
    "load_seconds": load_seconds,
    "tokens_per_second": new_tokens / generate_seconds,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "ids": out[0, ids.shape[1]:].tolist(),
    "parameters": sum(p.numel() for p in model.parameters()),
}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "executorch_multimethod.json")
    args = parser.parse_args()
    models = args.models.split(",")
    modes = ["one", "separate"]
    samples: dict[tuple[str, str], list[dict]] = {(m, mode): [] for m in models for mode in modes}
    loads = [os.getloadavg()[0]]
    for round_index in range(args.rounds):
        for model in models:
            for mode in modes if round_index % 2 == 0 else modes[::-1]:
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, json.dumps(MODELS[model]), mode, str(args.new_tokens)],
                    capture_output=True, text=True, check=False,
                )
                if done.returncode != 0:
                    print(done.stderr[-3000:], file=sys.stderr)
                    return 1
                samples[(model, mode)].append(json.loads(done.stdout.strip().splitlines()[-1]))
                loads.append(os.getloadavg()[0])
                print(model, mode, round_index, file=sys.stderr)
    rows = []
    keys = ("export_seconds", "lowering_seconds", "pte_bytes", "load_seconds", "tokens_per_second", "peak_rss_mb")
    for model in models:
        ids = {mode: samples[(model, mode)][0]["ids"] for mode in modes}
        for mode in modes:
            runs = samples[(model, mode)]
            row = {"model": model, "mode": mode, "parameters": runs[0]["parameters"], "rounds": len(runs),
                   "same_ids_as_separate": ids[mode] == ids["separate"]}
            for key in keys:
                values = [r[key] for r in runs]
                row[key] = round(statistics.median(values), 3)
                row[key + "_range"] = [round(min(values), 3), round(max(values), 3)]
            rows.append(row)
    write_results(args.out, rows, loads, rounds=args.rounds, new_tokens=args.new_tokens, models={m: MODELS[m] for m in models})
    print("| model | mode | export s | lowering s | .pte KB | load s | tokens/s | peak RSS MB | same ids |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['model']} ({row['parameters'] / 1e6:.2f}M) | {row['mode']} | {row['export_seconds']:.1f} | {row['lowering_seconds']:.1f} | "
              f"{row['pte_bytes'] / 1024:.0f} | {row['load_seconds']:.2f} | {row['tokens_per_second']:.0f} | {row['peak_rss_mb']:.0f} | "
              f"{'yes' if row['same_ids_as_separate'] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
