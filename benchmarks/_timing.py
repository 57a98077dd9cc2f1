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
