"""Attention-mask builders that cannot be traced as written: model patches (DynamoExporter Stage 2,
applied for every backend).

Pattern: a mask built with Python decisions on sizes or data: transformers' ``masking_utils``
(``torch.vmap`` expansion and its ``__torch_function__`` mode, the ``q_length == 1`` test on
compileable caches, the bidirectional-mask skip refused while exporting) and model-specific masks
(FSMT's ``any()`` branch on padding, CPM-Ant's Python list of positions). Each patch builds the same
mask from broadcast tensor ops.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ...registry import register_patch


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


@register_patch("dynamo", "transformers.masking_utils._ignore_bidirectional_mask_sdpa")
def _patch_skip_bidirectional_mask_without_padding(original: Any) -> Any:
    """Skip a bidirectional mask when no padding mask was given, as eager does, while exporting too.

    Pattern: ``create_bidirectional_mask(attention_mask=None)`` (encoders called without a padding
    mask) returns None in eager: full attention needs no bias. Under ``torch.export``
    transformers never skips, so the traced program builds and adds an all-true (B, 1, Q, K) mask
    that eager never sees. That costs a mask per layer, and it breaks models whose masked branch
    does not match their unmasked one: Autoformer's autocorrelation adds a (B, 1, T, S) mask to
    (B·H, T, channels) weights ("shape '[2, 2, 4, 4]' is invalid for input of size 512"), and
    Informer's ProbSparse attention checks the mask against its sampled query count ("Attention
    mask should be of size (2, 1, 2, 2)"). Without a padding mask and without a local window the
    skip reads no data, only that an argument is None, so the traced program may take it too. A
    padding mask or a local window still goes to transformers' rule.
    Models: AutoformerModel, InformerModel (dynamo and onnx in the sweep, every encoder called
        without a padding mask).
    Upstream: transformers masking_utils ``_ignore_bidirectional_mask_sdpa`` (refuses the skip
        whenever ``is_torchdynamo_exporting()``, even when it would read no tensor; no report found)
    Remove when: transformers skips the mask while exporting when ``padding_mask`` is None.
    """

    def ignore(padding_mask: Any, kv_length: Any, local_attention_size: Any = None) -> bool:
        if padding_mask is None and local_attention_size is None:
            return True
        return original(padding_mask, kv_length, local_attention_size)

    return ignore


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


@register_patch("dynamo", "transformers.models.fsmt.modeling_fsmt.make_padding_mask", loaded_only=True)
def _patch_fsmt_padding_mask_always(_original: Any) -> Any:
    """FSMT's padding mask is always a tensor, also when no token is padding.

    Pattern: ``if not padding_mask.any(): padding_mask = None`` branches on the token ids
    ("Could not guard on data-dependent expression Eq(u0, 1)"). An all-False key padding mask masks
    nothing (``masked_fill`` with it is the identity), so the mask without the branch gives the same
    attention weights for every input.
    Models: FSMTModel, FSMTForConditionalGeneration.
    Upstream: transformers models/fsmt/modeling_fsmt.py (``make_padding_mask``);
        pytorch/pytorch#125180 (data-dependent control flow under export)
    Remove when: FSMT builds its padding mask without the ``any()`` branch.
    """

    def make_padding_mask(input_ids: torch.Tensor, padding_idx: int = 1) -> torch.Tensor:
        # input_ids (batch, length) -> (batch, length) bool, True at padding tokens
        return input_ids.eq(padding_idx)

    return make_padding_mask


@register_patch("dynamo", "transformers.models.cpmant.modeling_cpmant.CpmAntModel._prepare_attention_mask", loaded_only=True)
def _patch_cpmant_mask_positions_from_arange(_original: Any) -> Any:
    """CPM-Ant's attention mask with the left-padding positions from ``torch.arange`` instead of a
    Python list over the sequence.

    Pattern: ``torch.tensor(list(range(seqlen - self.prompt_length))[::-1])``: building the list reads
    the symbolic length as an int and fixes it ("axes asked to be dynamic ended static:
    input_ids[axis 1]"). ``arange`` counting down gives the same positions; the rest of the mask
    (causal within a context, same span only, left padding by ``length``) is the method's own.
    Shapes: ``input_ids``, ``span``, ``context`` (batch, length); ``length`` (batch,). Returns the
    (batch, length, length) mask in ``context``'s dtype (int32 from the model), as the method does.
    Models: CpmAntModel, CpmAntForCausalLM.
    Upstream: transformers models/cpmant/modeling_cpmant.py (``CpmAntModel._prepare_attention_mask``);
        no report found
    Remove when: the method builds the positions with ``torch.arange``.
    """

    def _prepare_attention_mask(
        self: Any, input_ids: torch.Tensor, span: torch.Tensor, context: torch.Tensor, length: torch.Tensor
    ) -> torch.Tensor:
        batch, seqlen = input_ids.shape[:2]
        positions = torch.arange(seqlen, device=input_ids.device)
        causal = positions[None, :] <= positions[:, None]
        mask = context[:, None, :] | (context[:, :, None].logical_not() & causal[None])
        mask = mask & (span[:, None, :] == span[:, :, None])
        # left padding: prompt positions always count, then positions seqlen - prompt - 1 ... 0 against length
        from_end = torch.arange(seqlen - self.prompt_length - 1, -1, -1, device=input_ids.device)
        kept = torch.cat((torch.ones(batch, self.prompt_length, dtype=torch.bool, device=input_ids.device), from_end[None, :] < length[:, None]), dim=1)
        return kept[:, :, None] & kept[:, None, :] & mask

    return _prepare_attention_mask
