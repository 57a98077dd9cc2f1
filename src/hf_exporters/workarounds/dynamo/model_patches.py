"""DynamoExporter Stage 2: model patches (``register_patch("dynamo", ...)``).

These run for every backend: the ONNX and ExecuTorch exporters trace through DynamoExporter.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from typing import Any

import torch
from torch import nn

from ...registry import register_patch
from .._packing import slice_index


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
    own index (eager crops the keys to ``q_len`` there). A CPU call whose sizes were read from data is
    recorded as SDPA's math kernel (:func:`_has_data_dependent_sizes`), which adds its mask: a boolean
    mask reaches it as 0 / -inf, the conversion SDPA itself makes.
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
    if _has_data_dependent_sizes(query, key, mask):
        if mask is not None and mask.dtype == torch.bool:
            # the math kernel adds its mask: a boolean one becomes 0 / -inf first, as SDPA itself does
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill(~mask, float("-inf"))
        out = torch.ops.aten._scaled_dot_product_attention_math(query, key, value, mask, dropout, False, scale=scaling)[0]
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=False
        )
    return out.transpose(1, 2).contiguous(), None


def _has_data_dependent_sizes(*tensors: torch.Tensor | None) -> bool:
    """Whether a CPU tensor among ``tensors`` has a size read from data (an unbacked symbol).

    Such an SDPA call is recorded as SDPA's math kernel itself. CPU SDPA picks its kernel by
    comparing sizes (the flash kernel's checks compare the mask's key axis with the keys', and the
    batch with 1), which with a size read from data fails the trace with "Could not guard on
    data-dependent expression Eq(u0*u1, 4)" (SAM 3's mask over image tokens counted from the data),
    and would fail again in every later ``run_decompositions`` (ONNX, ExecuTorch) if the generic op
    were recorded. The math kernel makes no such choice. Programs whose sizes are all known keep
    the generic op and its kernel choice.
    Upstream: pytorch/pytorch#180202 (CPU SDPA guards on Eq(batch, 1))
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return any(
        t is not None and t.device.type == "cpu" and any(isinstance(d, torch.SymInt) and free_unbacked_symbols(d) for d in t.shape)
        for t in tensors
    )


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
    return {**original, "sdpa": _export_safe_sdpa, _VARLEN_IMPLEMENTATION: _block_diagonal_sdpa}


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


@register_patch("dynamo", "torch.fx.experimental.symbolic_shapes.DimConstraints.solve")
def _patch_dim_constraints_skip_unsolvable(original: Any) -> Any:
    """Let a dynamic export finish when torch's constraint solver meets a guard sympy cannot solve.

    Pattern: a dynamic export whose guards include an equality with floor divisions, such as a
    dynamic image side that must split into whole patches or windows (``Eq(-x/8 + 4*((x/8)//4), 0)``:
    the side is a multiple of 32). After the trace, ``DimConstraints.solve`` hands each symbol's
    equalities to sympy's ``reduce_inequalities`` to turn them into specialisations; sympy raises
    ``NotImplementedError`` ("cannot be solved using solve_univariate_inequality") and the export
    fails, although the guard is a divisibility, not a specialisation. The solve only builds the
    suggested-fixes message and the list of forced specialisations, so when sympy gives up the patch
    logs it and keeps what the solve found so far; the program's own guards and runtime asserts are
    unchanged, and an axis that really ended static is still reported by
    :func:`~hf_exporters.shapes.static_axes` (the exporter's warning, the sweep's failure).
    Models: MobileViTV2Model, EfficientLoFTRModel (dynamic in the sweep).
    Upstream: pytorch/pytorch#131897 (the solver fails on guards with floor division and rounding)
    Remove when: torch's ``DimConstraints.solve`` catches ``NotImplementedError`` for equalities as it
        does for inequalities.
    """
    import logging

    log = logging.getLogger("hf_exporters.dynamo")

    def solve(self: Any) -> None:
        try:
            return original(self)
        except NotImplementedError as error:
            if "cannot be solved" not in str(error):
                raise
            log.info("torch's constraint solver gave up on a guard sympy cannot solve: %s", " ".join(str(error).split()))
            return None

    return functools.wraps(original)(solve)


def _cancel_common_factor(expr: Any) -> Any | None:
    """``expr``, a quotient ``base / gcd`` of integer size expressions, with the factor cancelled term
    by term, or None when a term keeps a denominator (the factor did not divide it).

    A product over a sum is distributed at the top level only (``(g*a + g*b) / g`` -> ``a + b``);
    sympy's own product rules cancel ``g`` in each term. Nested expressions (floor divisions inside the
    terms) are left as they are: they were reduced when they were built.
    """
    import sympy

    distributed = sympy.expand_mul(expr, deep=False) if expr.is_Mul else expr
    for term in sympy.Add.make_args(distributed):
        for factor in sympy.Mul.make_args(term):
            if factor.is_Rational and not factor.is_Integer:
                return None
            if factor.is_Pow and factor.exp.is_negative is not False:
                return None
    return distributed


@register_patch("onnx", "torch.utils._sympy.functions.sympy")
@register_patch("dynamo", "torch.utils._sympy.functions.sympy")
def _patch_floordiv_cancels_without_simplify(original: Any) -> Any:
    """Reduce a floor division by a common factor without calling ``sympy.simplify``.

    Pattern: a dynamic export of a model that pads to whole windows or patches at every stage (Swin,
    Donut-Swin, Swin2SR, SAM 2's Hiera, MaskFormer's Swin backbone). Each stage's sizes nest the last
    stage's (``((((x//4) + 1)//2) + 1)//2`` plus ``Mod``/``Min`` terms of the padding). Building
    ``FloorDiv(base, divisor)`` with a common factor ``g`` in ``torch.utils._sympy.functions`` returns
    ``FloorDiv(sympy.simplify(base / g), sympy.simplify(divisor / g))``, and ``sympy.simplify`` over
    these nested expressions takes 10-25 s per call (SwinModel: 5 calls, 56 s of a 138 s trace, and
    as much again in the ONNX lowering's decompositions); SwinModel timed out at 150 s on ONNX with a
    dynamic image side. The quotient only needs ``g`` cancelled, which sympy's product rules do term
    by term (:func:`_cancel_common_factor`), so the patch hands that module a copy of ``sympy`` whose
    ``simplify`` does so and calls the full ``sympy.simplify`` only when a term keeps a denominator.
    The floor division's value is unchanged: ``floor(base / divisor)`` is the same whichever common
    factor is cancelled. The module's other ``sympy`` names are the real ones. Installed for the
    trace (dynamo scope) and the ONNX lowering's decompositions (onnx scope); the ExecuTorch
    lowering's re-trace and ``torch.export.load`` still take the full simplify.
    Models: SwinModel, DonutSwinModel, Swin2SRModel, Sam2HieraDetModel, Sam2VisionModel,
    MaskFormerSwinModel (dynamic in the sweep).
    Upstream: pytorch/pytorch#134133 (sympy in ``FloorDiv.eval`` blows up on large sums; the fix
        there covers ``sympy.gcd``, not the ``sympy.simplify`` that follows it)
    Remove when: ``FloorDiv.eval`` cancels the common factor without ``sympy.simplify``.
    """
    import types

    full_simplify = original.simplify
    copy = types.ModuleType(original.__name__, original.__doc__)
    copy.__dict__.update(original.__dict__)

    def simplify(expr: Any, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs and isinstance(expr, original.Expr):
            cancelled = _cancel_common_factor(expr)
            if cancelled is not None:
                return cancelled
        return full_simplify(expr, *args, **kwargs)

    copy.simplify = functools.wraps(full_simplify)(simplify)
    return copy


@register_patch(
    "dynamo",
    "transformers.models.cosmos3_edge.modeling_cosmos3_edge.Cosmos3EdgeVisionEmbeddings.resize_positional_embeddings",
    loaded_only=True,
)
def _patch_cosmos3_edge_grid_sides_checked(original: Any) -> Any:
    """Cosmos3 Edge's per-image position-grid resize, with each image's grid sides stated to be whole
    multiples of the merge size.

    Pattern: ``for t, h, w in grid_thw.tolist()`` resizes the learned grid to ``(h, w)`` and then views it
    as ``(h // m, m, w // m, m, -1)`` blocks (``m = spatial_merge_size``). With ``h``, ``w`` read from the
    data, the trace stops on the resize's size checks ("Could not guard on data-dependent expression
    u1 > 0") and then on the ``-1`` of the block view. The image processor makes every side a positive
    multiple of ``m`` (the projector merges ``m x m`` patches); ``torch._check`` states that (and
    ``t >= 0``) before the same resize, block reorder and repeat over frames, image after image. A grid
    that breaks it fails with a message naming the side, where eager may still reshape it. Positions
    are unchanged: (sum of t*h*w, hidden) in the patches' order.
    Models: Cosmos3EdgeVisionModel.
    Upstream: transformers models/cosmos3_edge/modeling_cosmos3_edge.py
        (``Cosmos3EdgeVisionEmbeddings.resize_positional_embeddings``); pytorch/pytorch#125180
    Remove when: the model checks the grid with ``torch_compilable_check`` before the resize.
    """
    import torch.nn.functional as F  # noqa: N812 - torch's usual alias

    def resize_positional_embeddings(positional_embeddings: torch.Tensor, grid_thw: torch.Tensor, spatial_merge_size: int) -> torch.Tensor:
        # positional_embeddings (side, side, hidden) -> (1, hidden, side, side), resized in float32 (CPU antialias)
        grid = positional_embeddings.permute(2, 0, 1).unsqueeze(0)
        dtype = grid.dtype
        if grid.device.type == "cpu":
            grid = grid.float()
        m = spatial_merge_size
        pieces = []
        for frames, rows, cols in grid_thw.tolist():
            torch._check(frames >= 0, lambda: "grid_thw: a negative frame count")
            for side in (rows, cols):
                torch._check(side >= m, lambda: f"grid_thw: a grid side below the merge size {m}")
                torch._check(side % m == 0, lambda: f"grid_thw: a grid side that is not a multiple of the merge size {m}")
            plane = F.interpolate(grid, size=(rows, cols), mode="bilinear", align_corners=False, antialias=True)
            plane = plane[0].permute(1, 2, 0).to(dtype)  # (rows, cols, hidden)
            blocks = plane.reshape(rows // m, m, cols // m, m, plane.shape[-1]).transpose(1, 2)
            pieces.append(blocks.reshape(rows * cols, plane.shape[-1]).repeat(frames, 1))
        return torch.cat(pieces, dim=0)

    return staticmethod(resize_positional_embeddings)


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


@register_patch("dynamo", "transformers.models.*.modeling_*.len")
def _patch_len_of_tensor_keeps_symbol(original: Any) -> Any:
    """``len(tensor)`` in modeling code returns the tensor's leading size as a symbol while exporting.

    Pattern: ``batch_size = len(source_flatten)`` (RT-DETR v1/v2, D-FINE, DEIMv2, PP-DocLayout,
    MaskFormer, OneFormer, SeamlessM4T, ...). CPython's ``len()`` must return a true ``int``, so on a
    fake tensor it materialises the symbolic leading size and guards it equal to the example's: the
    batch axis asked to be dynamic ends static ("axes asked to be dynamic ended static:
    pixel_values[axis 0] = 2"). Shadowing ``len`` in each loaded ``transformers.models.*.modeling_*``
    module with a function that returns ``tensor.shape[0]`` (what ``Tensor.__len__`` computes) keeps
    the symbol; anything else, and every size that is already a plain int (eager), goes to the builtin.
    Scoped to modeling modules rather than ``builtins.len``, so torch's own code is untouched.
    Limit: while exporting, a dynamic leading size is then a ``SymInt``, not an ``int``: code that
    uses ``len(tensor)`` as a dict key or set member, or checks ``isinstance(n, int)``, sees the
    difference (none is known in transformers; ``[0] * n`` and ``range(n)`` still specialise as before).
    Models: RTDetrV2Model, Deimv2Model, PPDocLayoutV3Model (dynamic batch in the sweep).
    Upstream: pytorch/pytorch#185804 (non-strict export leaves ``builtins.len`` unpatched while it
        overrides ``max``/``min``/``math.pow`` for fake tensors)
    Remove when: torch's non-strict export routes ``len(tensor)`` to ``Tensor.__len__`` (#185804 released).
    """

    def len_keeping_symbol(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.dim() > 0:
            size = obj.shape[0]
            if isinstance(size, torch.SymInt):
                return size
        return original(obj)

    return len_keeping_symbol


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


#: the attention implementation name the varlen patch switches to while a packed-sequence attention
#: forward runs; transformers takes its varlen branch for any name that contains "flash"
#: (``is_flash_attention_requested``), and this one is registered only while an export runs
_VARLEN_IMPLEMENTATION = "hf_exporters_flash_varlen_block_mask"

#: attention modules (transformers 5.23) whose forward packs several images, frames or audio windows
#: into one sequence described by ``cu_seqlens`` and, without a flash kernel, attends within each
#: through ``torch.split(tensor, lengths.tolist())``
_VARLEN_ATTENTION_FORWARDS = tuple(
    f"transformers.models.{package}.modeling_{package}.{owner}.forward"
    for package, owner in (
        ("cohere_compass", "CohereCompassVisionAttention"),
        ("cosmos3_edge", "Cosmos3EdgeVisionAttention"),
        ("dots3_note", "Dots3NoteVisionAttention"),
        ("ernie4_5_vl_moe", "Ernie4_5_VLMoeVisionAttention"),
        ("exaone4_5", "Exaone4_5_VisionAttention"),
        ("glm4v", "Glm4vVisionAttention"),
        ("glm4v_moe", "Glm4vMoeVisionAttention"),
        ("glm5_next", "Glm5NextVisionAttention"),
        ("glm_image", "GlmImageVisionAttention"),
        ("glm_ocr", "GlmOcrVisionAttention"),
        ("hunyuan_vl", "HunYuanVLVisionAttention"),
        ("inkling2", "Inkling2VisionAttention"),
        ("kimi_k25", "Kimi_K25VisionAttention"),
        ("lfm3_vl", "Lfm3VlVisionAttention"),
        ("minicpm_ocr", "MiniCPMOcrVisionAttention"),
        ("minicpmv4_6", "MiniCPMV4_6VisionAttention"),
        ("minicpmv4_7", "MiniCPMV4_7VisionAttention"),
        ("minimax_m3_vl", "MiniMaxM3VLVisionAttention"),
        ("muse_glimmer", "MuseGlimmerVisionAttention"),
        ("muse_spark", "MuseSparkVisionAttention"),
        ("paddleocr_vl", "PaddleOCRVisionAttention"),
        ("qwen2_5_omni", "Qwen2_5OmniAudioAttention"),
        ("qwen2_5_omni", "Qwen2_5OmniVisionAttention"),
        ("qwen2_5_vl", "Qwen2_5_VLVisionAttention"),
        ("qwen2_vl", "VisionAttention"),
        ("qwen3_5", "Qwen3_5VisionAttention"),
        ("qwen3_5_moe", "Qwen3_5MoeVisionAttention"),
        ("qwen3_asr", "Qwen3ASRAudioAttention"),
        ("qwen3_omni_moe", "Qwen3OmniMoeAudioAttention"),
        ("qwen3_omni_moe", "Qwen3OmniMoeVisionAttention"),
        ("qwen3_vl", "Qwen3VLVisionAttention"),
        ("qwen3_vl_moe", "Qwen3VLMoeVisionAttention"),
        ("qwen4_exp", "Qwen4ExpVisionAttention"),
        ("radio", "RadioAttention"),
        ("video_llama_3", "VideoLlama3VisionAttention"),
    )
)


def _segment_ids(cu_seqlens: torch.Tensor, length: Any) -> torch.Tensor:
    """Segment index of each of ``length`` packed positions: shape (length,), int64.

    ``cu_seqlens``: (segments + 1,) cumulative boundaries starting at 0. Position ``i`` belongs to the
    number of boundaries ``cu_seqlens[1:]`` at or below it; a comparison and a sum, which every
    backend lowers (no ``searchsorted``, no size read from the data).
    """
    return slice_index(cu_seqlens[1:], length)


def _block_diagonal_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Varlen attention as one SDPA call with a block-diagonal mask.

    Shapes: ``query`` (batch, heads, total_q, head_dim), ``key``/``value`` (batch, kv_heads, total_k,
    head_dim), packed segments described by ``cu_seq_lens_q``/``cu_seq_lens_k`` of shape (segments + 1,).
    Query ``i`` attends to key ``j`` when both lie in the same segment and, when causal (``is_causal``,
    or the module's ``is_causal`` when None), when ``j``'s place in its segment is at most ``i``'s plus
    the segment's key length minus its query length (flash varlen's bottom-right alignment).
    ``attention_mask``, when given with the boundaries, is applied over the packed sequence.
    ``max_length_q``/``max_length_k`` are accepted and not needed. Returns (batch, total_q, heads,
    head_dim), as transformers' attention functions do. Without ``cu_seq_lens_*`` this is
    :func:`_export_safe_sdpa`. The mask is (total_q, total_k): quadratic in the packed length, where
    a loop over the pieces costs the sum of each piece's square.
    """
    if cu_seq_lens_q is None or cu_seq_lens_k is None:
        return _export_safe_sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    segment_q = _segment_ids(cu_seq_lens_q, query.shape[2])
    segment_k = _segment_ids(cu_seq_lens_k, key.shape[2])
    mask = segment_q[:, None] == segment_k[None, :]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", False)
    if causal:
        starts_q, starts_k = cu_seq_lens_q.long(), cu_seq_lens_k.long()
        place_q = torch.arange(query.shape[2], device=query.device) - starts_q[segment_q]
        place_k = torch.arange(key.shape[2], device=key.device) - starts_k[segment_k]
        lengths_q = starts_q[segment_q + 1] - starts_q[segment_q]
        lengths_k = starts_k[segment_q + 1] - starts_k[segment_q]  # the key length of each query's segment
        mask = mask & (place_k[None, :] <= (place_q + lengths_k - lengths_q)[:, None])
    mask = mask[None, None]
    if attention_mask is not None:
        mask = mask & attention_mask if attention_mask.dtype == torch.bool else torch.where(mask, attention_mask, torch.finfo(query.dtype).min)
    return _export_safe_sdpa(module, query, key, value, mask, dropout, scaling, is_causal=False)


@register_patch("dynamo", *_VARLEN_ATTENTION_FORWARDS, loaded_only=True)
def _patch_varlen_attention_as_block_mask(original: Any) -> Any:
    """Run packed-sequence attention as one masked SDPA call instead of one call per image.

    Pattern: a vision (or audio) tower packs every image, frame or window into one sequence and
    attends within each with ``torch.split(q, (cu_seqlens[1:] - cu_seqlens[:-1]).tolist())``, one
    attention call per piece, then ``torch.cat``. ``cu_seqlens`` comes from ``grid_thw`` through
    ``repeat_interleave``, so even its length is data-dependent: the trace fails with "Could not guard
    on data-dependent expression Eq(u3, 0)" at the split, and the number of pieces could not be
    fixed anyway. The same forwards have a varlen branch for flash kernels that passes ``cu_seqlens``
    to the attention function. While the forward runs, its config's attention implementation is
    switched to :func:`_block_diagonal_sdpa`, whose name makes the forward take that branch, and
    ``max_seqlen`` is given as the packed length (an upper bound the mask does not need), so
    ``get_max_seqlen`` reads no value from the data. Same numbers as the per-piece loop up to the
    summation order. Applies when the module is configured for ``sdpa`` or ``eager`` and attention
    weights are not asked for; a flash or flex configuration is left alone. The mask is quadratic in
    the packed length (every image or frame together), where the loop costs each piece's square.
    Models: Qwen2-VL, Qwen2.5-VL, Qwen3-VL(-MoE), Qwen3.5, Qwen-Omni, Qwen3-ASR, GLM-4V, GLM-OCR,
    GLM-Image, HunYuan-VL, LFM3-VL, VideoLLaMA3, PaddleOCR-VL, Radio, MiniCPM-V/OCR and the other
    towers listed in ``_VARLEN_ATTENTION_FORWARDS``.
    Upstream: transformers' vision attention forwards (``# Other implementations: Process each chunk
        separately`` in models/qwen2_vl/modeling_qwen2_vl.py); pytorch/pytorch#138214 (``split`` by
        unbacked sizes)
    Remove when: transformers builds a block-diagonal mask (or a ``torch.cond``) for non-flash
        attention in these towers.
    """
    signature = inspect.signature(original)
    parameters = signature.parameters
    extra = next((p.name for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None)

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        config = self.config
        implementation = config._attn_implementation
        if (
            implementation not in (None, "sdpa", "eager")
            or kwargs.get("output_attentions")  # eager returns per-piece weights; the varlen branch none
            or _VARLEN_IMPLEMENTATION not in ALL_ATTENTION_FUNCTIONS  # registered by _patch_sdpa_attention
        ):
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        hidden_states = bound.arguments.get("hidden_states")
        if isinstance(hidden_states, torch.Tensor):
            if "max_seqlen" in parameters:
                if bound.arguments.get("max_seqlen") is None:
                    bound.arguments["max_seqlen"] = hidden_states.shape[-2]
            elif extra is not None and bound.arguments.setdefault(extra, {}).get("max_seqlen") is None:
                bound.arguments[extra]["max_seqlen"] = hidden_states.shape[-2]
        saved = config._attn_implementation_internal
        config._attn_implementation_internal = _VARLEN_IMPLEMENTATION
        try:
            return original(*bound.args, **bound.kwargs)
        finally:
            config._attn_implementation_internal = saved

    return functools.wraps(original)(forward)


#: modeling modules (transformers 5.23) that import ``get_vision_window_index`` by name
_WINDOW_INDEX_USERS = ("exaone4_5", "minicpm_ocr", "minicpmv4_6", "minicpmv4_7", "muse_glimmer", "muse_spark", "qwen2_5_omni", "qwen2_5_vl")
#: modeling modules (transformers 5.23) that import ``get_vision_nearest_position_ids`` by name
_NEAREST_POSITION_USERS = ("minicpm_ocr", "minicpmv4_6", "minicpmv4_7")


def _packed_positions(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For items packed image after image, ``counts[i]`` of image ``i``: each item's image and its
    place within that image, both (counts.sum(),) int64. The total is read once from the data (an
    unbacked size); the image of an item is the number of images that end at or before it (a
    comparison and a sum, no ``repeat_interleave``, no Python loop over the images)."""
    total = counts.sum().item()
    torch._check(total >= 0)
    ends = torch.cumsum(counts, 0)
    image = slice_index(ends, total)
    return image, torch.arange(total, device=counts.device) - (ends - counts)[image]


def _window_index_by_sort(grid_thw: torch.Tensor, spatial_merge_size: int, window_size: int, patch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Window order of the merged tokens of every image and the windows' cumulative patch counts.

    ``grid_thw`` (images, 3): ``(t, h, w)`` in patches. A frame of ``h / m`` x ``w / m`` merged tokens
    (``m = spatial_merge_size``) is cut into windows of ``k = window_size / m / patch_size`` tokens a
    side, the last row and column of windows cut short. Each token gets the key (image, frame, window
    row, window column, row in window, column in window); ``argsort`` of the keys is the window order.
    Returns ``window_index`` (total merged tokens,) int64 and ``cu_window_seqlens`` (windows + 1,)
    int32 in patches (``m * m`` per token), windows frame by frame and image after image, with no empty
    window: the values ``get_vision_window_index`` returns. Every image is handled at once, so neither
    the number of images nor their sizes become Python ints.
    """
    side = window_size // spatial_merge_size // patch_size
    grid = grid_thw.long()
    frames, rows, cols = grid[:, 0], grid[:, 1] // spatial_merge_size, grid[:, 2] // spatial_merge_size
    window_rows, window_cols = (rows + side - 1) // side, (cols + side - 1) // side

    image, token = _packed_positions(frames * rows * cols)
    rows_of, cols_of, window_rows_of, window_cols_of = rows[image], cols[image], window_rows[image], window_cols[image]
    frame, row, col = token // (rows_of * cols_of), (token // cols_of) % rows_of, token % cols_of
    window_of = (frame * window_rows_of + row // side) * window_cols_of + col // side
    windows_before = torch.cumsum(frames * window_rows * window_cols, 0) - frames * window_rows * window_cols
    key = ((windows_before[image] + window_of) * side + row % side) * side + col % side
    window_index = torch.argsort(key)

    image, window = _packed_positions(frames * window_rows * window_cols)
    window_rows_of, window_cols_of = window_rows[image], window_cols[image]
    height_in = torch.clamp(rows[image] - (window // window_cols_of) % window_rows_of * side, max=side)
    width_in = torch.clamp(cols[image] - window % window_cols_of * side, max=side)
    lengths = height_in * width_in * spatial_merge_size**2
    cu_window_seqlens = torch.cat([torch.zeros(1, dtype=torch.long, device=grid.device), torch.cumsum(lengths, 0)])
    return window_index, cu_window_seqlens.to(torch.int32)


@register_patch(
    "dynamo",
    "transformers.vision_utils.get_vision_window_index",
    *(f"transformers.models.{package}.modeling_{package}.get_vision_window_index" for package in _WINDOW_INDEX_USERS),
    loaded_only=True,
)
def _patch_vision_window_index_by_sort(original: Any) -> Any:
    """Compute the window-attention order of vision tokens with tensor ops on symbolic sizes.

    Pattern: ``get_vision_window_index(grid_thw, ...)`` turns each image's grid into Python ints
    (``int(grid_t)``), pads an index grid to whole windows, keeps the non-padded entries with a boolean
    mask and drops empty windows with ``unique_consecutive``. The grid is data, so the trace fails with
    "Could not extract specialized integer from data-dependent expression" in static exports too.
    :func:`_window_index_by_sort` gives the same two tensors from sizes kept as symbols: the order by
    ``argsort`` of a per-token key, the window lengths from each window's clipped height and width.
    Precomputed ``window_index``/``cu_window_seqlens`` in ``kwargs`` are still popped and returned.
    Models: Qwen2.5-VL and Qwen2.5-Omni vision towers, Exaone 4.5, Muse Glimmer, Muse Spark,
    MiniCPM-OCR, MiniCPM-V 4.6/4.7 vision towers.
    Upstream: transformers ``vision_utils.get_vision_window_index`` (its docstring asks exporters to
        pass the tensors precomputed; no report found)
    Remove when: transformers computes the window index without Python ints or ``unique_consecutive``.
    """

    def get_vision_window_index(grid_thw: torch.Tensor, spatial_merge_size: int, window_size: int, patch_size: int, kwargs: dict | None = None) -> Any:
        if kwargs is not None and kwargs.get("window_index") is not None and kwargs.get("cu_window_seqlens") is not None:
            return original(grid_thw, spatial_merge_size, window_size, patch_size, kwargs=kwargs)
        if kwargs is not None:  # one precomputed without the other: popped and unused, as the original does
            kwargs.pop("window_index", None), kwargs.pop("cu_window_seqlens", None)
        return _window_index_by_sort(grid_thw, spatial_merge_size, window_size, patch_size)

    return functools.wraps(original)(get_vision_window_index)


@register_patch(
    "dynamo",
    "transformers.vision_utils.get_vision_nearest_position_ids",
    *(f"transformers.models.{package}.modeling_{package}.get_vision_nearest_position_ids" for package in _NEAREST_POSITION_USERS),
    loaded_only=True,
)
def _patch_vision_nearest_position_ids_symbolic(original: Any) -> Any:
    """Bucket each image's patch rows and columns with its size kept as a symbol.

    Pattern: ``get_vision_nearest_position_ids(target_sizes, n)`` reads each ``(h, w)`` with
    ``int(height), int(width)``; the sizes are data, so the trace fails with "Could not extract
    specialized integer from data-dependent expression u0". The replacement buckets every patch of
    every image at once (row ``r`` of an image of height ``h`` falls in bucket ``bucketize(r / h)``, the
    same for columns), giving the same (sum of h * w,) int64 ids into the ``n * n`` position table
    without turning the number of images or their sizes into Python ints. A precomputed ``position_ids`` in
    ``kwargs`` is still popped and returned.
    Models: MiniCPM-OCR and MiniCPM-V 4.6/4.7 vision towers.
    Upstream: transformers ``vision_utils.get_vision_nearest_position_ids`` (no report found)
    Remove when: transformers drops the ``int()`` conversions.
    """

    def get_vision_nearest_position_ids(target_sizes: torch.Tensor, num_patches_per_side: int, kwargs: dict | None = None) -> torch.Tensor:
        if kwargs is not None and kwargs.get("position_ids") is not None:
            return original(target_sizes, num_patches_per_side, kwargs=kwargs)
        boundaries = torch.arange(1 / num_patches_per_side, 1.0, 1 / num_patches_per_side, device=target_sizes.device)
        sizes = target_sizes.long()
        image, patch = _packed_positions(sizes[:, 0] * sizes[:, 1])
        height, width = sizes[image, 0], sizes[image, 1]
        rows = torch.bucketize((patch // width) / height, boundaries, right=True)
        cols = torch.bucketize((patch % width) / width, boundaries, right=True)
        return rows * num_patches_per_side + cols

    return functools.wraps(original)(get_vision_nearest_position_ids)


def _window_starts(lengths: torch.Tensor, window: Any) -> torch.Tensor:
    """Cumulative boundaries of every sample cut into windows of ``window`` positions, int32.

    ``lengths`` (batch,): each sample's packed length, samples back to back. A window starts at each
    sample's start and every ``window`` positions within it, the last one cut short (an empty sample has
    none). Returns (windows + 1,): the start of each window, then the packed total; the window count is
    read from the data (an unbacked size).
    """
    _, local = _packed_positions(lengths)
    starts = torch.arange(local.shape[0], device=lengths.device)[local % window == 0]
    return torch.cat([starts, lengths.sum().reshape(1)]).to(torch.int32)


@register_patch(
    "dynamo",
    *(f"transformers.models.{package}.modeling_{package}.get_audio_cu_seqlens" for package in ("qwen3_asr", "qwen3_omni_moe")),
    loaded_only=True,
)
def _patch_audio_window_cu_seqlens_symbolic(original: Any) -> Any:
    """The audio encoders' attention windows as tensor ops over the packed frames.

    Pattern: ``get_audio_cu_seqlens`` loops over each sample's post-convolution length in Python,
    ``cu_chunk_lens += [window] * (cnn_len // window)`` plus the remainder, so the lengths (from the
    feature mask) become Python ints: "Could not extract specialized integer from data-dependent
    expression u1". The replacement marks every packed frame whose place in its sample is a multiple of
    the window (the same ``max(chunk lengths after the convolutions) * n_window_infer // (2 * n_window)``)
    and returns those starts followed by the total: the same (windows + 1,) int32 boundaries, with the
    window count an unbacked size. A precomputed ``cu_seqlens`` in ``kwargs`` is still popped and returned.
    Models: Qwen3ASREncoder (and the Qwen3-Omni-MoE audio encoder, which shares the function).
    Upstream: transformers models/qwen3_asr/modeling_qwen3_asr.py ``get_audio_cu_seqlens`` (no report
        found); pytorch/pytorch#125180 (sizes read from data under export)
    Remove when: transformers builds the window boundaries with tensor ops.
    """

    def get_audio_cu_seqlens(chunk_lengths: torch.Tensor, feature_lens: torch.Tensor, n_window_infer: int, n_window: int, kwargs: dict | None = None) -> torch.Tensor:
        if kwargs is not None and (precomputed := kwargs.pop("cu_seqlens", None)) is not None:
            return precomputed  # the key leaves kwargs either way, as in transformers (the layers take it by position)
        output_lengths = original.__globals__["_get_feat_extract_output_lengths"]
        window = output_lengths(chunk_lengths, n_window).max().item() * (n_window_infer // (n_window * 2))
        torch._check(window > 0)  # eager divides by it
        return _window_starts(output_lengths(feature_lens, n_window), window)

    return functools.wraps(original)(get_audio_cu_seqlens)


def _pixel_shuffle_index(grid_thw: torch.Tensor, merge_size: int) -> torch.Tensor:
    """Gather index that puts each ``m x m`` block of patches (``m = merge_size``) of every frame on
    ``m * m`` consecutive rows, frame after frame and image after image.

    ``grid_thw`` (images, 3): ``(t, h, w)`` in patches, ``h`` and ``w`` multiples of ``m``. Output
    position ``q`` of a frame is (block row, block column, row in block, column in block) in row-major
    order over ``(h/m, w/m, m, m)``; it reads the frame's patch ``(block row * m + row) * w + block
    column * m + column``. Returns (sum of t * h * w,) int64, every image at once.
    """
    grid = grid_thw.long()
    counts = grid[:, 0] * grid[:, 1] * grid[:, 2]
    image, item = _packed_positions(counts)  # item: the place within its image
    height, width = grid[image, 1], grid[image, 2]
    q = item % (height * width)
    blocks_w = width // merge_size
    block, inside = q // (merge_size * merge_size), q % (merge_size * merge_size)
    row = (block // blocks_w) * merge_size + inside // merge_size
    col = (block % blocks_w) * merge_size + inside % merge_size
    image_start = (torch.cumsum(counts, 0) - counts)[image]
    return image_start + (item - q) + row * width + col


@register_patch(
    "dynamo",
    *(f"transformers.models.{package}.modeling_{package}.get_vision_pixel_shuffle_index" for package in ("muse_glimmer", "muse_spark")),
    loaded_only=True,
)
def _patch_vision_pixel_shuffle_index_symbolic(original: Any) -> Any:
    """Compute the pixel-shuffle gather index of vision tokens with the grid kept as symbols.

    Pattern: ``get_vision_pixel_shuffle_index(grid_thw, merge_size)`` loops over ``grid_thw.tolist()``
    and reads each image's ``int(frames), int(height), int(width)``; the grid is data, so the trace
    fails with "Could not extract specialized integer from data-dependent expression" in static exports
    too. :func:`_pixel_shuffle_index` gives the same (sum of t * h * w,) int64 index for every image at
    once. A precomputed ``pixel_shuffle_index`` in ``kwargs`` is still popped and returned.
    Models: MuseGlimmerVisionModel, MuseSparkVisionModel (and the models around them).
    Upstream: transformers ``get_vision_pixel_shuffle_index`` of muse_glimmer and muse_spark (its
        docstring asks exporters to pass the index precomputed; no report found)
    Remove when: transformers computes the index without Python ints.
    """

    def get_vision_pixel_shuffle_index(grid_thw: torch.Tensor, merge_size: int, kwargs: dict | None = None) -> torch.Tensor:
        if kwargs is not None and kwargs.get("pixel_shuffle_index") is not None:
            return original(grid_thw, merge_size, kwargs=kwargs)
        return _pixel_shuffle_index(grid_thw, merge_size)

    return functools.wraps(original)(get_vision_pixel_shuffle_index)


@register_patch("dynamo", "transformers.integrations.moe.ExpertsInterface.get_interface")
def _patch_eager_experts_as_batched_mm(original: Any) -> Any:
    """Trace mixture-of-experts layers configured for the ``eager`` experts implementation with
    transformers' ``batched_mm`` implementation.

    Pattern: the ``eager`` forward of an experts module (``@use_experts_implementation``) loops
    ``for expert_idx in expert_hit``, where ``expert_hit`` comes from ``nonzero()`` over the router's
    choices, and gathers each expert's tokens with ``torch.where``: both the loop count and the token
    counts are read from data, so the trace fails with "Could not guard on data-dependent
    expression". A model that overrides ``get_correct_experts_implementation`` to default to
    ``eager`` (OpenAI Privacy Filter, for its sensitivity to accumulation order), or a user who asks
    for ``experts_implementation="eager"``, gets that loop. ``batched_mm`` computes the same
    per-token expert projections by gathering each token's expert weights (shapes fixed by the token
    count and top-k), with the same layout flags (transposed, bias, gate, post-expert norm); only the
    summation order differs. That holds in float32 only: OpenAI Privacy Filter's eager loop computes
    in float32 whatever the weights' dtype, and ``batched_mm`` in the weights' dtype, so modules with
    bf16/fp16 weights keep the eager loop (and the trace still fails there). ``batched_mm`` gathers one
    copy of the expert weights per (token, top-k) pair: memory grows with tokens x top-k x expert size.
    Other implementations (``grouped_mm``, kernels) are returned unchanged.
    Models: OpenAIPrivacyFilterModel (sweep, data-dependent guard).
    Upstream: transformers integrations/moe.py (the eager experts loop over ``expert_hit``);
        pytorch/pytorch#125180 (data-dependent loops under torch.export)
    Remove when: transformers' eager experts forward has a trace-friendly path under
        ``torch.compiler.is_exporting()``.
    """

    def get_interface(self: Any, experts_implementation: str, default: Any) -> Any:
        if experts_implementation != "eager" or "batched_mm" not in self or "eager" in self:
            return original(self, experts_implementation, default)  # "eager" registered: a backend's own choice
        batched = self["batched_mm"]

        def experts_forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if all(p.dtype == torch.float32 for p in module.parameters()):
                return batched(module, *args, **kwargs)
            return default(module, *args, **kwargs)

        return experts_forward

    return get_interface


def _dense_mixture(hidden_states: torch.Tensor, weights: torch.Tensor, expert: Any, count: int) -> torch.Tensor:
    """Every expert on every token, summed with its routing weight.

    ``hidden_states`` (tokens, hidden); ``weights`` (tokens, count): the weight each token gives each
    expert, 0 where the router did not choose it; ``expert(e, hidden_states)`` -> (tokens, hidden).
    The Python loop runs over a count fixed by the config, so the trace has no data-dependent size.
    Each expert's output is multiplied by its weight in the weight's dtype (float32 routers) and cast
    to the hidden dtype before it is summed, as the loops do; an expert a token did not choose adds an
    exact 0 even where its output overflows (``where``, not ``inf * 0``).
    """
    out = torch.zeros_like(hidden_states)
    for index in range(count):
        weight = weights[:, index, None]
        contribution = torch.where(weight != 0, expert(index, hidden_states) * weight, 0.0)
        out = out + contribution.to(hidden_states.dtype)
    return out


@register_patch("dynamo", "transformers.models.switch_transformers.modeling_switch_transformers.SwitchTransformersExperts.forward", loaded_only=True)
def _patch_switch_experts_dense(_original: Any) -> Any:
    """SwitchTransformers' experts as a dense mixture: each expert on every token, weighted by the
    router's (zero for experts it did not choose).

    Pattern: ``for expert_idx in expert_hit`` over ``nonzero()`` of the routing mask, then
    ``torch.where`` to gather each expert's tokens: the loop count and the token counts are read from
    data ("Could not guard on data-dependent expression"). The experts are separate modules
    (an ``nn.ModuleDict``), so transformers' ``batched_mm`` experts do not apply. Same numbers as the
    loop (a token dropped by the capacity limit has no expert and stays 0); the cost is every expert's
    FLOPs on every token (``num_experts`` times the sparse layer's), which is the price of a graph
    without data-dependent shapes.
    Models: SwitchTransformersModel, SwitchTransformersForConditionalGeneration, SwitchTransformersEncoderModel.
    Upstream: transformers models/switch_transformers/modeling_switch_transformers.py
        (``SwitchTransformersExperts.forward``); pytorch/pytorch#125180 (data-dependent loops under export)
    Remove when: the model's experts use ``@use_experts_implementation`` (then the batched_mm patch serves).
    """

    def forward(self: Any, hidden_states: torch.Tensor, selected_experts: torch.Tensor, routing_weights: torch.Tensor) -> torch.Tensor:
        # selected_experts (tokens, k, experts) one-hot; routing_weights (tokens, k)
        weights = (selected_experts.to(routing_weights.dtype) * routing_weights[..., None]).sum(dim=1)
        return _dense_mixture(hidden_states, weights, lambda e, h: self[f"expert_{e}"](h), self.num_experts)

    return forward


@register_patch("dynamo", "transformers.models.dbrx.modeling_dbrx.DbrxExperts.forward", loaded_only=True)
def _patch_dbrx_experts_dense(_original: Any) -> Any:
    """DBRX's experts as a dense mixture: each expert's GLU on every token, weighted by the router's
    top-k weight (zero for experts it did not choose).

    Pattern: as :func:`_patch_switch_experts_dense`: ``for expert_idx in expert_hit`` over
    ``nonzero()``, then ``torch.where`` per expert; the experts' weights are fused tensors that
    transformers' ``batched_mm`` experts do not know. Same numbers as the loop up to summation order;
    costs ``moe_num_experts / moe_top_k`` times the sparse layer's FLOPs.
    Models: DbrxModel, DbrxForCausalLM.
    Upstream: transformers models/dbrx/modeling_dbrx.py (``DbrxExperts.forward``);
        pytorch/pytorch#125180 (data-dependent loops under export)
    Remove when: DBRX's experts use ``@use_experts_implementation``.
    """

    def forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        batch_size = hidden_states.shape[0]
        hidden_states = hidden_states.reshape(-1, self.hidden_size)
        # top_k_index, top_k_weights (tokens, k)
        chosen = top_k_index[..., None] == torch.arange(self.num_experts, device=top_k_index.device)
        weights = (chosen.to(top_k_weights.dtype) * top_k_weights[..., None]).sum(dim=1)
        shape = (-1, self.ffn_hidden_size, self.hidden_size)
        w1, v1, w2 = (p.view(shape) for p in (self.mlp.w1, self.mlp.v1, self.mlp.w2))
        out = _dense_mixture(hidden_states, weights, lambda e, h: self.mlp(h, w1[e], v1[e], w2[e]), self.num_experts)
        return out.view(batch_size, -1, self.hidden_size)

    return forward


@register_patch("dynamo", "transformers.models.step3p7.modeling_step3p7.Step3p7Experts.forward", loaded_only=True)
def _patch_step3p7_experts_dense(_original: Any) -> Any:
    """Step 3.7's experts as a dense mixture: each expert's clamped GLU on every token, weighted by the
    router's top-k weight (zero for experts it did not choose).

    Pattern: as :func:`_patch_dbrx_experts_dense`: ``for expert_idx in hit`` over ``nonzero()`` of a
    one-hot routing mask, then ``torch.where`` per expert; the class writes its own loop instead of
    ``@use_experts_implementation``. Index ``num_experts`` means "no expert" and adds nothing, as in
    the loop. Same numbers as the loop up to summation order; costs ``num_local_experts / top_k``
    times the sparse layer's FLOPs.
    Models: Step3p7Model, Step3p7ForCausalLM.
    Upstream: transformers models/step3p7/modeling_step3p7.py (``Step3p7Experts.forward``);
        pytorch/pytorch#125180 (data-dependent loops under export)
    Remove when: Step 3.7's experts use ``@use_experts_implementation``.
    """

    def forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        # hidden_states (tokens, hidden); top_k_index, top_k_weights (tokens, k)
        chosen = top_k_index[..., None] == torch.arange(self.num_experts, device=top_k_index.device)
        weights = (chosen.to(top_k_weights.dtype) * top_k_weights[..., None]).sum(dim=1)

        def expert(e: int, h: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(self._apply_gate(torch.nn.functional.linear(h, self.gate_up_proj[e])), self.down_proj[e])

        return _dense_mixture(hidden_states, weights, expert, self.num_experts)

    return forward


@register_patch("dynamo", "transformers.models.longcat_flash.modeling_longcat_flash.LongcatFlashExperts.forward", loaded_only=True)
def _patch_longcat_flash_experts_dense(_original: Any) -> Any:
    """LongCat-Flash's experts as a dense mixture: each routed expert's GLU, and each zero-computation
    (identity) expert, on every token, weighted by the router's top-k weight (zero for experts it did
    not choose).

    Pattern: as :func:`_patch_dbrx_experts_dense`: ``for expert_idx_tensor in expert_hit`` over
    ``nonzero()`` with ``.item()`` and ``torch.where`` per expert. Indices from ``n_routed_experts``
    on are identity experts (the token passes through, times its weight), as in the loop. Same
    numbers as the loop up to summation order; costs ``n_routed_experts / moe_topk`` times the sparse
    layer's FLOPs.
    Models: LongcatFlashModel, LongcatFlashForCausalLM.
    Upstream: transformers models/longcat_flash/modeling_longcat_flash.py (``LongcatFlashExperts.forward``);
        pytorch/pytorch#125180 (data-dependent loops under export)
    Remove when: LongCat-Flash's experts use ``@use_experts_implementation``.
    """

    def forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        # hidden_states (tokens, hidden); top_k_index, top_k_weights (tokens, k)
        chosen = top_k_index[..., None] == torch.arange(self.total_experts, device=top_k_index.device)
        weights = (chosen.to(top_k_weights.dtype) * top_k_weights[..., None]).sum(dim=1)

        def expert(e: int, h: torch.Tensor) -> torch.Tensor:
            if e >= self.num_routed_experts or self.gate_up_proj is None:
                return self.identity_expert(h)
            gate, up = torch.nn.functional.linear(h, self.gate_up_proj[e]).chunk(2, dim=-1)
            return torch.nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e])

        return _dense_mixture(hidden_states, weights, expert, self.total_experts)

    return forward


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


@register_patch("dynamo", "transformers.models.udop.modeling_udop.combine_image_text_embeddings", loaded_only=True)
def _patch_udop_combine_without_ragged_rows(original: Any) -> Any:
    """UDOP's image/text merge with fixed-size rows: the image patches no OCR box points at, moved to
    the front of each row in their order, then zeros, instead of a ragged list per row padded back.

    Pattern: ``patch_inds[rows, cols] = False`` with ``rows, cols = zip(*ind)`` iterates a tensor in
    Python, then ``image_embeddings[i][patch_inds[i]]`` keeps a data-dependent count per row before
    ``pad_sequence`` pads it to the patch count. The trace stopped on the iteration ("The tensor has a
    non-zero number of elements, but its data is not allocated yet"). Here the mask comes from one
    ``scatter``, each kept patch is scattered to its rank among the kept ones (a cumulative sum), and
    the rest stays zero: the same rows, bounding boxes and attention mask as the loop for the padded
    length the model uses (``max_len=0``: the patch count), with no sort (which ONNX and ExecuTorch
    lack in its stable form). Other ``max_len`` values call the original.
    Models: UdopModel, UdopForConditionalGeneration, UdopEncoderModel.
    Upstream: transformers models/udop/modeling_udop.py (``combine_image_text_embeddings``);
        pytorch/pytorch#125180 (data-dependent sizes under export)
    Remove when: UDOP builds the merged rows without Python iteration over tensors.
    """

    def combine_image_text_embeddings(
        image_embeddings: torch.Tensor,
        inputs_embeds: torch.Tensor,
        bbox: torch.Tensor,
        visual_bbox: torch.Tensor | None,
        attention_mask: torch.Tensor | None = None,
        num_patches: int = 14,
        max_len: int = 0,
        image_size: int = 224,
        patch_size: int = 16,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if max_len != 0:
            return original(image_embeddings, inputs_embeds, bbox, visual_bbox, attention_mask, num_patches, max_len, image_size, patch_size)
        from transformers.models.udop.modeling_udop import get_visual_bbox

        # image_embeddings (batch, patches, hidden); inputs_embeds (batch, tokens, hidden); bbox (batch, tokens, 4)
        batch, patches = image_embeddings.shape[:2]
        side = num_patches
        centre_x = torch.clip(torch.floor((bbox[:, :, 0] + bbox[:, :, 2]) / 2.0 * side).long(), 0, side - 1)
        centre_y = torch.clip(torch.floor((bbox[:, :, 1] + bbox[:, :, 3]) / 2.0 * side).long(), 0, side - 1) * side
        ocr_points = centre_x + centre_y  # (batch, tokens): the patch each token's box centre falls in
        wide = bbox.to(torch.float64)
        target_seg = (wide.mean(-1) == 0.0) | (wide.mean(-1) == 1.0)
        repeated = torch.gather(image_embeddings, 1, ocr_points.unsqueeze(-1).expand(-1, -1, image_embeddings.size(-1)))
        inputs_embeds = inputs_embeds + repeated.masked_fill(target_seg[..., None], 0.0)

        kept = torch.ones(batch, patches, dtype=torch.bool, device=image_embeddings.device).scatter(1, ocr_points, False)
        # each kept patch goes to its rank among the kept ones; the others to a spare slot, cut off after
        dest = torch.where(kept, kept.cumsum(dim=1) - 1, patches)[..., None]
        valid = torch.arange(patches, device=kept.device)[None, :] < kept.sum(dim=1, keepdim=True)

        def compact(rows: torch.Tensor) -> torch.Tensor:
            spare = rows.new_zeros(batch, patches + 1, rows.size(-1))
            return spare.scatter(1, dest.expand(-1, -1, rows.size(-1)), rows)[:, :patches]

        vision = compact(image_embeddings)
        if visual_bbox is None:
            visual_bbox = get_visual_bbox(image_size=image_size, patch_size=patch_size)
            visual_bbox = visual_bbox.unsqueeze(0).repeat(batch, 1, 1).to(image_embeddings.device)
        boxes = compact(visual_bbox)

        inputs_embeds = torch.cat([inputs_embeds, vision], 1)
        bbox = torch.cat([wide, boxes.to(wide.dtype)], 1)  # float64, as the original returns
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, valid.to(attention_mask.dtype)], 1)
        return inputs_embeds, bbox, attention_mask

    return combine_image_text_embeddings


def _conv1d_paddings(layer: Any, length: Any) -> tuple[Any, Any]:
    """(left, right) padding of an Encodec-style padded Conv1d for an input of ``length`` samples, in
    Python integers (or the input's symbolic size) from ``layer.conv``'s kernel, stride and dilation
    (``total = kernel - stride``): the right side pads the input up to a whole number of strides, as
    ``ceil((length - kernel + total) / stride)`` frames need; causal layers put the whole ``kernel - stride`` on the left, the others
    split it, the odd sample going left."""
    conv = layer.conv
    stride = conv.stride[0]
    kernel = (conv.kernel_size[0] - 1) * conv.dilation[0] + 1
    total = kernel - stride
    # ceil((length - kernel + total) / stride) frames = ceil(length / stride) - 1, written with a
    # non-negative numerator: an ONNX program divides sizes by truncation, not flooring
    extra = (length + stride - 1) // stride * stride - length
    if layer.causal:
        return total, extra
    right = total // 2
    return total - right, right + extra


@register_patch("dynamo", "transformers.models.encodec.modeling_encodec.EncodecConv1d.forward", loaded_only=True)
def _patch_encodec_conv_padding_from_ints(_original: Any) -> Any:
    """EncodecConv1d's padding computed in Python integers from its convolution's own geometry.

    Pattern: the layer keeps its stride, effective kernel size and total padding as 0-d int64
    buffers and computes the frame count with ``torch.ceil`` on tensors, so every padding passed to
    ``F.pad`` and compared with the length is a tensor read back with ``.item()``. Under
    ``torch.export`` buffers are fake, the reads become unbacked symbols and the reflect-pad branch
    ``if length <= max_pad`` fails ("Could not guard on data-dependent expression Eq(u0, 1)"). The
    same numbers follow from ``self.conv.kernel_size``, ``stride`` and ``dilation`` (plain ints, the
    values the buffers were built from), see ``_conv1d_paddings``: the paddings are then ints or
    sizes of the input, and the program pads exactly as eager.
    Models: EncodecModel (static and dynamic in the sweep; also the codec of MusicGen and Bark).
    Upstream: transformers models/encodec/modeling_encodec.py (``EncodecConv1d`` buffers
        ``stride``/``kernel_size``/``padding_total``); pytorch/pytorch#125180 (data-dependent
        control flow under export)
    Remove when: EncodecConv1d keeps its geometry as Python ints.
    """

    def forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states (batch, channels, length) -> (batch, out_channels, frames)
        hidden_states = self._pad1d(hidden_states, _conv1d_paddings(self, hidden_states.shape[-1]), mode=self.pad_mode)
        hidden_states = self.conv(hidden_states)
        if self.norm_type == "time_group_norm":
            hidden_states = self.norm(hidden_states)
        return hidden_states

    return forward


@register_patch(
    "dynamo",
    "transformers.models.mimi.modeling_mimi.MimiConv1d.forward",
    "transformers.models.pocket_tts_audio_tokenizer.modeling_pocket_tts_audio_tokenizer.PocketTTSAudioTokenizerConv1d.forward",
    loaded_only=True,
)
def _patch_streaming_conv_padding_from_ints(_original: Any) -> Any:
    """Mimi's (and PocketTTS's copy of it) padded Conv1d, its padding computed in Python integers.

    Pattern: as ``_patch_encodec_conv_padding_from_ints`` (int64 geometry buffers read back as
    unbacked symbols under export; "Could not guard on data-dependent expression").
    A streaming call (``padding_cache`` given, causal layers) prepends the cached samples as before.
    Models: MimiModel, MimiEncoderModel, PocketTTSAudioTokenizerModel (static and dynamic in the sweep).
    Upstream: transformers models/mimi/modeling_mimi.py (``MimiConv1d`` buffers
        ``stride``/``kernel_size``/``padding_total``); pytorch/pytorch#125180
    Remove when: MimiConv1d keeps its geometry as Python ints.
    """

    def forward(self: Any, hidden_states: torch.Tensor, padding_cache: Any = None) -> torch.Tensor:
        # hidden_states (batch, channels, length) -> (batch, out_channels, frames)
        if not self.causal and padding_cache is not None:
            raise ValueError("`padding_cache` is not supported for non-causal convolutions.")
        if padding_cache is not None:
            hidden_states = torch.cat([padding_cache.update(hidden_states, self.layer_idx), hidden_states], dim=2)
        else:
            hidden_states = self._pad1d(hidden_states, _conv1d_paddings(self, hidden_states.shape[-1]), mode=self.pad_mode)
        return self.conv(hidden_states)

    return forward


def _linear_recurrence(decay: torch.Tensor, drive: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``state = decay[t] * state + drive[t]`` for each position ``t``, as one
    ``torch.ops.higher_order.scan`` (a symbolic length under export, ONNX ``Scan``, an ExecuTorch loop).

    Shapes: ``decay``, ``drive`` (length, *S); ``state`` (*S), the state before position 0. Returns the
    last state (*S) and every position's state (length, *S), in the dtype of ``decay * state + drive``.
    """
    from torch._higher_order_ops.scan import scan

    def step(state: torch.Tensor, position: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        decay, drive = position
        state = decay * state + drive
        return state, state.clone()  # a scan output may not alias the carry

    state = state.to(torch.result_type(decay, drive))
    return scan(step, state, [decay, drive])


_SELECTIVE_SCANS = tuple(
    f"transformers.models.{family}.modeling_{family}.mamba_selective_scan" for family in ("mamba", "falcon_mamba", "jamba", "zamba")
)


@register_patch("dynamo", *_SELECTIVE_SCANS, loaded_only=True)
def _patch_selective_scan_as_scan_op(_original: Any) -> Any:
    """Mamba's selective scan (the reference path, without the ``mamba_ssm`` kernel) as one
    ``torch.ops.higher_order.scan`` over the sequence instead of a Python loop.

    Pattern: ``for index in range(seq_len)`` updating the SSM state one position at a time. Under
    export the loop is unrolled, so the sequence length is fixed by the loop count ("axes asked to
    be dynamic ended static: input_ids[axis 1]") and the graph grows with the length. The scan op
    runs the same step per position with a symbolic length; torch.onnx translates it to ONNX
    ``Scan`` and ExecuTorch emits it as a loop. transformers' own alternative,
    ``use_associative_scan``, is off under export because its op has no ONNX translation.

    Shapes: ``hidden_states``, ``dt``, ``z`` (batch, intermediate, length); ``A`` (intermediate,
    state); ``B``, ``C`` (batch, state, length); ``D``, ``delta_bias`` (intermediate,). Returns
    (batch, intermediate, length) and, with ``return_last_state``, the state (batch, intermediate,
    state). Same state update per step as the loop (float32); the readout by ``C`` is one matmul over all
    states, in the input dtype. Memory: every position's state is kept, (length, batch, intermediate,
    state) in float32, the size of the discretised ``A`` the loop also builds; a readout inside the scan
    step would keep less, but a matmul in the step body fails torch.onnx's decomposition of the scan.
    Models: MambaModel, FalconMambaModel, JambaModel, ZambaModel and their heads.
    Upstream: transformers models/mamba/modeling_mamba.py (``mamba_selective_scan``, copied into
        falcon_mamba, jamba and zamba); pytorch/pytorch#105279 (a Python loop over a dynamic length specialises it)
    Remove when: the reference path uses a scan op under export (or the associative scan gets an
        ONNX translation).
    """
    def mamba_selective_scan(
        hidden_states: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        D: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
        delta_bias: torch.Tensor | None = None,
        delta_softplus: bool = False,
        return_last_state: bool = False,
        **_kernel_options: Any,
    ) -> Any:
        input_dtype = hidden_states.dtype
        if delta_bias is not None:
            dt = dt + delta_bias.to(dt.dtype)[..., None]
        if delta_softplus:
            dt = torch.nn.functional.softplus(dt)
        # length first for the scan: decay, drive (length, batch, intermediate, state)
        decay = torch.exp(A[None, :, None, :] * dt[..., None]).permute(2, 0, 1, 3)
        drive = (dt[..., None] * B.transpose(1, 2)[:, None].float() * hidden_states[..., None].float()).permute(2, 0, 1, 3)
        state = torch.zeros(hidden_states.shape[0], hidden_states.shape[1], A.shape[-1], dtype=input_dtype, device=hidden_states.device)
        state, states = _linear_recurrence(decay, drive, state)
        # states (length, batch, intermediate, state) read out by C (batch, state, length): (batch, intermediate, length)
        out = torch.matmul(states.permute(1, 0, 2, 3).to(input_dtype), C.transpose(1, 2)[..., None])[..., 0].transpose(1, 2)
        if D is not None:
            out = out + hidden_states * D[None, :, None]
        if z is not None:
            out = out * torch.nn.functional.silu(z)
        return (out, state) if return_last_state else out

    return mamba_selective_scan


@register_patch("dynamo", "transformers.models.recurrent_gemma.modeling_recurrent_gemma.RecurrentGemmaRglru._rnn_scan", loaded_only=True)
def _patch_rglru_scan_as_scan_op(original: Any) -> Any:
    """RecurrentGemma's RG-LRU recurrence over a prompt as one ``torch.ops.higher_order.scan``
    (:func:`_linear_recurrence`) instead of a Python loop.

    Pattern: ``for t in range(hidden_states.shape[1])`` over the sequence: under export the loop is
    unrolled and fixes the length ("axes asked to be dynamic ended static: input_ids[axis 1]"). Same
    arithmetic per step (``a_t * h + x_t`` accumulated in ``acc_dtype``); a one-token call (decoding)
    keeps transformers' own path.
    Shapes: ``hidden_states`` (batch, length, lru_width); ``recurrent_gate``, ``reset`` broadcastable to
    it; ``recurrent_states`` (batch, lru_width) or None. Returns (batch, length, lru_width) in the
    input dtype and the last state (batch, lru_width) in ``acc_dtype``.
    Models: RecurrentGemmaModel, RecurrentGemmaForCausalLM.
    Upstream: transformers models/recurrent_gemma/modeling_recurrent_gemma.py (``RecurrentGemmaRglru._rnn_scan``);
        pytorch/pytorch#105279 (a Python loop over a dynamic length specialises it)
    Remove when: the prompt path uses a scan op (or a parallel scan) under export.
    """

    def _rnn_scan(
        self: Any,
        hidden_states: torch.Tensor,
        recurrent_gate: torch.Tensor,
        reset: torch.Tensor,
        recurrent_states: torch.Tensor | None,
        acc_dtype: torch.dtype = torch.float32,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if hidden_states.shape[1] == 1:
            return original(self, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype)
        decay = (recurrent_gate * ~reset).type(acc_dtype).expand_as(hidden_states).transpose(0, 1)
        if recurrent_states is None:
            recurrent_states = torch.zeros(hidden_states[:, 0].shape, dtype=acc_dtype, device=hidden_states.device)
        last, states = _linear_recurrence(decay, hidden_states.type(acc_dtype).transpose(0, 1), recurrent_states.to(acc_dtype))
        return states.transpose(0, 1).type(hidden_states.dtype), last

    return _rnn_scan


@register_patch("dynamo", "transformers.models.rwkv.modeling_rwkv.rwkv_linear_attention_cpu", loaded_only=True)
def _patch_rwkv_attention_as_scan_op(_original: Any) -> Any:
    """RWKV's linear attention (the CPU path) as one ``torch.ops.higher_order.scan`` over the sequence
    instead of a Python loop.

    Pattern: ``for current_index in range(seq_length)`` updating the (numerator, denominator, max)
    state and writing ``output[:, current_index]``: under export the loop is unrolled and fixes the
    length ("axes asked to be dynamic ended static: input_ids[axis 1]"). The same max-stabilised
    arithmetic per step, in float32 as in the loop.
    Shapes: ``time_decay``, ``time_first`` (hidden,); ``key``, ``value`` (batch, length, hidden);
    ``state`` three (batch, hidden) tensors or None. Returns the output (batch, length, hidden) in
    ``key``'s dtype and the state (with ``return_state`` or a given state) else None.
    Models: RwkvModel, RwkvForCausalLM.
    Upstream: transformers models/rwkv/modeling_rwkv.py (``rwkv_linear_attention_cpu``);
        pytorch/pytorch#105279 (a Python loop over a dynamic length specialises it)
    Remove when: the CPU path uses a scan op under export.
    """
    from torch._higher_order_ops.scan import scan

    def rwkv_linear_attention_cpu(
        time_decay: torch.Tensor,
        time_first: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        state: list[torch.Tensor] | None = None,
        return_state: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        given_state = state is not None
        if state is None:
            zeros = torch.zeros_like(key[:, 0], dtype=torch.float32)
            state = [zeros, zeros.clone(), zeros - 1e38]
        else:  # the loop promotes a given state to float32 at its first step; the scan carry keeps one dtype
            state = [s.to(torch.promote_types(s.dtype, torch.float32)) for s in state]
        decay = -torch.exp(time_decay)

        def step(carry: list[torch.Tensor], position: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
            numerator, denominator, largest = carry
            k, v = position
            k = k.float()
            top = torch.maximum(largest, k + time_first)
            e1, e2 = torch.exp(largest - top), torch.exp(k + time_first - top)
            out = ((e1 * numerator + e2 * v) / (e1 * denominator + e2)).to(key.dtype)
            top = torch.maximum(largest + decay, k)
            e1, e2 = torch.exp(largest + decay - top), torch.exp(k - top)
            return [e1 * numerator + e2 * v, e1 * denominator + e2, top], out

        state, output = scan(step, list(state), [key.transpose(0, 1), value.transpose(0, 1)])
        return output.transpose(0, 1), (list(state) if return_state or given_state else None)

    return rwkv_linear_attention_cpu


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


@register_patch("dynamo", "torch.export.export")
def _patch_recurrent_layers_as_while_loops(original: Any) -> Any:
    """Trace ``nn.LSTM`` and ``nn.GRU`` as a ``while_loop`` over time when the export has dynamic shapes.

    Pattern: torch's decomposition of ``aten.lstm``/``aten.gru`` iterates over the time steps in
    Python (``for x in input.unbind(0)``), so under export the loop is unrolled and fixes the sequence
    length ("axes asked to be dynamic ended static: decoder_input_ids[axis 1]" for an RNN-T
    prediction network). torch ships while_loop-based decompositions for exactly this
    (``torch.export._patches.register_lstm_while_loop_decomposition`` and the GRU one), which
    torch.onnx enters around its own capture when given dynamic shapes; the DynamoExporter traces
    first, so the patch enters them around a ``torch.export.export`` call with ``dynamic_shapes``. A
    static export keeps the unrolled loop. Same cell arithmetic per step. The ops' cached kernel
    choice is cleared around the trace, so an earlier trace in the process does not keep the loop.
    Models: ParakeetForRNNT (.pt2 dynamic; its ONNX lowering then stops at a ``squeeze`` of the joint
        output), and the other users of ``nn.LSTM``: ParakeetForTDT, NemotronAsrStreamingForRNNT,
        the Nemotron 3.5 ASR RNN-T, EncodecModel's LSTM blocks.
    Upstream: pytorch/pytorch torch/_decomp/decompositions.py (``one_layer_lstm`` loops in Python);
        torch/export/_patches.py (the while_loop decompositions, opt-in)
    Remove when: torch.export uses the while_loop decompositions for dynamic exports by default.
    """
    from torch.export._patches import register_gru_while_loop_decomposition, register_lstm_while_loop_decomposition

    def forget_dispatch() -> None:
        # an op caches the kernel it chose per dispatch key: an earlier trace in this process would
        # keep the loop decomposition, and ours would outlive the block
        for op in (torch.ops.aten.lstm.input, torch.ops.aten.gru.input):
            op._dispatch_cache.clear()

    @functools.wraps(original)
    def export(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("dynamic_shapes"):
            return original(*args, **kwargs)
        forget_dispatch()
        try:
            with register_lstm_while_loop_decomposition(), register_gru_while_loop_decomposition():
                return original(*args, **kwargs)
        finally:
            forget_dispatch()

    return export


@register_patch(
    "dynamo",
    "transformers.models.longformer.modeling_longformer.LongformerSelfAttention.forward",
    "transformers.models.led.modeling_led.LEDEncoderSelfAttention.forward",
    loaded_only=True,
)
def _patch_longformer_attention_dense(original: Any) -> Any:
    """Longformer's sliding-window plus global self-attention written as masked dense attention, so
    that neither the number of global tokens nor the number of window chunks becomes a tensor value.

    Pattern: the encoder reads ``is_index_global_attn.any().item()`` and the layer branches on it in
    Python (``GuardOnDataDependentSymNode: Eq(u0, 1)``); the global path gathers the global tokens
    with ``nonzero`` into tensors sized by the largest count in the batch and fails on a batch
    without global tokens (``view(0, -1)``); the window chunking computes chunk counts with
    ``torch.div`` on sizes, a tensor read back as a size (``2*u4 - 1 < 0`` with a dynamic length).
    The same attention as one masked softmax: query ``i`` attends key ``j`` when ``|i - j| <=
    window`` and ``j`` is a local (unpadded, not global) token, or when ``j`` is a global token, with
    the scaled ``query``/``key`` projections; a global token's own output is then full attention
    with the ``*_global`` projections over the unpadded keys; padded queries output 0. Equal to the
    method's output up to float summation order.
    Cost: scores are (batch, heads, length, length), as in a full-attention encoder, where the
    method's windows keep them linear in the length: memory grows with the square of the length.
    Shapes: ``hidden_states`` (batch, length, hidden), length a multiple of the attention window (the
    model pads); ``attention_mask`` (batch, length) float, negative = padding, 0 = local, positive
    = global; ``is_index_masked`` and ``is_index_global_attn`` (batch, length) bool. Returns
    ``(attn_output,)``, (batch, length, hidden). With ``output_attentions`` the method itself runs
    (its attention-probability layout is the windowed one).
    Models: LongformerModel and its heads, LEDModel and its heads (LED's encoder).
    Upstream: transformers models/longformer/modeling_longformer.py
        (``LongformerSelfAttention.forward``, ``_get_global_attn_indices``, ``_chunk``);
        models/led/modeling_led.py (``LEDEncoderSelfAttention``, a copy); no report found
    Remove when: the attention has no Python branch on ``is_global_attn``, no ``nonzero``-sized
        tensors and integer chunk counts.
    """

    @functools.wraps(original)
    def forward(
        self: Any,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        is_index_masked: torch.Tensor | None = None,
        is_index_global_attn: torch.Tensor | None = None,
        is_global_attn: Any = None,
        output_attentions: bool = False,
    ) -> Any:
        if output_attentions:
            return original(self, hidden_states, attention_mask, is_index_masked, is_index_global_attn, is_global_attn, output_attentions)
        batch, length, _ = hidden_states.shape
        heads, head_dim, window = self.num_heads, self.head_dim, self.one_sided_attn_window_size
        dropout = self.dropout if self.training else 0.0
        scale = 1.0 / math.sqrt(head_dim)

        def heads_first(x: torch.Tensor) -> torch.Tensor:  # (batch, length, hidden) -> (batch, heads, length, head_dim)
            return x.reshape(batch, length, heads, head_dim).transpose(1, 2)

        positions = torch.arange(length, device=hidden_states.device)
        in_window = (positions[None, :] - positions[:, None]).abs() <= window  # (length, length)
        local_key = attention_mask == 0  # (batch, length): neither padding nor global
        allowed = (in_window[None] & local_key[:, None, :]) | is_index_global_attn[:, None, :]
        allowed = allowed | is_index_masked[:, :, None]  # padded queries (zeroed below) never see an empty row
        output = nn.functional.scaled_dot_product_attention(
            heads_first(self.query(hidden_states)),
            heads_first(self.key(hidden_states)),
            heads_first(self.value(hidden_states)),
            attn_mask=allowed[:, None],
            dropout_p=dropout,
            scale=scale,
        )
        global_output = nn.functional.scaled_dot_product_attention(
            heads_first(self.query_global(hidden_states)),
            heads_first(self.key_global(hidden_states)),
            heads_first(self.value_global(hidden_states)),
            attn_mask=~is_index_masked[:, None, None, :],
            dropout_p=dropout,
            scale=scale,
        )
        output = torch.where(is_index_global_attn[:, None, :, None], global_output, output)
        output = output.masked_fill(is_index_masked[:, None, :, None], 0.0)
        return (output.transpose(1, 2).reshape(batch, length, heads * head_dim),)

    return forward


@register_patch("dynamo", "torch.distributions.distribution.Distribution._validate_args")
def _patch_distributions_skip_argument_validation(_original: Any) -> bool:
    """``torch.distributions`` without argument validation while the model is traced.

    Pattern: a model builds a distribution in its forward (BLT's entropy patcher:
    ``Categorical(logits=logits).entropy()``); with validation on (the default, ``__debug__``) the
    constructor checks its parameters against their constraints and branches on the result, a data
    value (``GuardOnDataDependentSymNode: Eq(u0, 1)`` in ``torch._is_all_true``). The class default
    is False for the duration of the export, as ``Distribution.set_default_validate_args(False)``
    would set it; a distribution built with ``validate_args=True`` still validates. The exported
    program computes the same values; it does not raise on invalid parameters as eager would.
    Models: BltModel and BltForCausalLM (the entropy patcher); any forward that builds a
    ``torch.distributions`` object.
    Upstream: pytorch/pytorch torch/distributions/distribution.py (``Distribution.__init__`` checks
        ``torch._is_all_true(valid)`` in Python); no report found
    Remove when: distribution validation traces as a runtime assertion (``torch._check``) instead
        of a Python branch.
    """
    return False


@register_patch("dynamo", "transformers.models.encodec.modeling_encodec.EncodecModel.encode", loaded_only=True)
def _patch_encodec_single_frame_without_range(original: Any) -> Any:
    """Encodec's encoder, for a config without chunking, run on the whole waveform without a loop over offsets.

    Pattern: ``for offset in range(0, input_length, stride)`` cuts the waveform into frames; with
    ``chunk_length`` None the stride is the input length itself, so the loop runs once, but under
    export ``range`` over a symbolic length guards on its exact value (``Eq(s2, 3200)``) and the
    length of ``input_values`` ends static. With no chunking the patch encodes the masked waveform
    as the single frame (offset 0, the whole length), stacks it as ``(1, batch, quantizers,
    frames)`` and reports no last-frame padding, as the loop does; a chunked config (48 kHz) keeps
    the method.
    Models: EncodecModel (dynamic).
    Upstream: transformers models/encodec/modeling_encodec.py (``EncodecModel.encode``); no report found
    Remove when: the encoder skips the frame loop when ``chunk_length`` is None.
    """

    @functools.wraps(original)
    def encode(self: Any, input_values: torch.Tensor, padding_mask: torch.Tensor | None = None, bandwidth: float | None = None, return_dict: bool | None = None) -> Any:
        from transformers.models.encodec.modeling_encodec import EncodecEncoderOutput

        channels = input_values.shape[1] if input_values.dim() == 3 else None
        if self.config.chunk_length is not None or channels not in (1, 2):
            return original(self, input_values, padding_mask, bandwidth, return_dict)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        bandwidth = self.config.target_bandwidths[0] if bandwidth is None else bandwidth
        if bandwidth not in self.config.target_bandwidths:
            return original(self, input_values, padding_mask, bandwidth, return_dict)  # raises the model's error
        if padding_mask is None:
            padding_mask = torch.ones_like(input_values).bool()
        else:
            padding_mask = padding_mask.view(padding_mask.shape[0], -1, padding_mask.shape[-1])
            padding_mask = padding_mask[..., : input_values.shape[-1]]  # the loop's one frame: [0, length)
        encoded_frame, scale = self._encode_frame(padding_mask.bool() * input_values, bandwidth)
        encoded_frames, scales = encoded_frame.unsqueeze(0), [scale]
        if not return_dict:
            return (encoded_frames, scales, 0)
        return EncodecEncoderOutput(encoded_frames, scales, 0)

    return encode


@register_patch("dynamo", "transformers.models.encodec.modeling_encodec.EncodecModel.decode", loaded_only=True)
def _patch_encodec_decode_trims_without_a_branch(original: Any) -> Any:
    """Encodec's decoder output cut to the padding mask's length by a slice alone, without comparing lengths.

    Pattern: ``if padding_mask.shape[-1] < audio_values.shape[-1]: audio_values = audio_values[..., :n]``.
    The decoder rounds the length up to a multiple of the hop length; at an export length that already
    is one the branch is not taken, and the program never cuts (a 3,203-sample input came back with
    3,520 samples). A slice past the end is a no-op, so the patch decodes without the mask and always
    slices to the mask's length: the same samples on both sides of the branch.
    Models: EncodecModel (dynamic).
    Upstream: transformers models/encodec/modeling_encodec.py (``EncodecModel.decode``); no report found
    Remove when: the decoder slices unconditionally.
    """

    @functools.wraps(original)
    def decode(self: Any, audio_codes: torch.Tensor, audio_scales: Any, padding_mask: torch.Tensor | None = None, *args: Any, **kwargs: Any) -> Any:
        decoded = original(self, audio_codes, audio_scales, None, *args, **kwargs)
        if padding_mask is None:
            return decoded
        length = padding_mask.shape[-1]
        if isinstance(decoded, tuple):
            return (decoded[0][..., :length], *decoded[1:])
        decoded.audio_values = decoded.audio_values[..., :length]
        return decoded

    return decode


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


@register_patch("dynamo", "transformers.models.pixtral.modeling_pixtral.PixtralVisionModel.forward", loaded_only=True)
def _patch_pixtral_same_size_images_batched(original: Any) -> Any:
    """Pixtral's vision encoder on a batch of full-size images (no ``image_sizes``), packed without
    per-image Python lists.

    Pattern: without ``image_sizes`` the forward builds ``[(height, width)] * batch_size`` and then
    walks the images in Python (crop each patch grid, flatten, positions per image, a block mask
    filled block by block), which fixes the batch size (``Eq(s99, 2)``). When every image is the
    full size each grid is the whole convolution output, so the patch packs the grids with one
    reshape, (batch * h * w, hidden), repeats one grid's (row, column) positions per image and
    builds the block-diagonal mask from each token's image index: the same sequence, positions and
    mask. Calls with ``image_sizes`` (images of different sizes) or flash attention keep the
    method's body; the method's decorators (config defaults, output capturing) wrap both.
    Models: PixtralVisionModel (dynamic batch).
    Upstream: transformers models/pixtral/modeling_pixtral.py (``PixtralVisionModel.forward``); no report found
    Remove when: the encoder packs same-size images without Python lists over the batch.
    """
    import inspect

    from transformers.utils.generic import is_flash_attention_requested, merge_with_config_defaults
    from transformers.utils.output_capturing import capture_outputs

    body = inspect.unwrap(original)
    if getattr(getattr(original, "__wrapped__", None), "__wrapped__", None) is not body:
        return original  # not the two decorators this patch rebuilds: the method as it is

    def forward(self: Any, pixel_values: torch.Tensor, image_sizes: torch.Tensor | None = None, **kwargs: Any) -> Any:
        if image_sizes is not None or is_flash_attention_requested(self.config):
            return body(self, pixel_values, image_sizes, **kwargs)
        patch_embeds = self.patch_conv(pixel_values.to(dtype=self.patch_conv.weight.dtype))  # (batch, hidden, h, w)
        batch, hidden, rows, columns = patch_embeds.shape
        per_image = rows * columns
        packed = self.ln_pre(patch_embeds.flatten(2).transpose(1, 2).reshape(1, batch * per_image, hidden))
        row_ids, column_ids = torch.meshgrid(
            torch.arange(rows, device=packed.device), torch.arange(columns, device=packed.device), indexing="ij"
        )
        grid = torch.stack([row_ids.flatten(), column_ids.flatten()], dim=-1)  # (h * w, 2)
        position_embeddings = self.patch_positional_embedding(packed, grid.repeat(batch, 1))
        image = torch.arange(batch * per_image, device=packed.device) // per_image
        same_image = image[:, None] == image[None, :]
        blocked = torch.full((), torch.finfo(packed.dtype).min, dtype=packed.dtype, device=packed.device)
        attention_mask = torch.where(same_image, torch.zeros((), dtype=packed.dtype, device=packed.device), blocked)
        return self.transformer(packed, attention_mask=attention_mask[None, None], position_embeddings=position_embeddings, **kwargs)

    forward.__name__, forward.__qualname__, forward.__doc__ = body.__name__, body.__qualname__, body.__doc__
    return merge_with_config_defaults(capture_outputs(forward))


@register_patch("dynamo", "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer.length_regulator", loaded_only=True)
def _patch_fastspeech2_length_regulator_gathered(original: Any) -> Any:
    """FastSpeech 2's length regulator as one gather over frames, without a branch on the durations' sum
    or a loop over the batch.

    Pattern: ``if duration_labels.sum() == 0: ...`` branches on tensor data (``Eq(u0, 1)``), then each
    sample's token embeddings are repeated by ``repeat_interleave(embedding, duration)`` in a Python
    loop and written into a ``(batch, max_len, hidden)`` buffer. The patch keeps the rule (when every
    duration of the batch is 0, rows whose durations sum to 0 take 1 per token) with ``torch.where``,
    and fills frame ``f`` of sample ``b`` with the token whose duration span holds it (the count of
    cumulative durations <= ``f``), zero past the sample's total: the same ``(batch, max_len, hidden)``
    float tensor. ``max_len`` (frames, the largest total) stays a data-dependent size; the comparison
    costs batch x frames x tokens booleans.
    Models: FastSpeech2ConformerModel, FastSpeech2ConformerWithHifiGan.
    Upstream: transformers models/fastspeech2_conformer/modeling_fastspeech2_conformer.py (``length_regulator``); no report found
    Remove when: the regulator expands durations without a data-dependent branch or per-sample loop.
    """

    @functools.wraps(original)
    def length_regulator(encoded_embeddings: torch.Tensor, duration_labels: torch.Tensor, speaking_speed: float = 1.0) -> torch.Tensor:
        if speaking_speed <= 0 or encoded_embeddings.dim() != 3 or duration_labels.dim() != 2:
            return original(encoded_embeddings, duration_labels, speaking_speed)  # raises the model's error
        if speaking_speed != 1.0:
            duration_labels = torch.round(duration_labels.float() * speaking_speed).long()
        per_sample = duration_labels.sum(dim=1)  # (batch,)
        refill = per_sample.eq(0) & per_sample.sum().eq(0)
        duration_labels = torch.where(refill[:, None], torch.ones_like(duration_labels), duration_labels)
        ends = duration_labels.cumsum(dim=1)  # (batch, tokens): each token's last frame + 1
        totals = ends[:, -1]
        frames = torch.arange(totals.max().item(), device=ends.device)  # (max_len,)
        token = (ends[:, None, :] <= frames[None, :, None]).sum(dim=-1).clamp(max=encoded_embeddings.shape[1] - 1)
        picked = encoded_embeddings.gather(1, token[..., None].expand(-1, -1, encoded_embeddings.shape[2]))
        inside = frames[None, :] < totals[:, None]  # (batch, max_len)
        return torch.where(inside[..., None], picked, torch.zeros((), dtype=picked.dtype, device=picked.device)).float()

    return length_regulator


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


@register_patch("dynamo", "transformers.models.kimi_k25.modeling_kimi_k25.get_vision_frame_index", loaded_only=True)
def _patch_kimi_frame_index_symbolic(original: Any) -> Any:
    """Kimi-K2.5's per-patch frame index computed for every clip at once, the grid kept as symbols.

    Pattern: ``for t, h, w in grid_thw.tolist(): t, h, w = int(t), int(h), int(w)``; the grid is data,
    so ``int()`` stops the trace ("Could not extract specialized integer from data-dependent
    expression u4") in static exports too. Patch ``p`` of a clip of ``t`` frames of ``h x w`` patches
    is in frame ``p // (h * w)``; the index is that frame + 1 for a clip of more than one frame and 0
    for an image: the same (sum of t * h * w,) int64 index. A precomputed ``frame_index`` in
    ``kwargs`` is still popped and returned.
    Models: Kimi_K25VisionModel (and the models around it).
    Upstream: transformers models/kimi_k25/modeling_kimi_k25.py (``get_vision_frame_index``; its
        docstring asks exporters to pass the index precomputed); no report found
    Remove when: transformers computes the index without Python ints.
    """

    def get_vision_frame_index(grid_thw: torch.Tensor, kwargs: dict | None = None) -> torch.Tensor:
        if kwargs is not None and kwargs.get("frame_index") is not None:
            return original(grid_thw, kwargs=kwargs)
        grid = grid_thw.long()
        image, item = _packed_positions(grid[:, 0] * grid[:, 1] * grid[:, 2])
        frames = grid[image, 0]
        return item // (grid[image, 1] * grid[image, 2]) + (frames > 1).long()

    return functools.wraps(original)(get_vision_frame_index)


@register_patch("dynamo", "transformers.models.kimi_k25.modeling_kimi_k25.get_vision_temporal_merge_index", loaded_only=True)
def _patch_kimi_temporal_merge_index_symbolic(original: Any) -> Any:
    """Kimi-K2.5's temporal-pooling gather index computed for every clip at once, the grid kept as symbols.

    Pattern: ``for t, h, w in grid_thw.tolist(): t, h, w = int(t), int(h), int(w)`` builds, clip by
    clip, the ``(merged tokens, t, kh * kw)`` index of the patches each merged token pools; ``int()``
    of data stops the trace. The clips of one call share ``t`` (the model concatenates their rows), so
    the patch reads ``t`` once, checks at run time that every clip has it, and gives merged token
    ``(block row, block column)`` of a clip, frame ``f`` and kernel cell ``(i, j)`` the patch
    ``clip start + f * h * w + (block row * kh + i) * w + block column * kw + j``: the same int64
    index. A precomputed ``temporal_merge_index`` in ``kwargs`` is still popped and returned.
    Models: Kimi_K25VisionModel (and the models around it).
    Upstream: transformers models/kimi_k25/modeling_kimi_k25.py (``get_vision_temporal_merge_index``);
        no report found
    Remove when: transformers computes the index without Python ints.
    """

    def get_vision_temporal_merge_index(grid_thw: torch.Tensor, kernel_height: int, kernel_width: int, kwargs: dict | None = None) -> torch.Tensor:
        if kwargs is not None and kwargs.get("temporal_merge_index") is not None:
            return original(grid_thw, kernel_height, kernel_width, kwargs=kwargs)
        grid = grid_thw.long()
        frames = grid[0, 0].item()
        torch._check(frames >= 1)
        torch._check((grid[:, 0] == frames).all().item(), lambda: "grid_thw: clips with different frame counts")
        heights, widths = grid[:, 1], grid[:, 2]
        blocks_w = widths // kernel_width
        image, token = _packed_positions((heights // kernel_height) * blocks_w)  # merged tokens
        cells = kernel_height * kernel_width
        # one flat position per (merged token, frame, kernel cell), decoded without broadcasting
        # between data-dependent sizes
        flat = torch.arange(token.shape[0] * frames * cells, device=grid.device)
        merged, frame, cell = flat // (frames * cells), (flat // cells) % frames, flat % cells
        image, token = image[merged], token[merged]
        width = widths[image]
        row = (token // blocks_w[image]) * kernel_height + cell // kernel_width
        col = (token % blocks_w[image]) * kernel_width + cell % kernel_width
        counts = grid[:, 0] * heights * widths
        start = (torch.cumsum(counts, 0) - counts)[image]
        index = start + frame * (heights * widths)[image] + row * width + col
        return index.view(-1, frames, cells)

    return functools.wraps(original)(get_vision_temporal_merge_index)


def _merge_block_coordinates(grid: torch.Tensor, merge: torch.Tensor, image: torch.Tensor, item: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) in its frame of each patch laid out block-major: frame after frame, ``m x m``
    merge blocks in row-major order (``m = merge[image]``), the block's patches row-major inside it.

    ``grid`` (images, 3) int64 ``(t, h, w)``; ``image`` and ``item`` (patches,): each patch's image
    and place within it (:func:`_packed_positions`). Returns two (patches,) int64 tensors."""
    width = grid[image, 2]
    m = merge[image]
    q = item % (grid[image, 1] * width)  # place within the frame
    blocks_w = width // m
    block, inside = q // (m * m), q % (m * m)
    return (block // blocks_w) * m + inside // m, (block % blocks_w) * m + inside % m


@register_patch("dynamo", "transformers.vision_utils.get_vision_position_ids", "transformers.models.*.modeling_*.get_vision_position_ids")
def _patch_vision_position_ids_symbolic(original: Any) -> Any:
    """Rotary position ids of packed vision patches computed for every image at once, the number of
    images and their grids kept as symbols.

    Pattern: ``get_vision_position_ids(grid_thw, merge)`` loops over ``zip(grid_thw.tolist(),
    merge.tolist())`` and builds each image's ids with ``meshgrid``; the Python loop fixes the number
    of images (a dynamic ``grid_thw`` axis 0 ends static, "You marked n as dynamic but your code
    specialized it to be a constant (2)"). Each patch's (row, column) in block-major order comes from
    its place in its image (:func:`_merge_block_coordinates`), with the frame index in front when
    ``include_temporal``: the same (sum of t * h * w, 2 or 3) int64 ids. A precomputed
    ``position_ids`` in ``kwargs`` is still popped and returned.
    Models: the Qwen2-VL family and the vision towers that share transformers' helper (Qwen2.5/3/3.5-VL,
        GLM-4V, GLM-OCR, GLM-Image, HunYuan-VL, LFM3-VL, PaddleOCR-VL, MiniMax-M3-VL, Kimi-K2.5,
        VideoLLaMA3, ...).
    Upstream: transformers ``vision_utils.get_vision_position_ids`` (its docstring asks exporters to
        pass the ids precomputed); no report found
    Remove when: transformers computes the ids without a Python loop over the images.
    """

    def get_vision_position_ids(grid_thw: torch.Tensor, spatial_merge_size: Any, include_temporal: bool = False, kwargs: dict | None = None) -> torch.Tensor:
        if kwargs is not None and kwargs.get("position_ids") is not None:
            return original(grid_thw, spatial_merge_size, include_temporal=include_temporal, kwargs=kwargs)
        grid = grid_thw.long()
        if isinstance(spatial_merge_size, int):
            merge = torch.full_like(grid[:, 0], spatial_merge_size)
        else:
            merge = torch.as_tensor(spatial_merge_size, device=grid.device).long().reshape(-1).expand(grid.shape[0])
        image, item = _packed_positions(grid[:, 0] * grid[:, 1] * grid[:, 2])
        row, col = _merge_block_coordinates(grid, merge, image, item)
        if include_temporal:
            return torch.stack([item // (grid[image, 1] * grid[image, 2]), row, col], dim=-1)
        return torch.stack([row, col], dim=-1)

    return functools.wraps(original)(get_vision_position_ids)


@register_patch("dynamo", "transformers.models.video_llama_3.modeling_video_llama_3.VideoLlama3VisionModel.pixel_unshuffle", loaded_only=True)
def _patch_videollama3_pixel_unshuffle_gathered(original: Any) -> Any:
    """VideoLLaMA3's merge-block downsampling of every image at once, as a gather of each block's centre.

    Pattern: ``hidden_states.split(grid_thw.prod(dim=1).tolist())`` and, per image, a view back to the
    raster ``(t, h, w, c)`` and a bilinear ``interpolate`` to ``(h / m, w / m)``; the grid is data,
    so the views guard on its values ("Could not guard on data-dependent expression 64*u12*u13*u6 <
    2") in static exports too. Downsampling by exactly ``m`` (bilinear, no corner alignment) samples
    each ``m x m`` block at its centre, ``(m - 1) / 2`` from its first row and column: the mean of the
    block's middle two rows and columns for an even ``m``, its middle patch for an odd one. The input
    holds each block's patches on ``m * m`` consecutive rows, so the patch gathers those rows for
    every block of every image at once: the same (sum of t * h * w / m^2, channels) output, blocks in
    the order the model emits them.
    Models: VideoLlama3VisionModel (and the models around it).
    Upstream: transformers models/video_llama_3/modeling_video_llama_3.py (``VideoLlama3VisionModel.pixel_unshuffle``);
        no report found
    Remove when: the downsampling is computed without a per-image loop.
    """

    @functools.wraps(original)
    def pixel_unshuffle(self: Any, hidden_states: torch.Tensor, grid_thw: torch.Tensor, merge_sizes: torch.Tensor) -> torch.Tensor:
        if hidden_states.dim() != 2:
            return original(self, hidden_states, grid_thw, merge_sizes)
        grid = grid_thw.long()
        m = torch.as_tensor(merge_sizes, device=grid.device).long().reshape(-1).expand(grid.shape[0])
        per_block = m * m
        blocks = grid[:, 0] * (grid[:, 1] // m) * (grid[:, 2] // m)
        image, block = _packed_positions(blocks)
        image_start = (torch.cumsum(grid[:, 0] * grid[:, 1] * grid[:, 2], 0) - grid[:, 0] * grid[:, 1] * grid[:, 2])[image]
        size = m[image]
        first = image_start + block * per_block[image]  # the block's first row
        low, high = (size - 1) // 2, size // 2  # the centre rows (and columns) inside the block
        corners = [first + r * size + c for r in (low, high) for c in (low, high)]
        picked = torch.stack([hidden_states[index] for index in corners], dim=0)  # (4, blocks, channels)
        return picked.mean(dim=0)

    return pixel_unshuffle
