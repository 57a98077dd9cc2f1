"""DynamoExporter Stage 2: model patches (``register_patch("dynamo", ...)``).

These run for every backend: the ONNX and ExecuTorch exporters trace through DynamoExporter.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ...registry import register_patch


def _export_safe_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    position_bias: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA attention with the same numbers as transformers' ``sdpa_attention_forward`` and no Python
    branch on a sequence length.

    Shapes: ``query`` (batch, heads, q_len, head_dim); ``key``/``value`` (batch, kv_heads, kv_len, head_dim);
    ``attention_mask`` broadcastable to (batch, heads, q_len, kv_len), boolean (True = attend) or additive
    float. Returns (batch, q_len, heads, head_dim) and no attention weights.

    transformers decides ``is_causal`` with ``q_len > 1 and mask is None and causal``: with a symbolic
    ``q_len`` that guards the length (a prefill graph then refuses one token, a decode graph refuses
    more) or leaves a ``SymBool`` that SDPA refuses. Here causality without a mask is an explicit
    boolean mask, with eager's semantics: one query token sees every key; several see keys up to their
    own index (eager crops the keys to ``q_len`` there).
    """
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q_len, kv_len = query.shape[2], key.shape[2]
    mask = attention_mask
    if mask is None and causal:
        q_pos = torch.arange(q_len, device=query.device)
        k_pos = torch.arange(kv_len, device=query.device)
        single_token = q_pos[-1:] == 0  # (1,), True when q_len == 1, without a guard on q_len
        mask = ((k_pos[None, :] <= q_pos[:, None]) | single_token)[None, None]
    if position_bias is not None:
        if mask is None:
            mask = position_bias
        elif mask.dtype == torch.bool:
            mask = torch.where(mask, position_bias, torch.finfo(key.dtype).min)
        else:
            mask = position_bias + mask
    # the module's own group count is a Python int; dividing the head counts would give a symbolic
    # one when a cache's head axis was traced as dynamic, which the ONNX SDPA lowering cannot take
    groups = getattr(module, "num_key_value_groups", None) or query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=False
    )
    return out.transpose(1, 2).contiguous(), None


@register_patch("dynamo", "transformers.modeling_utils.AttentionInterface._global_mapping")
def _patch_sdpa_attention(original: dict[str, Any]) -> dict[str, Any]:
    """Route ``attn_implementation="sdpa"`` through :func:`_export_safe_sdpa` while tracing.

    Pattern: ``is_causal = q_length > 1 and attention_mask is None and is_causal`` in transformers'
    SDPA integration. With a symbolic query length this adds the guard ``q_len > 1`` (a prefill export
    refuses a one-token input, H7) or returns a ``SymBool`` that ``scaled_dot_product_attention``
    rejects (``argument 'is_causal' must be bool, not SymBool``, decode with a filled cache, H3).
    Known to hit: every model using the ``sdpa`` attention interface (BERT, Llama, Mistral, Qwen, ...).
    Upstream: huggingface/transformers#46196 (a note in integrations/sdpa_attention.py leaves the
    condition to the exporter side); pytorch/pytorch#150842 (0/1 specialisation).
    Remove when: transformers computes ``is_causal`` without a Python ``and`` on the query length.
    """
    return {**original, "sdpa": _export_safe_sdpa}


@register_patch(
    "dynamo",
    "transformers.cache_utils.Cache.is_compileable",
    "transformers.cache_utils.EncoderDecoderCache.is_compileable",
)
def _patch_cache_is_compileable(_original: Any) -> property:
    """Report caches as not compileable while tracing, so the mask builders do not test ``q_length == 1``.

    Pattern: ``allow_is_causal_skip and not (cache.is_compileable and q_length == 1)`` in
    ``transformers.masking_utils`` (causal, sliding and chunked mask builders). With a ``StaticCache``
    (compileable) and a symbolic query length, the comparison guards the length, so a graph exported
    with one token refuses four (H15). Under ``torch.export`` the mask is never skipped anyway
    (``_ignore_causal_mask_sdpa`` returns False while exporting), so the answer changes nothing else.
    Known to hit: every decoder given a ``StaticCache`` or ``HybridCache`` (Llama, Gemma, Qwen, ...).
    Upstream: pytorch/pytorch#152465 (StaticCache with dynamic shapes); the check lives in
    transformers masking_utils.create_causal_mask.
    Remove when: transformers skips the ``q_length == 1`` test while exporting.
    """
    return property(lambda self: False)


@register_patch("dynamo", "torch.nn.Module.to")
def _patch_module_to_noop(original: Any) -> Any:
    """Return the module itself from ``Module.to(...)`` when no parameter or buffer would change.

    Pattern: a forward that casts a submodule on every call (``self.classifier =
    self.classifier.to(self.dtype)`` in SwitchTransformers' router). While tracing, the parameters are
    fake tensors and ``Module._apply`` tries to swap each one for its cast copy, which fails with
    "_apply(): Couldn't swap Linear.weight" even when the dtype and device are already the requested
    ones. When every floating-point parameter and buffer already has the requested dtype and every
    tensor the requested device, ``to`` changes nothing in eager, so returning the module is the same
    module; any real cast or move still goes to ``Module.to``.
    Models: SwitchTransformersModel, SwitchTransformersForConditionalGeneration.
    Upstream: pytorch/pytorch ``torch/nn/modules/module.py`` ``_apply`` with ``swap_tensors`` on fake
        parameters (no report found); model-side, casting a submodule inside forward
    Remove when: transformers casts the router once at init, or ``_apply`` skips unchanged tensors.
    """

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if memory_format is not None:
            return original(self, *args, **kwargs)
        for tensor in (*self.parameters(), *self.buffers()):
            if device is not None and tensor.device != device:
                return original(self, *args, **kwargs)
            if dtype is not None and (tensor.is_floating_point() or tensor.is_complex()) and tensor.dtype != dtype:
                return original(self, *args, **kwargs)
        return self

    return to


@register_patch("dynamo", "transformers.masking_utils._vmap_expansion_sdpa")
def _patch_mask_expansion_by_broadcast(_original: Any) -> Any:
    """Build attention masks from broadcast index grids instead of four nested ``torch.vmap`` calls.

    Pattern: ``sdpa_mask`` expands a mask function with ``torch.vmap`` over (batch, head, query, key)
    whenever the model passes an ``or_mask_function``/``and_mask_function`` (sliding windows in
    bidirectional masks, image-token blocks, chunked attention). ``torch.export`` records the vmap as
    ``_add_batch_dim`` nodes; ``ExportedProgram.run_decompositions``, which torch.onnx and
    ``to_edge`` both run, re-traces them outside any vmap level and fails with "Either your tensor may
    have escaped from inside a function being vmapped ... gen_vmap_plumbing" (on ``aten.new_ones``).
    The replacement calls the mask function once on index tensors shaped (B,1,1,1), (1,H,1,1),
    (1,1,Q,1) and (1,1,1,K), which broadcast to the same boolean (B, H, Q, K) mask; every mask
    function in transformers is written in such elementwise index arithmetic and indexing.
    Models: T5Gemma2Model, NemotronAsrStreamingEncoder, UnlimitedOcrModel (onnx static in the sweep).
    Upstream: pytorch/pytorch#153063 (torch.export of ``torch.func.vmap``, open); pre-dispatch export
    records vmap as ``_add_batch_dim``/``_remove_batch_dim`` nodes since pytorch/pytorch#154650, which
    the later re-trace does not replay under a vmap level. The vmap path is transformers' choice in
    ``masking_utils.sdpa_mask(use_vmap=True)``.
    Remove when: ``run_decompositions`` re-traces programs that hold vmapped regions, or transformers
    stops choosing vmap for combined mask functions.
    """

    def expand(mask_function: Any) -> Any:
        def full_mask(batch: Any, head: Any, query: Any, key: Any) -> Any:
            grid = (batch.reshape(-1, 1, 1, 1), head.reshape(1, -1, 1, 1), query.reshape(1, 1, -1, 1), key.reshape(1, 1, 1, -1))
            return mask_function(*grid).expand(batch.shape[0], head.shape[0], query.shape[0], key.shape[0])

        return full_mask

    return expand


@register_patch("dynamo", "transformers.masking_utils.TransformGetItemToIndex")
def _patch_mask_index_mode_off(_original: Any) -> Any:
    """Build the vmap-path masks without ``TransformGetItemToIndex``, a ``__torch_function__`` mode.

    Pattern: ``sdpa_mask(use_vmap=True)`` wraps the mask expansion in ``TransformGetItemToIndex()``, which
    routes ``tensor[index_tensor]`` inside mask functions through a wrapped higher-order op; the trace
    keeps it as ``higher_order.flat_apply``, which ``torch.export.save`` cannot write ("SerializeError:
    Failed serializing node flat_apply"). The mode exists so that indexing by a 0-d tensor works under
    ``vmap``; with :func:`_patch_mask_expansion_by_broadcast` the mask functions index with ordinary
    broadcast index tensors, which plain advanced indexing handles with the same values.
    Models: T5Gemma2Model, UnlimitedOcrModel (dynamo in the sweep: the .pt2 could not be saved).
    Upstream: torch/_dynamo/_trace_wrapped_higher_order_op.py (``flat_apply`` has no serializer in
        torch 2.13; no report found); transformers masking_utils.sdpa_mask enters the mode
    Remove when: torch.export serialises ``flat_apply``, or the broadcast patch above is removed.
    """
    return contextlib.nullcontext
