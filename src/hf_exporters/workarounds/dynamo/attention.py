"""Attention implementations that cannot be traced as written: model patches (DynamoExporter Stage 2,
applied for every backend).

Pattern: attention code that branches in Python on a sequence length (transformers' SDPA integration
decides ``is_causal`` from ``q_len > 1``), attends piece by piece over packed sequences
(``torch.split`` by ``cu_seqlens.tolist()`` in vision and audio towers), or gathers global tokens
and window chunks into tensors sized from the data (Longformer, LED). Each is written here as one
SDPA call with a mask that holds the same structure (causal, block-diagonal, windowed plus global).
"""

from __future__ import annotations

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
