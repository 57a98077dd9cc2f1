"""ONNX generation with onnxruntime's IOBinding against ``InferenceSession.run``, same folder, same process.

``ExportedGenerator`` on an ONNX folder binds each step's cache outputs (``OrtValue`` in onnxruntime's
memory) as the next step's inputs (``io_binding=True``, the default); with ``io_binding=False`` every step
goes through ``InferenceSession.run``, which copies every cache tensor out into numpy and feeds it back.
For each model (the random-weight Llama configs of ``generation_speed.py``) the generation folder is
exported once, then the two modes alternate (ABBA order) for ``--rounds`` rounds of one greedy request each; the
median tokens/s of each and their ratio are reported, and the ids of the two modes must be equal.

Writes ``benchmarks/results/onnx_generation_binding.json`` and prints a Markdown table.

Usage: ``python benchmarks/onnx_generation_binding.py [--models tiny,100m] [--prompt-len 256]
[--new-tokens 64] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.set_verbosity_error()

sys.path.insert(0, str(Path(__file__).parent))
from _timing import write_results  # noqa: E402
from generation_speed import CONFIGS, _model  # noqa: E402

from hf_exporters import OnnxConfig, OnnxExporter  # noqa: E402
from hf_exporters.generation import ExportedGenerator, export_for_generation  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="tiny,100m")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "onnx_generation_binding.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = []
    loads = []
    for name in args.models.split(","):
        model = _model(name)
        ids = torch.randint(3, CONFIGS[name]["vocab_size"], (1, args.prompt_len), generator=torch.Generator().manual_seed(0))
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        with tempfile.TemporaryDirectory() as tmp:
            export_for_generation(OnnxExporter(), model, inputs, OnnxConfig(dynamic=True)).save_pretrained(tmp)
            generator = ExportedGenerator.from_pretrained(tmp, load_preprocessor=False)
            speeds: dict[bool, list[float]] = {True: [], False: []}
            outputs: dict[bool, list[list[int]]] = {}
            generator.generate(**inputs, max_new_tokens=2)  # warm-up
            for round_index in range(args.rounds):
                # ABBA order: neither mode always runs first in a round
                for bound in (True, False) if round_index % 2 == 0 else (False, True):
                    loads.append(os.getloadavg()[0])
                    generator.io_binding = bound
                    start = time.perf_counter()
                    out = generator.generate(**inputs, max_new_tokens=args.new_tokens)
                    seconds = time.perf_counter() - start
                    speeds[bound].append((out.shape[1] - args.prompt_len) / seconds)
                    outputs[bound] = out.tolist()
        row = {
            "model": name,
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "io_binding_tokens_per_s": statistics.median(speeds[True]),
            "session_run_tokens_per_s": statistics.median(speeds[False]),
            "ids_equal": outputs[True] == outputs[False],
            "samples": {"io_binding": speeds[True], "session_run": speeds[False]},
        }
        row["ratio"] = row["io_binding_tokens_per_s"] / row["session_run_tokens_per_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_results(args.out, rows, loads, threads=torch.get_num_threads(), rounds=args.rounds)
    print(f"\nload average {min(loads):.1f} to {max(loads):.1f}, median of {args.rounds} rounds\n")
    print("| model | prompt | new tokens | IOBinding tokens/s | session.run tokens/s | IOBinding / run | ids equal |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['prompt_len']} | {r['new_tokens']} | {r['io_binding_tokens_per_s']:.1f} | "
            f"{r['session_run_tokens_per_s']:.1f} | {r['ratio']:.2f} | {'yes' if r['ids_equal'] else 'no'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
