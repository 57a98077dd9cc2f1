"""Audio codecs and speech models: model patches (DynamoExporter Stage 2, applied for every backend).

Pattern: lengths of a waveform or of frames handled in Python: padded convolutions that keep their
geometry in int64 buffers read back with ``.item()`` (Encodec, Mimi), a loop over frame offsets and
a length comparison before trimming (Encodec), attention windows counted per sample in Python
(Qwen3-ASR), durations expanded token by token (FastSpeech 2's length regulator). The patches
compute the same paddings, windows and frames from Python ints or tensor ops.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ...registry import register_patch
from .._packing import packed_positions


def _window_starts(lengths: torch.Tensor, window: Any) -> torch.Tensor:
    """Cumulative boundaries of every sample cut into windows of ``window`` positions, int32.

    ``lengths`` (batch,): each sample's packed length, samples back to back. A window starts at each
    sample's start and every ``window`` positions within it, the last one cut short (an empty sample has
    none). Returns (windows + 1,): the start of each window, then the packed total; the window count is
    read from the data (an unbacked size).
    """
    _, local = packed_positions(lengths)
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
