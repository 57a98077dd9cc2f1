"""Position embeddings and relative positions of a symbolic sequence length: model patches
(DynamoExporter Stage 2, applied for every backend).

Pattern: positions built as Python lists over the length (Funnel), gathered sample by sample in a
Python loop (Reformer's axial embeddings), a table rebuilt when the length outgrows it, or a
relative-position shift through views that guard on the length (FastSpeech 2's conformer). The
patches keep the length symbolic and give the same embeddings.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ...registry import register_patch


class _Positions:
    """Token positions ``prefix + [start, start + step, ..., start + (count - 1) * step]`` whose count may
    be a ``SymInt``: the list Funnel builds with ``list(range(seq_len))`` and pools, kept as a few
    numbers so that a symbolic length is never turned into a Python list.

    Supports what Funnel's position code does with its lists: ``[0]``, ``[-1]``, ``[1:]``, ``[1:-1]``,
    ``[::2]``, ``list + positions`` and :meth:`size` (``len``, which Python requires to be an int).
    The progression part is assumed non-empty where ``[-1]`` or ``[1:-1]`` reads it, as for any
    sequence Funnel pools.
    """

    def __init__(self, prefix: tuple[Any, ...], start: Any, step: Any, count: Any) -> None:
        self.prefix, self.start, self.step, self.count = prefix, start, step, count

    def size(self) -> Any:
        return len(self.prefix) + self.count

    def __radd__(self, other: list[Any]) -> _Positions:
        return _Positions(tuple(other) + self.prefix, self.start, self.step, self.count)

    def __getitem__(self, index: Any) -> Any:
        if index == 0:
            return self.prefix[0] if self.prefix else self.start
        if index == -1:
            return self.start + (self.count - 1) * self.step
        if index == slice(1, None) or index == slice(1, -1):
            rest = _Positions(self.prefix[1:], self.start, self.step, self.count) if self.prefix else _Positions((), self.start + self.step, self.step, self.count - 1)
            return rest if index.stop is None else _Positions(rest.prefix, rest.start, rest.step, rest.count - 1)
        if index == slice(None, None, 2):
            skip = len(self.prefix) % 2  # the first progression element kept is at an even overall index
            return _Positions(self.prefix[::2], self.start + skip * self.step, 2 * self.step, (self.count - skip + 1) // 2)
        raise TypeError(f"Funnel positions: index {index!r} is not one the position code uses")


@register_patch(
    "dynamo",
    "transformers.models.funnel.modeling_funnel.FunnelAttentionStructure.get_position_embeds",
    "transformers.models.funnel.modeling_funnel.FunnelAttentionStructure.relative_pos",
    loaded_only=True,
)
def _patch_funnel_positions_symbolic(original: Any) -> Any:
    """Funnel's relative-shift position embeddings from a symbolic length: the positions are a
    :class:`_Positions` instead of ``list(range(seq_len))``.

    Pattern: ``get_position_embeds`` builds ``pos = list(range(seq_len))``, pools it per block
    (``stride_pool_pos``: ``[cls] + pos[1:-1][::2]``) and gathers embeddings at
    ``arange(max_dist, min_dist - 1, -stride)`` whose bounds ``relative_pos`` reads from the list's ends
    and length. A Python list of a symbolic length fixes the length ("axes asked to be dynamic ended
    static: input_ids[axis 1]"). With a ``SymInt`` length the patched ``get_position_embeds`` runs the
    same steps on a :class:`_Positions` (``stride_pool_pos`` is transformers' own, which slices it like
    a list) and ``relative_pos`` takes the bounds from its first and last values and size; an int
    length and the factorized attention take transformers' path. Same positions, same embeddings.
    Shapes: returns per block ``[no_pooling, pooling]`` embeddings, each (positions, d_model), the
    first block's ``pooling`` None.
    Models: FunnelModel, FunnelBaseModel and their heads.
    Upstream: transformers models/funnel/modeling_funnel.py (``FunnelAttentionStructure.get_position_embeds``
        keeps the positions as Python lists so that the arange sizes are static under export)
    Remove when: the positions are computed from the length as integers, not as a list.
    """
    if original.__name__ == "relative_pos":

        @functools.wraps(original)
        def relative_pos(self: Any, pos: Any, stride: int, pooled_pos: Any = None, shift: int = 1, device: Any = None) -> torch.Tensor:
            pooled_pos = pos if pooled_pos is None else pooled_pos
            if not isinstance(pos, _Positions) and not isinstance(pooled_pos, _Positions):
                return original(self, pos, stride, pooled_pos, shift, device)
            count = pooled_pos.size() if isinstance(pooled_pos, _Positions) else len(pooled_pos)
            max_dist = pooled_pos[0] - pos[0] + shift * count * stride
            min_dist = pooled_pos[0] - pos[-1]
            return torch.arange(max_dist, min_dist - 1, -stride, dtype=torch.long, device=device)

        return relative_pos

    @functools.wraps(original)
    def get_position_embeds(self: Any, seq_len: Any, dtype: torch.dtype, device: Any) -> Any:
        if not isinstance(seq_len, torch.SymInt) or self.config.attention_type == "factorized":
            return original(self, seq_len, dtype, device)
        d_model = self.config.d_model
        inv_freq = 1 / (10000 ** (torch.arange(d_model // 2, dtype=torch.int64, device=device).to(dtype) / (d_model // 2)))
        # relative distances -2 * seq_len ... 2 * seq_len - 1, row r at distance r - 2 * seq_len
        sinusoid = torch.arange(-seq_len * 2, seq_len * 2, dtype=torch.int64, device=device).to(dtype)[:, None] * inv_freq[None]
        table = torch.cat([self.sin_dropout(torch.sin(sinusoid)), self.cos_dropout(torch.cos(sinusoid))], dim=-1)

        def embeds(distances: torch.Tensor) -> torch.Tensor:
            return torch.gather(table, 0, (distances[:, None] + seq_len * 2).expand(-1, d_model))

        pos = pooled = _Positions((), 0, 1, seq_len)
        blocks = []
        for block_index in range(self.config.num_blocks):
            pooling = None
            if block_index > 0:  # queries pooled, keys not
                pooled = self.stride_pool_pos(pos, block_index)
                pooling = embeds(self.relative_pos(pos, 2 ** (block_index - 1), pooled, shift=2, device=device))
            pos = pooled
            blocks.append([embeds(self.relative_pos(pos, 2**block_index, device=device)), pooling])
        return blocks

    return get_position_embeds


@register_patch("dynamo", "transformers.models.reformer.modeling_reformer.AxialPositionEmbeddings.forward", loaded_only=True)
def _patch_reformer_axial_positions_gathered(original: Any) -> Any:
    """Reformer's axial position embeddings at inference, gathered for the whole batch at once.

    Pattern: at inference the module reads ``position_ids.max().item()`` to cut the axial grid to the
    rows it needs, then selects each sample's positions in a Python loop, ``torch.cat([index_select(
    encodings[i], 0, position_ids[i]) for i in range(batch_size)])``, which fixes the batch size
    (``Eq(s72, 2)``). Row ``p`` of the cut grid, flattened, is cell ``(p // w, p % w)`` of the full
    ``(h, w)`` grid, so the patch concatenates the axial factors over the full grid, flattens it to
    ``(h * w, hidden)`` and indexes it with ``position_ids``: (batch, length, hidden), the same
    vectors. The grid costs ``h * w * hidden`` floats; training (with its dropout) keeps the method.
    Models: ReformerModel (dynamic batch).
    Upstream: transformers models/reformer/modeling_reformer.py (``AxialPositionEmbeddings.forward``); no report found
    Remove when: the module gathers positions with one batched op.
    """

    @functools.wraps(original)
    def forward(self: Any, position_ids: torch.Tensor) -> torch.Tensor:
        if self.training or position_ids.dim() != 2:
            return original(self, position_ids)
        grid = tuple(self.axial_pos_shape)
        factors = [weight.expand(*grid, weight.shape[-1]) for weight in self.weights]
        table = torch.cat(factors, dim=-1).reshape(-1, sum(w.shape[-1] for w in self.weights))
        return table[position_ids]

    return forward


@register_patch(
    "dynamo", "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer.FastSpeech2ConformerRelPositionalEncoding.forward", loaded_only=True
)
def _patch_fastspeech2_relative_table_bounded(original: Any) -> Any:
    """FastSpeech 2's relative positional table used as it is for a symbolic length, with the length
    checked against it at run time.

    Pattern: ``extend_pos_enc`` rebuilds the table when ``pos_enc.size(1) < 2 * length - 1``; after the
    length regulator the decoder's length is data-dependent and the comparison cannot be decided
    (``2*u0 - 1 <= 9999``). For a symbolic length the patch records ``2 * length - 1 <= table length``
    as a runtime check (``torch._check``: 5,000 frames for the model's 9,999-row table) and the
    method takes the table as it is; a longer input fails the check instead of reading past the table.
    Models: FastSpeech2ConformerModel, FastSpeech2ConformerWithHifiGan.
    Upstream: transformers models/fastspeech2_conformer/modeling_fastspeech2_conformer.py
        (``FastSpeech2ConformerRelPositionalEncoding.extend_pos_enc``); no report found
    Remove when: the table is a fixed buffer sliced by length.
    """

    @functools.wraps(original)
    def forward(self: Any, feature_representation: torch.Tensor) -> Any:
        length = feature_representation.size(1)
        if not isinstance(length, int):
            torch._check(length * 2 - 1 <= self.pos_enc.size(1))
        return original(self, feature_representation)

    return forward


@register_patch(
    "dynamo",
    "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer.FastSpeech2ConformerAttention.shift_relative_position_tensor",
    loaded_only=True,
)
def _patch_relative_shift_gathered(original: Any) -> Any:
    """The relative-position shift of conformer attention as one gather instead of pad, view and slice.

    Pattern: scores against relative positions, (batch, heads, T, 2T - 1), are shifted by padding one
    column, viewing the result as (batch, heads, 2T, T), dropping a row and viewing back; the views of
    a slice need the length's strides and, for a data-dependent length, guard on it (``Eq(u0, 1)``).
    Element ``[i, j]`` of the shifted (batch, heads, T, T) scores is ``[i, T - 1 - i + j]`` of the
    input, which the patch gathers with that index: the same values.
    Models: FastSpeech2ConformerModel, FastSpeech2ConformerWithHifiGan.
    Upstream: transformers models/fastspeech2_conformer/modeling_fastspeech2_conformer.py
        (``FastSpeech2ConformerAttention.shift_relative_position_tensor``); no report found
    Remove when: the shift is written as a gather or the view guards are size-oblivious.
    """

    @functools.wraps(original)
    def shift_relative_position_tensor(self: Any, pos_tensor: torch.Tensor) -> torch.Tensor:
        if pos_tensor.dim() != 4:
            return original(self, pos_tensor)
        length, width = pos_tensor.size(2), pos_tensor.size(3)
        if isinstance(length, int) and isinstance(width, int) and width != 2 * length - 1:
            return original(self, pos_tensor)
        rows = torch.arange(length, device=pos_tensor.device)
        index = (length - 1) - rows[:, None] + rows[None, :]  # (T, T), in [0, 2T - 2]
        return pos_tensor.gather(-1, index.expand(*pos_tensor.shape[:2], length, length))

    return shift_relative_position_tensor
