"""Indexing helpers for packed sequences: slices of varying length laid back to back in one axis.

Packed vision towers and varlen attention describe their pieces by cumulative offsets. Mapping each
position to its piece is written here once, as a broadcast comparison and a sum: every backend lowers
those (no ``searchsorted``, no ``repeat_interleave``, no Python loop over the pieces).
"""

from __future__ import annotations

from typing import Any

import torch


def slice_index(ends: torch.Tensor, total: Any) -> torch.Tensor:
    """The slice each of ``total`` packed positions falls in: shape (total,), int64.

    ``ends`` (slices,): each slice's end offset, non-decreasing (``cumsum`` of the slice lengths, or
    ``cu_seqlens[1:]``). Position ``p`` lies in slice ``i`` = the number of ends at or below ``p``.
    ``total`` is an int or a symbolic size (``ends[-1]``, or a size read from the data); positions at
    or past the last end get ``slices``. Cost: ``total x slices`` comparisons.
    """
    positions = torch.arange(total, device=ends.device, dtype=ends.dtype)
    return (positions[:, None] >= ends[None, :]).sum(dim=-1)


def packed_positions(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For items packed image after image, ``counts[i]`` of image ``i``: each item's image and its
    place within that image, both (counts.sum(),) int64. The total is read once from the data (an
    unbacked size); the image of an item is the number of images that end at or before it (a
    comparison and a sum, no ``repeat_interleave``, no Python loop over the images)."""
    total = counts.sum().item()
    torch._check(total >= 0)
    ends = torch.cumsum(counts, 0)
    image = slice_index(ends, total)
    return image, torch.arange(total, device=counts.device) - (ends - counts)[image]
