"""XNNPACK partitions: attention and LayerNorm decomposed into ops XNNPACK's partitioner claims.

Pattern: ExecuTorch's lowering decomposes ``scaled_dot_product_attention`` with torch's math
decomposition (a 4-D ``matmul``, which becomes ``expand_copy`` + ``view_copy`` + ``bmm``; ``mul.Scalar``
for the scale; a guard for rows whose every key is masked: ``eq(-inf)``, ``logical_not``, ``any``,
``where``) and keeps ``native_layer_norm``. XNNPACK 1.4.1 claims none of ``expand_copy``,
``mul.Scalar``, ``where``, ``any``, ``logical_not`` or ``native_layer_norm``, so every attention
block and every LayerNorm ends an XNNPACK partition: all-MiniLM-L6-v2 lowered as 26 partitions
(static shapes) with portable kernels and copies between them, which made the ``.pte`` slower than
eager PyTorch and its lowering slow (XNNPACK's ``preprocess`` runs once per partition).

Here the decomposition table ExecuTorch's lowering uses gets two entries, for the XNNPACK recipe and
static shapes only (with dynamic batch and sequence, XNNPACK claims no view with two symbolic sizes, so
the model's own head reshapes split the graph whatever the attention becomes):

- ``scaled_dot_product_attention`` over 4-D inputs with a boolean mask or none: ``bmm`` over
  ``(batch * heads, length, head_dim)`` views, an additive bias ``where(mask, 0, finfo.min)`` and a
  keep factor ``any(mask, -1)`` computed from the mask alone (so they sit outside the partition
  without splitting it), ``softmax(scores + bias) * keep`` (a row with every key masked is 0, as torch's
  guard makes it). Float masks, causal flags, dropout and grouped-query broadcasting keep torch's
  decomposition.
- ``native_layer_norm`` over the last axis of a 3-D float32 input: the statistics as XNNPACK's
  ``mean.dim`` over a trailing singleton axis (a 4-D global average pooling), then ``sub``, ``mul``,
  ``rsqrt``, ``add``.
- ``select`` of a float32 tensor (a pooler's first token): ``slice_copy`` and a static ``view``.

Models: every encoder with LayerNorm and SDPA attention (BertModel, all-MiniLM-L6-v2, RoBERTa,
DistilBERT, ...) and decoders with boolean SDPA masks, on ``--backend executorch --recipe xnnpack``.
Upstream: pytorch/executorch backends/xnnpack/partition/config/generic_node_configs.py has no
LayerNorm, ``where`` or ``expand_copy`` config and claims ``mean.dim`` over 4-D inputs only;
torch/_decomp ``_scaled_dot_product_attention_math`` decomposes a 4-D matmul with ``expand``.
Remove when: XNNPACK's partitioner claims ``native_layer_norm`` and ExecuTorch lowers SDPA to XNNPACK
ops (or a fused SDPA kernel of XNNPACK's).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...registry import register_patch

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_LAYER_NORM = torch.ops.aten.native_layer_norm.default
_SELECT = torch.ops.aten.select.int
_MEAN = torch.ops.aten.mean.dim
_UNSQUEEZE = torch.ops.aten.unsqueeze.default
_ALIAS = torch.ops.aten.alias.default
_CAT = torch.ops.aten.cat.default


def _symbolic(*tensors: torch.Tensor | None) -> bool:
    return any(isinstance(size, torch.SymInt) for t in tensors if t is not None for size in t.shape)


def attention_for_xnnpack(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """``scaled_dot_product_attention`` of ``query (B, H, L, E)``, ``key (B, H, S, E)``, ``value (B, H, S, Ev)``
    and a boolean ``attn_mask`` broadcastable to ``(B, H, L, S)`` (True: attend), as ``bmm``, ``softmax``,
    ``add`` and ``mul``; returns ``(B, H, L, Ev)``. Other ranks, float masks, ``is_causal``, dropout,
    symbolic sizes and key/value with other head counts get torch's own decomposition (the op's
    composite implementation), as without this table entry."""
    handled = attention_is_rewritten(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    flash = _torch_picks_flash(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if not handled:
        return _torch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, flash)
    batch, heads, length, dim = query.shape
    keys, value_dim = key.shape[2], value.shape[3]
    groups = _groups(query, key, enable_gqa)  # query heads per key/value head (1 without grouping)
    kv_heads = heads // groups
    factor = scale if scale is not None else 1.0 / math.sqrt(dim)
    # query heads h = g * groups + j share key/value head g: the (groups, length) rows of a group go
    # through one bmm with that head's keys, so key and value are never repeated
    q = query.reshape(batch * kv_heads, groups * length, dim)
    k = key.reshape(batch * kv_heads, keys, dim).transpose(1, 2)
    scores = torch.bmm(q, k).view(batch, heads, length, keys) * factor
    if attn_mask is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        bias = torch.where(attn_mask, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
        keep = attn_mask.any(dim=-1, keepdim=True).to(query.dtype)
        weights = torch.softmax(scores + bias, dim=-1) * keep
    probabilities = weights.reshape(batch * kv_heads, groups * length, keys)
    out = torch.bmm(probabilities, value.reshape(batch * kv_heads, keys, value_dim)).view(batch, heads, length, value_dim)
    if not flash:
        return out  # torch's math kernel: a contiguous (B, H, L, Ev)
    # torch's CPU flash-attention kernel returns (B, H, L, Ev) laid out as (L, B, H, Ev), and the traced
    # graph may view its permuted output on that layout (torch/_decomp keeps it the same way)
    return out.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)


def attention_is_rewritten(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> bool:
    """Whether :func:`attention_for_xnnpack` rewrites these inputs (else torch's own decomposition runs):
    static 4-D float32 inputs, a boolean 4-D mask or none, no dropout or causal flag, and key/value with
    the query's head count or, with ``enable_gqa``, a divisor of it."""
    handled = not (dropout_p or is_causal or query.dim() != 4 or key.dim() != 4 or value.dim() != 4)
    handled = handled and not _symbolic(query, key, value, attn_mask)  # XNNPACK claims no view with two symbolic sizes
    handled = handled and query.dtype == torch.float32 and key.shape[:2] == value.shape[:2]
    handled = handled and key.shape[0] == query.shape[0] and _groups(query, key, enable_gqa) is not None
    return handled and (attn_mask is None or (attn_mask.dtype == torch.bool and attn_mask.dim() == 4))


def _groups(query: torch.Tensor, key: torch.Tensor, enable_gqa: bool) -> int | None:
    """Query heads per key/value head: 1 when the head counts are equal, ``H // Hkv`` for grouped-query
    attention (``enable_gqa`` and ``Hkv`` dividing ``H``), None otherwise."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads == kv_heads:
        return 1
    if enable_gqa and kv_heads and heads % kv_heads == 0:
        return heads // kv_heads
    return None


def _torch_picks_flash(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any, dropout_p: float, is_causal: bool, scale: Any, enable_gqa: bool
) -> bool:
    """Whether the traced graph ran these inputs through torch's CPU flash-attention kernel (pre-dispatch
    export does for 4-D inputs, no dropout and one head size; torch's own decomposition of that kernel
    keeps its output layout)."""
    return query.dim() == 4 and key.dim() == 4 and value.dim() == 4 and not dropout_p and query.shape[3] == key.shape[3] == value.shape[3]


def _torch_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Any,
    dropout_p: float,
    is_causal: bool,
    scale: Any,
    enable_gqa: bool,
    flash: bool,
) -> torch.Tensor:
    """What ``scaled_dot_product_attention``'s composite implementation does on CPU: a boolean mask
    made additive, then the flash-attention or the math kernel (each decomposed further by the table).
    Returning ``NotImplemented`` instead would leave the op itself in the graph, which the edge dialect refuses."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
    if flash:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
        )[0]
    return torch.ops.aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


def layer_norm_for_xnnpack(
    input: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> Any:
    """``native_layer_norm`` of a 3-D float32 ``input (B, S, H)`` over its last axis: ``(output, mean, rstd)``
    with ``mean`` and ``rstd`` of shape ``(B, S, 1)``; ``NotImplemented`` otherwise."""
    if len(normalized_shape) != 1 or input.dim() != 3 or input.dtype != torch.float32 or _symbolic(input):
        return NotImplemented
    wide = input.unsqueeze(-1)  # (B, S, H, 1): XNNPACK's mean.dim averages the two innermost axes of 4-D
    mean = wide.mean(dim=[2, 3], keepdim=True)
    centred = wide - mean
    variance = (centred * centred).mean(dim=[2, 3], keepdim=True)
    rstd = torch.rsqrt(variance + eps)
    out = (centred * rstd).view(input.shape)  # a static view XNNPACK claims (squeeze_copy it does not)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean.squeeze(-1), rstd.squeeze(-1)


def select_for_xnnpack(input: torch.Tensor, dim: int, index: int) -> Any:
    """``select`` of a static float32 tensor as ``slice_copy`` and a static ``view``, both of which XNNPACK
    claims (``select_copy`` it does not: BERT's pooler reads the first token with ``[:, 0]``)."""
    if input.dtype != torch.float32 or _symbolic(input) or not isinstance(index, int) or input.dim() < 2:
        return NotImplemented
    axis = dim % input.dim()
    start = index % input.shape[axis]
    shape = [size for i, size in enumerate(input.shape) if i != axis]
    return torch.ops.aten.slice.Tensor(input, axis, start, start + 1).view(shape)


def _static_float(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 for t in tensors) and not _symbolic(*tensors)


def mean_for_xnnpack(input: torch.Tensor, dim: Any, keepdim: bool = False, dtype: Any = None) -> Any:
    """``mean`` of a static 3-D float32 ``input (B, S, H)`` over its last axis (an RMSNorm's
    ``x.pow(2).mean(-1, keepdim=True)``) as XNNPACK's 4-D ``mean.dim`` over a trailing singleton axis and
    a static view; ``NotImplemented`` otherwise (4-D means are XNNPACK's own)."""
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    if input.dim() != 3 or dtype is not None or not _static_float(input) or [d % 3 for d in dims] != [2]:
        return NotImplemented
    batch, length, _ = input.shape
    pooled = input.unsqueeze(-1).mean(dim=[2, 3], keepdim=True)  # (B, S, 1, 1)
    return pooled.view(batch, length, 1) if keepdim else pooled.view(batch, length)


def unsqueeze_for_xnnpack(input: torch.Tensor, dim: int) -> Any:
    """``unsqueeze`` of a static float32 tensor at an inner axis as a static ``view`` (XNNPACK claims
    ``unsqueeze_copy`` only at the last axis: rotary tables' ``cos.unsqueeze(1)``); ``NotImplemented``
    for the last axis and for other tensors."""
    axis = dim % (input.dim() + 1)
    if axis == input.dim() or not _static_float(input):
        return NotImplemented
    shape = list(input.shape)
    shape.insert(axis, 1)
    return torch.ops.aten.view.default(input, shape)


def alias_for_xnnpack(input: torch.Tensor) -> Any:
    """``alias`` of a static float32 tensor (``hidden[:, slice(0, None)]`` before an LM head) as a static
    same-shape ``view``, which XNNPACK claims (``alias_copy`` it does not)."""
    if not _static_float(input) or input.dim() == 0:
        return NotImplemented
    return torch.ops.aten.view.default(input, list(input.shape))


def cat_for_xnnpack(tensors: list[torch.Tensor], dim: int = 0) -> Any:
    """``cat`` of static float32 tensors with empty inputs dropped and a tensor given twice copied, so that
    XNNPACK's concatenation (two or more distinct inputs) claims it: a cache update ``cat([past, new])``
    with an empty past becomes a copy of ``new``, a rotary table's ``cat((freqs, freqs))`` a concatenation
    of two nodes. ``NotImplemented`` when there is nothing to change or a tensor is not static float32."""
    if not tensors or not _static_float(*tensors):
        return NotImplemented
    kept = [t for t in tensors if t.numel() > 0]
    if not kept:
        return NotImplemented
    if len(kept) == 1:
        return kept[0].clone() if len(tensors) > 1 else NotImplemented
    distinct: list[torch.Tensor] = []
    for tensor in kept:
        distinct.append(tensor.clone() if any(tensor is seen for seen in distinct) else tensor)
    if len(kept) == len(tensors) and all(a is b for a, b in zip(distinct, tensors)):
        return NotImplemented
    return torch.cat(distinct, dim)


@register_patch("executorch.xnnpack", "executorch.exir.program._program._default_decomposition_table", stage="Stage 3: ExecuTorch patches")
def _patch_xnnpack_decoder_decompositions(original: Any) -> Any:
    """Add :func:`mean_for_xnnpack`, :func:`unsqueeze_for_xnnpack`, :func:`alias_for_xnnpack` and
    :func:`cat_for_xnnpack` to the decomposition table ExecuTorch's lowering uses, for static shapes.

    Pattern: a decoder layer stack (Llama's) split at every RMSNorm (``mean`` over the last axis of a 3-D
    tensor: XNNPACK's ``mean.dim`` takes 4-D inputs only), at the rotary tables' ``unsqueeze(1)``
    (XNNPACK's ``unsqueeze_copy`` is claimed at the last axis only), at ``cat((freqs, freqs))`` (the
    concatenation config counts distinct input nodes: one), at each cache update ``cat([past, new])``
    with an empty past (one input after the empty one is dropped) and at the ``alias`` before the LM
    head: a tiny 2-layer Llama lowered as 10 XNNPACK partitions (static shapes), a 100M one as 28.
    Each gets an equivalent form XNNPACK claims: a 4-D mean over a trailing singleton axis, a static
    view, a copy of the repeated or lone input.
    Models: LlamaForCausalLM and the decoders sharing its RMSNorm and rotary code (Mistral, Qwen2,
        Gemma, ...), on ``--backend executorch --recipe xnnpack`` with static shapes.
    Upstream: pytorch/executorch backends/xnnpack/partition/config/generic_node_configs.py
        (``MeanDimConfig`` takes 4-D inputs only, ``UnsqueezeCopyConfig`` the last axis only, ``CatConfig``
        counts ``node.all_input_nodes``; no ``alias_copy`` config)
    Remove when: XNNPACK's partitioner claims those forms itself.
    """

    def table(*args: Any, **kwargs: Any) -> Any:
        decompositions = dict(original(*args, **kwargs))
        decompositions[_MEAN] = mean_for_xnnpack
        decompositions[_UNSQUEEZE] = unsqueeze_for_xnnpack
        decompositions[_ALIAS] = alias_for_xnnpack
        decompositions[_CAT] = cat_for_xnnpack
        return decompositions

    return table


@register_patch("executorch.xnnpack", "executorch.exir.program._program._default_decomposition_table", stage="Stage 3: ExecuTorch patches")
def _patch_xnnpack_attention_and_layer_norm_decompositions(original: Any) -> Any:
    """Add :func:`attention_for_xnnpack`, :func:`layer_norm_for_xnnpack` and :func:`select_for_xnnpack` to
    the decomposition table ExecuTorch's lowering uses, for static shapes.

    Pattern: SDPA, LayerNorm and a first-token ``select`` each end an XNNPACK partition (torch's SDPA
    decomposition leaves ``expand_copy``, ``mul.Scalar``, ``where``, ``any``; XNNPACK has no LayerNorm
    or ``select_copy`` config); see the module docstring.
    Models: BertModel and every encoder with LayerNorm and SDPA attention (all-MiniLM-L6-v2: 26 XNNPACK
    partitions before, 2 after, static shapes).
    Upstream: pytorch/executorch backends/xnnpack/partition/config/generic_node_configs.py (no LayerNorm,
        ``where``, ``expand_copy`` or ``select_copy`` config; ``mean.dim`` over 4-D only); torch/_decomp
        ``_scaled_dot_product_attention_math`` (a 4-D matmul through ``expand``)
    Remove when: XNNPACK's partitioner claims ``native_layer_norm`` and the ops of torch's SDPA decomposition.
    """

    def table(*args: Any, **kwargs: Any) -> Any:
        decompositions = dict(original(*args, **kwargs))
        decompositions[_SDPA] = attention_for_xnnpack
        decompositions[_LAYER_NORM] = layer_norm_for_xnnpack
        decompositions[_SELECT] = select_for_xnnpack
        return decompositions

    return table
