"""Timing shared by the benchmarks: engines interleaved so that machine load hits them alike."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def interleaved_ms(engines: dict[str, Callable[[], object]], runs: int, warmup: int) -> dict[str, list[float]]:
    """Milliseconds of each engine's call over ``runs`` rounds after ``warmup`` rounds, every engine once
    a round, the order reversed every other round (under ``torch.no_grad``)."""
    samples: dict[str, list[float]] = {name: [] for name in engines}
    with torch.no_grad():
        for _ in range(warmup):
            for fn in engines.values():
                fn()
        for round_index in range(runs):
            order = list(engines.items())
            if round_index % 2:
                order.reverse()
            for name, fn in order:
                start = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - start) * 1000)
    return samples


def command_line() -> str:
    """The command that runs this benchmark as it was run: ``python benchmarks/<script>.py <arguments>``."""
    import sys
    from pathlib import Path

    script = Path(sys.argv[0]).resolve()
    return " ".join(["python", f"benchmarks/{script.name}" if script.parent.name == "benchmarks" else str(sys.argv[0]), *sys.argv[1:]])


def write_results(out: "Path", rows: list[dict], loads: list[float], **settings: object) -> dict:
    """Write ``{"meta": ..., "rows": rows}`` to ``out`` (JSON); ``meta`` holds the exact command, the Python,
    machine and core count, the 1-minute load average seen over the run (``loads``), the date and
    ``settings``. Returns ``meta``."""
    import json
    import os
    import platform
    import sys
    from pathlib import Path

    meta = {
        "command": command_line(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        **settings,
        "load_average_1min": {"min": min(loads), "max": max(loads)},
        "date": time.strftime("%Y-%m-%d"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    return meta
