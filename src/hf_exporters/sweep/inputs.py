"""Example inputs for a tiny model, from its forward signature, its config and its modality."""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from ..errors import InputError

BATCH = 2
SEQ = 8
DECODER_SEQ = 4
AUDIO_SAMPLES = 3200
AUDIO_FRAMES = 32


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _sub(config: Any, *names: str) -> Any:
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "to_dict"):
            return sub
    return config


#: model_type -> ((height, width), why): images of a size the config does not tell, as the processor gives them
IMAGE_SIZES: dict[str, tuple[tuple[int, int], str]] = {
    "pp_ocrv5_mobile_rec": (
        (48, 320),
        "a text-line recogniser: the processor resizes to 48 pixels high and pads to 320 wide, and the model"
        " pools the last feature map (3 high) with a (3, 2) window",
    ),
}


def _image(config: Any) -> torch.Tensor:
    """``pixel_values`` ``(batch, channels, height, width)`` at the (vision) config's ``image_size`` (64 when it names
    none), or at the processor's size for the families of :data:`IMAGE_SIZES`."""
    # ``encoder``: VisionEncoderDecoderConfig names its image encoder's config so
    vision = _sub(config, "vision_config", "image_config", "backbone_config", "encoder_config", "encoder")
    size = _get(vision, "image_size", default=None) or _get(config, "image_size", default=64)
    if isinstance(size, dict):
        size = size.get("height", 64)
    height, width = (size, size) if isinstance(size, int) else tuple(size)[:2]
    if getattr(config, "model_type", None) in IMAGE_SIZES:
        height, width = IMAGE_SIZES[config.model_type][0]
    channels = _get(vision, "num_channels", default=None) or _get(config, "num_channels", default=3)
    return torch.randn(BATCH, channels, height, width)


def _vision(config: Any) -> Any:
    return _sub(config, "vision_config", "backbone_config", "encoder_config")


def _channels(config: Any) -> int:
    return int(_get(config, "in_channels", "num_channels", "in_chans", default=3))


def _patch(config: Any) -> int:
    size = _get(config, "patch_size", default=14)
    return int(size[-1] if isinstance(size, (list, tuple)) else size)


#: model_type -> (patch layout, why): vision towers on flattened patches whose processor lays the patches out
#: otherwise than one row per patch. ``"patch image"``: each patch a ``(channels, patch_size, patch_size)`` image;
#: ``"merged block"``: one ``(merge * patch_size, merge * patch_size, channels)`` block of pixels per merged token,
#: in [-1, 1], with the grid counted in merged tokens.
PATCH_LAYOUTS: dict[str, tuple[str, str]] = {
    "kimi_k25_vision": (
        "patch image",
        "the image processor keeps each patch as a small image and the patch Conv2d reads it as given",
    ),
    "inkling2_vision": (
        "merged block",
        "the processor gives one block of pixels (channels last) per language-model image token and counts"
        " image_grid_thw in those tokens; the embedding cuts each block into merge x merge patches itself",
    ),
}


#: model_type -> why the model matches an image pair without a ``keypoint_detector_config`` to tell it
IMAGE_PAIRS: dict[str, str] = {
    "efficientloftr": "a detector-free matcher: its own backbone reads both images of the pair",
}

#: model_type -> why: families whose forward runs on one sample only; every batch-first input is cut to batch 1
SINGLE_SAMPLE: dict[str, str] = {
    "tvp": "the frame position embeddings are viewed as (batch, 1, width, hidden) from a (width, hidden) table,"
    " which holds for batch 1 only (as TVP's processor and examples feed one video)",
}


def _flat_patches(config: Any, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattened patches and their grid for a vision tower that takes one token row per patch.

    Returns ``(patches, grid_thw)``: ``grid_thw`` is ``[[1, h, w]]`` (int64, shape ``(1, 3)``) with ``h = w = 2 *
    merge`` (the config's spatial merge size, or the side of its ``merge_kernel_size``) and ``patches`` has shape
    ``(h * w, channels * temporal_patch_size * patch_size ** 2)``. The families of :data:`PATCH_LAYOUTS` get their
    processor's layout: ``(h * w, channels, patch_size, patch_size)``, or ``h = w = 2`` merged tokens and ``(4, merge *
    patch_size, merge * patch_size, channels)``.
    """
    kernel = _get(config, "merge_kernel_size", default=None)
    merge = int(_get(config, "spatial_merge_size", "merge_size", default=None) or (max(kernel) if kernel else 1))
    side = 2 * merge
    temporal = int(_get(config, "temporal_patch_size", "patch_temporal", default=1))
    channels, patch = _channels(config), _patch(config)
    layout = PATCH_LAYOUTS.get(getattr(config, "model_type", None), ("row", ""))[0]
    if layout == "patch image":
        return torch.randn(side * side, channels, patch, patch, generator=generator), torch.tensor([[1, side, side]])
    if layout == "merged block":
        block = torch.rand(4, merge * patch, merge * patch, channels, generator=generator) * 2 - 1
        return block, torch.tensor([[1, 2, 2]])
    width = channels * temporal * patch**2
    return torch.randn(side * side, width, generator=generator), torch.tensor([[1, side, side]])


def _frames(config: Any) -> int:
    """Frame count for a video input: the config's ``num_frames`` (or ``frames_per_clip``), at least one tubelet."""
    frames = _get(config, "num_frames", "frames_per_clip", default=None)
    tubelet = _get(config, "tubelet_size", default=1)
    tubelet = int(tubelet[0] if isinstance(tubelet, (list, tuple)) else tubelet)
    return int(frames) if frames else 2 * tubelet


def _video(config: Any, generator: torch.Generator) -> torch.Tensor:
    """A clip of shape ``(batch, frames, channels, height, width)`` at the vision config's image size."""
    vision = _vision(config)
    image = _image(config)
    frames = _frames(vision) if _get(vision, "num_frames", "frames_per_clip") else _frames(config)
    return torch.randn(BATCH, frames, *image.shape[1:], generator=generator)


def _is_video(model: torch.nn.Module, config: Any) -> bool:
    """Whether ``pixel_values`` is a clip: the config counts frames (``num_frames``), or the model reads video and
    no still image (its ``input_modalities``)."""
    if _get(_vision(config), "num_frames", default=None) is not None or _get(config, "num_frames", default=None) is not None:
        return True
    modalities = getattr(model, "input_modalities", ())
    modalities = (modalities,) if isinstance(modalities, str) else tuple(modalities)
    return "video" in modalities and "image" not in modalities


def _front_end(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's first ``Conv1d``, ``Conv2d`` or ``Linear`` layer (in registration order), or ``None``.

    An audio model registers the layer that reads its input first, so its width tells the input layout.
    """
    layers = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear)
    return next((m for m in model.modules() if isinstance(m, layers)), None)


def _configs(config: Any) -> list[Any]:
    """``config`` and its nested sub-configs, depth first."""
    found = [config]
    for value in vars(config).values():
        if hasattr(value, "to_dict") and value is not config:
            found.extend(_configs(value))
    return found


_MEL_FIELDS = ("num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels")


def _audio(config: Any) -> Any:
    """The config that describes the audio input: the audio or encoder sub-config, else the first config of the tree
    that names a mel-bin count, else ``config``."""
    audio = _sub(config, "audio_config", "encoder_config")
    if _get(audio, *_MEL_FIELDS) is None:
        audio = next((c for c in _configs(config) if _get(c, *_MEL_FIELDS) is not None), audio)
    return audio


def _features(model: torch.nn.Module, config: Any, frames: int | None = None) -> tuple[torch.Tensor, int]:
    """Log-mel ``input_features`` and the index of their time axis.

    ``mel`` is the audio config's mel-bin count (128 when it names none). Layouts, first match wins:

    - whisper-like encoders (``max_source_positions`` with ``num_mel_bins``): ``(batch, mel, 2 * positions)``;
    - speech_to_text (``input_feat_per_channel``): ``(batch, 32, mel * input_channels)``;
    - spectrograms read as images (``patch_embed_input_channels``): ``(batch, channels, 32, mel)``;
    - a front end ``Conv1d`` reading ``mel`` channels: ``(batch, mel, 32)``;
    - a front end ``Linear`` reading ``k * mel`` features with ``k > 1`` that the config does not stack itself
      (no ``subsampling_factor``/``num_stacked_frames`` equal to ``k``), or a ``feature_projection_input_dim`` in
      the config tree: frames already stacked, ``(batch, 32, k * mel)`` (or that width);
    - otherwise ``(batch, 32, mel)``.

    ``frames`` replaces the 32 frames (the whisper-like count stays fixed by the position table).
    """
    audio = _audio(config)
    mel = _get(audio, *_MEL_FIELDS, default=128)
    count = frames or AUDIO_FRAMES
    source = _get(audio, "max_source_positions", default=None)
    if getattr(audio, "model_type", "") in ("whisper",) or (source and _get(audio, "num_mel_bins") and "whisper" in type(audio).__name__.lower()):
        return torch.randn(BATCH, mel, 2 * source), 2
    channels = _get(audio, "input_channels", default=1)
    if _get(audio, "input_feat_per_channel") is not None:  # speech_to_text: (batch, frames, features)
        return torch.randn(BATCH, count, mel * channels), 1
    image_channels = _get(audio, "patch_embed_input_channels", default=None)
    if image_channels is not None:  # a spectrogram as an image: (batch, channels, frames, mel)
        return torch.randn(BATCH, int(image_channels), count, mel), 2
    if source and _get(audio, "num_mel_bins") is not None:  # whisper-like encoders: (batch, mel, 2 * positions)
        return torch.randn(BATCH, mel, 2 * source), 2
    layer = _front_end(model)
    if isinstance(layer, torch.nn.Conv1d) and layer.in_channels == mel:  # mel bins as conv channels
        return torch.randn(BATCH, mel, count), 2
    width = next((c.feature_projection_input_dim for c in _configs(config) if _get(c, "feature_projection_input_dim")), None)
    if width is None and isinstance(layer, torch.nn.Linear) and layer.in_features % mel == 0:
        stack = layer.in_features // mel
        if stack > 1 and stack != _get(audio, "subsampling_factor", "num_stacked_frames", default=None):
            width = layer.in_features
    return torch.randn(BATCH, count, int(width or mel)), 1


def _audio_inputs(
    model: torch.nn.Module,
    config: Any,
    names: set[str],
    generator: torch.Generator,
    samples: int | None,
    tokens: int | None,
    mask: str | None = None,
) -> dict[str, torch.Tensor]:
    """``input_features`` (:func:`_features`) and, when the forward takes it, ``input_features_mask``.

    ``mask``: another name for the frame mask (a forward whose one ``attention_mask`` covers the features); the
    stacked-frame and chunked layouts below apply to ``input_features_mask`` only.

    ``samples``: the length of the ``input_values`` built beside them, if any; a codec that reads both gets
    ``samples // hop_length`` frames, one per code. ``tokens``: the length of the ``input_ids`` built beside them,
    if any; a decoder that adds one audio embedding to each token (``audio_length_per_tok``) gets
    ``tokens * audio_length_per_tok`` frames. The mask is ``(batch, frames)`` of ones (every frame valid);
    stacked-frame encoders (``num_stacked_frames``) get ``(batch, 32, mel * stacked)`` and chunked encoders
    (``n_window``) ``(batch, mel, 2 * n_window)``, one whole chunk.
    """
    hop = _get(config, "encoder_hop_length", "hop_length", default=None)
    frames = samples // int(hop) if samples and hop else None
    per_token = _get(config, "audio_length_per_tok", default=None)
    if tokens and per_token:
        frames = tokens * int(per_token)
    features, time_axis = _features(model, config, frames)
    inputs = {"input_features": features}
    if "input_features_mask" in names:
        audio = _sub(config, "audio_config", "encoder_config")
        stacked = _get(audio, "num_stacked_frames", default=None)
        window = _get(audio, "n_window", default=None)
        if stacked:  # frames stacked along features: (batch, frames, mel * stacked)
            mel = int(_get(audio, "num_mel_bins", default=80))
            inputs["input_features"], time_axis = torch.randn(BATCH, AUDIO_FRAMES, mel * int(stacked), generator=generator), 1
        elif window:  # chunked encoders: (batch, mel, 2 * window) frames, one whole chunk
            mel = int(_get(audio, "num_mel_bins", default=128))
            inputs["input_features"], time_axis = torch.randn(BATCH, mel, 2 * int(window), generator=generator), 2
        inputs["input_features_mask"] = torch.ones(BATCH, inputs["input_features"].shape[time_axis], dtype=torch.long)
    elif mask is not None:
        inputs[mask] = torch.ones(BATCH, features.shape[time_axis], dtype=torch.long)
    return inputs


def _code_streams(ids: torch.Tensor, config: Any, generator: torch.Generator) -> torch.Tensor:
    """Token ids of shape ``(batch, seq)`` widened to ``(batch, seq, 1 + num_codebooks)``: the text token, then one
    audio code per codebook, below ``codebook_vocab_size`` (the model offsets each stream into one vocabulary)."""
    codebooks, size = int(config.num_codebooks), int(config.codebook_vocab_size)
    codes = torch.randint(0, max(1, min(size - 1, 200)), (*ids.shape, codebooks), generator=generator)
    return torch.cat([ids.unsqueeze(-1), codes], dim=-1)


def _codebook_streams(model: torch.nn.Module, config: Any) -> int | None:
    """How many code streams the model embeds one table each (a ``ModuleList`` of ``num_codebooks`` embeddings, the
    streams stacked along the batch: ids ``(batch * num_codebooks, seq)``), or ``None``."""
    count = next((int(c.num_codebooks) for c in _configs(config) if _get(c, "num_codebooks") is not None), None)
    if not count:
        return None
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count and all(isinstance(m, torch.nn.Embedding) for m in module):
            return count
    return None


def _channel_table(model: torch.nn.Module, config: Any) -> tuple[int, int] | None:
    """``(num_channels, vocab_size)`` of a decoder that embeds ``num_channels`` code streams in one table of
    ``vocab_size * num_channels`` rows (its ids ``(batch, seq, num_channels)``), or ``None``."""
    decoder = _sub(config, "decoder_config")
    channels, size = _get(decoder, "num_channels"), _get(decoder, "vocab_size")
    if decoder is config or not channels or not size or int(channels) < 2:
        return None
    rows = int(channels) * int(size)
    if any(isinstance(m, torch.nn.Embedding) and m.num_embeddings == rows for m in model.modules()):
        return int(channels), int(size)
    return None


def _waveform(model: torch.nn.Module, config: Any, generator: torch.Generator) -> torch.Tensor:
    """``input_values`` for a model whose main input is audio.

    - conv codecs (a config of the tree with ``audio_channels``, or with ``hop_length``: a waveform cut into
      fixed hops): ``(batch, audio_channels or 1, samples)``, ``samples`` 3200 rounded up to whole hops;
    - a front end ``Conv2d`` (spectrogram patches): ``(batch, frames, num_mel_bins)``, ``frames`` the config's
      ``max_length`` (the position table is sized for it) or 32;
    - a first layer that is a ``Linear`` reading ``hidden_size`` (no waveform front end: an encoder fed hidden
      states): ``(batch, 8, hidden_size)``;
    - otherwise raw audio ``(batch, 3200)``, rounded up to whole tokens for a config with ``samples_per_token`` (its
      feature extractor pads the waveform so), and long enough for the frames an x-vector head's time-delay layers
      (``tdnn_kernel``, ``tdnn_dilation``) take after the feature extractor's strides.
    """
    configs = _configs(config)
    channels = next((c.audio_channels for c in configs if _get(c, "audio_channels") is not None), None)
    hop = next((_get(c, "encoder_hop_length", "hop_length") for c in configs if _get(c, "hop_length") is not None), None)
    if channels is not None or hop is not None:
        hop = int(hop or 1)
        samples = -(-AUDIO_SAMPLES // hop) * hop
        return torch.randn(BATCH, int(channels or 1), samples, generator=generator)
    layer = _front_end(model)
    if isinstance(layer, torch.nn.Conv2d):
        mel = int(_get(config, "num_mel_bins", default=128))
        return torch.randn(BATCH, int(_get(config, "max_length", default=AUDIO_FRAMES)), mel, generator=generator)
    hidden = _get(config, "hidden_size", default=None)
    if isinstance(layer, torch.nn.Linear) and hidden and layer.in_features == hidden:
        return torch.randn(BATCH, SEQ, int(hidden), generator=generator)
    per_token = int(_get(config, "samples_per_token", default=1))
    samples = AUDIO_SAMPLES
    kernels, dilations = _get(config, "tdnn_kernel"), _get(config, "tdnn_dilation")
    if kernels and dilations and type(model).__name__.endswith("ForXVector"):  # its time-delay layers need this many frames
        frames = 1 + sum(int(d) * (int(k) - 1) for k, d in zip(kernels, dilations))
        stride = math.prod(int(v) for v in (_get(config, "conv_stride") or [1]))
        samples = max(samples, (frames + 4) * stride)
    return torch.randn(BATCH, -(-samples // per_token) * per_token, generator=generator)


def _seeded_draws(model: torch.nn.Module, config: Any, inputs: dict[str, Any], names: set[str], generator: torch.Generator) -> None:
    """Random draws the forward would otherwise make itself, passed in so that two runs see the same values.

    - ``noise`` ``(batch, num_patches)`` uniform in [0, 1) for patch-masking encoders (config ``mask_ratio``), with
      ``num_patches = (height // patch_size) * (width // patch_size)`` of the built ``pixel_values``; models that mask
      whole units (config ``masked_unit_size``) mask only in pre-training heads, so their base forward gets none;
    - ``noise_sequence`` ``(batch, frames, model_in_channels)`` for vocoders, ``frames`` the spectrogram's length
      (``input_features`` is ``(batch, frames, mel)``);
    - ``pixel_mask`` ``(batch, height, width)`` of ones but for the last patch, when the config has
      ``max_image_length``: such models sample the patches they keep, and a single padded patch leaves one draw.
    """
    pixels = inputs.get("pixel_values")
    if "noise" in names and pixels is not None and pixels.dim() == 4 and _get(config, "mask_ratio") is not None and _get(config, "masked_unit_size") is None:
        patch = _patch(config)
        count = (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch)
        inputs["noise"] = torch.rand(pixels.shape[0], count, generator=generator)
    features = inputs.get("input_features")
    if "noise_sequence" in names and features is not None and _get(config, "model_in_channels") is not None:
        inputs["noise_sequence"] = torch.randn(features.shape[0], features.shape[1], int(config.model_in_channels), generator=generator)
    if "pixel_mask" in names and pixels is not None and pixels.dim() == 4 and _get(config, "max_image_length") is not None:
        patch = _patch(config)
        mask = torch.ones(pixels.shape[0], pixels.shape[-2], pixels.shape[-1], dtype=torch.long)
        mask[:, -patch:, -patch:] = 0
        inputs["pixel_mask"] = mask


def _trajectory(config: Any, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """An offline-RL trajectory of ``SEQ`` steps: ``states`` ``(batch, seq, state_dim)``, ``actions`` ``(batch, seq,
    act_dim)``, ``rewards`` and ``returns_to_go`` ``(batch, seq, 1)``, ``timesteps`` ``(batch, seq)`` (0 .. seq - 1)
    and ``attention_mask`` ``(batch, seq)`` of ones."""
    return {
        "states": torch.randn(BATCH, SEQ, int(config.state_dim), generator=generator),
        "actions": torch.randn(BATCH, SEQ, int(config.act_dim), generator=generator),
        "rewards": torch.randn(BATCH, SEQ, 1, generator=generator),
        "returns_to_go": torch.randn(BATCH, SEQ, 1, generator=generator),
        "timesteps": torch.arange(SEQ).expand(BATCH, SEQ).contiguous(),
        "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long),
    }


def _patch_sequences(config: Any, names: set[str], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Images already cut into patch rows, as a processor of variable-resolution images gives them.

    ``pixel_values`` ``(batch, 16, channels * patch_size ** 2)`` (a 4 x 4 patch grid, the vision config's channels
    and patch size), ``spatial_shapes`` ``(batch, 2)`` = ``[[4, 4], ...]`` (int64) and, when the forward takes it,
    ``pixel_attention_mask`` ``(batch, 16)`` of ones (no padding patch).
    """
    vision = _vision(config)
    side = 4
    count = side * side
    inputs = {
        "pixel_values": torch.randn(BATCH, count, _channels(vision) * _patch(vision) ** 2, generator=generator),
        "spatial_shapes": torch.tensor([[side, side]] * BATCH, dtype=torch.long),
    }
    if "pixel_attention_mask" in names:
        inputs["pixel_attention_mask"] = torch.ones(BATCH, count, dtype=torch.long)
    return inputs


def _lagged_series(config: Any, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A batch of a lag-based forecasting transformer, as its data loader gives it for training.

    The past covers ``context_length + max(lags_sequence)`` steps (the lags look back past the context):
    ``past_values`` ``(batch, past)`` (``(batch, past, input_size)`` for a multivariate series), ``past_time_features``
    ``(batch, past, num_time_features)``, ``past_observed_mask`` of ``past_values``' shape, all True (no missing
    value); ``future_values`` and ``future_time_features`` the same over ``prediction_length`` steps (the decoder's
    teacher-forced window); ``static_categorical_features`` ``(batch, n)`` below each ``cardinality`` and
    ``static_real_features`` ``(batch, n)`` when the config counts any.
    """
    past = int(config.context_length) + max(config.lags_sequence)
    future = int(config.prediction_length)
    size = int(_get(config, "input_size", default=1))
    times = int(_get(config, "num_time_features", default=0))
    variates = () if size == 1 else (size,)
    series = {
        "past_values": torch.randn(BATCH, past, *variates, generator=generator),
        "past_time_features": torch.randn(BATCH, past, times, generator=generator),
        "past_observed_mask": torch.ones(BATCH, past, *variates, dtype=torch.bool),
        "future_values": torch.randn(BATCH, future, *variates, generator=generator),
        "future_time_features": torch.randn(BATCH, future, times, generator=generator),
    }
    categorical = int(_get(config, "num_static_categorical_features", default=0))
    if categorical:
        columns = [torch.randint(0, int(n), (BATCH, 1), generator=generator) for n in config.cardinality[:categorical]]
        series["static_categorical_features"] = torch.cat(columns, dim=1)
    real = int(_get(config, "num_static_real_features", default=0))
    if real:
        series["static_real_features"] = torch.randn(BATCH, real, generator=generator)
    return series


def _packed_images(config: Any, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``BATCH`` images of a 4 x 4 patch grid packed side by side, for a vision tower taking ``target_sizes``.

    Returns ``(pixel_values, target_sizes)``: ``pixel_values`` ``(1, channels, patch_size, batch * 16 * patch_size)``
    (one row of patches) and ``target_sizes`` ``(batch, 2)`` = ``[[4, 4], ...]`` (int64).
    """
    side = 4
    patch = _patch(config)
    pixels = torch.randn(1, _channels(config), patch, BATCH * side * side * patch, generator=generator)
    return pixels, torch.tensor([[side, side]] * BATCH, dtype=torch.long)


#: answers per question given to a ``*ForMultipleChoice`` head
CHOICES = 2


def _choices(inputs: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
    """A multiple-choice head's inputs: every per-token tensor ``(batch, seq, ...)`` as ``(batch, CHOICES, seq, ...)``,
    each choice's ``input_ids`` drawn anew from the same range, masks and type ids repeated."""
    out = dict(inputs)
    for name, value in inputs.items():
        if not isinstance(value, torch.Tensor) or value.dim() < 2 or value.shape[:2] != (BATCH, SEQ):
            continue
        if name == "input_ids":
            low, high = int(value.min()), int(value.max()) + 1
            out[name] = torch.randint(low, max(high, low + 1), (BATCH, CHOICES, *value.shape[1:]), generator=generator)
        else:
            out[name] = value.unsqueeze(1).expand(BATCH, CHOICES, *value.shape[1:]).contiguous()
    return out


def _ended_sentences(inputs: dict[str, Any], config: Any) -> dict[str, Any]:
    """An encoder-decoder classification head's inputs: it decodes ``input_ids`` shifted right and pools the decoder's
    state at each row's end-of-sequence token, so each row of ``input_ids`` ends with ``eos_token_id`` (held nowhere
    else) and no ``decoder_input_ids`` are given."""
    eos = _get(config, "eos_token_id")
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    ids = inputs.get("input_ids")
    if eos is None or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return inputs
    ids = torch.where(ids == int(eos), ids + 1, ids)
    ids[:, -1] = int(eos)
    return {**{k: v for k, v in inputs.items() if k != "decoder_input_ids"}, "input_ids": ids}


def build_inputs(model: torch.nn.Module, seed: int = 0) -> dict[str, Any]:
    """Forward keyword arguments for ``model`` (a tiny transformers model).

    Text: ``input_ids`` (and ``attention_mask``, ``token_type_ids``) drawn from the vocabulary below the
    special ids; vision: ``pixel_values`` at the config's image size; audio: ``input_values`` (raw
    waveform ``(batch, samples)``, ``(batch, channels, samples)`` for conv codecs, a spectrogram or hidden
    states: :func:`_waveform`) or ``input_features`` (log-mel frames, laid out for the model's first layer:
    :func:`_features`); encoder-decoder: ``decoder_input_ids``.
    A multimodal decoder whose image or audio comes through placeholder tokens runs on text only (audio: the
    config names ``audio_token_id``/``audio_token_index``, even unset).

    Other input kinds, each built when the forward takes it:

    - vision tower on flattened patches (``hidden_states``/``pixel_values`` with ``grid_thw``/``image_grid_thw``):
      one image, grid ``[[1, h, w]]`` with ``h = w = 2 * spatial_merge_size``, patches ``(h * w, channels *
      temporal_patch_size * patch_size ** 2)``, and ``merge_sizes`` ``(1,)`` when asked;
    - patch sequences with ``spatial_shapes`` ``(batch, 2)`` and ``pixel_attention_mask`` ``(batch, 16)`` (also for an
      image-text model whose forward takes ``spatial_shapes`` optionally: :func:`_patch_sequences`), or with
      ``pixel_position_ids`` ``(batch, 16, 2)``: ``pixel_values`` ``(batch, 16, channels * patch_size ** 2)``;
    - video (``pixel_values_videos``, or ``pixel_values`` when the config has ``num_frames`` or the model reads video
      and no image):
      ``(batch, frames, channels, height, width)``; several images per sample (``image_attention_mask``):
      ``pixel_values`` ``(batch, 1, channels, height, width)`` and ``image_attention_mask`` ``(batch, seq, 1)``;
    - ``prompt_pixel_values``/``prompt_masks``: the image's shape, image and prompt each half the config's height;
    - ``qformer_input_ids`` ``(batch, seq)``; ``query_embeds`` ``(batch, num_query_tokens, hidden)`` with
      ``encoder_hidden_states`` ``(batch, seq, encoder_hidden_size)``;
    - ``visual_feats`` ``(batch, 4, visual_feat_dim)`` and ``visual_pos`` ``(batch, 4, visual_pos_dim)``;
      ``bbox`` ``(batch, seq, 4)`` in [0, 1] when required or the model has no 2-D position table;
      ``lang_ids`` ``(batch,)`` = 0 when the config lists adapter ``languages``;
    - ``input_features_mask`` ``(batch, frames)`` of ones (stacked-frame and chunked encoders get features sized
      for them); features beside a codec's ``input_values`` get one frame per hop, features beside ``input_ids`` of
      a decoder with ``audio_length_per_tok`` that many frames per token (:func:`_audio_inputs`);
      ``audio_mel`` ``(batch, frames, mel)`` with ``audio_mel_mask`` (all False: no padding);
    - ``decoder_input_values`` ``(batch, 4, hidden_size)`` beside ``input_values`` that are hidden states;
    - ``input_ids`` ``(batch, seq, 1 + num_codebooks)`` when the config has ``codebook_vocab_size``: the text token
      and one audio code per codebook; a model with one embedding table per codebook reads its ids (the decoder's
      ``decoder_input_ids`` for an encoder-decoder) as ``(batch * num_codebooks, seq)`` (:func:`_codebook_streams`),
      a decoder with one table for ``num_channels`` streams reads ``decoder_input_ids`` ``(batch, 4, num_channels)``
      (:func:`_channel_table`);
    - an encoder-decoder taking both ``input_ids`` and ``input_features`` (alternative encoder inputs) gets the
      features only, its ``attention_mask`` ``(batch, frames)`` covering them;
    - image queries spliced into the text (config ``num_query_tokens`` and an image or video token id): ``input_ids``
      and ``attention_mask`` lengthened by ``num_query_tokens`` placeholder tokens (per frame of a clip) in front;
    - a required ``hidden_states`` read by a ``Conv1d`` front end: latents ``(batch, hidden_size, 8)`` when it reads
      ``hidden_size`` channels, else the waveform of :func:`_waveform`;
    - time series: ``past_values`` ``(batch, context_length[, num_input_channels])`` (a long context is cut to
      four patches), ``past_values_padding`` ``(batch, context)`` of zeros, ``freq`` ``(batch, 1)`` = 0; lag-based
      forecasting transformers (``past_time_features`` and ``past_observed_mask`` required): see ``_lagged_series``;
    - a required ``latents`` (a codec decoder's continuous latents): ``(batch, hidden_size, 8)``, channels first;
    - required ``inputs_embeds``/``noise_embeds``/``context_hidden_states``: ``(batch, seq, hidden_size)``; a required
      ``inputs`` (a latent-attention encoder built without its modality preprocessor): ``(batch, seq, d_model)``;
    - ``input_ids`` without a vocabulary in the config: below a sub-config's ``vocab_size`` (a model wrapped with its
      vocoder), else code points below 200 (character-level models);
    - ``bbox`` also for encoder-decoder document models; ``image_embeds_position_mask`` ``(batch, latent_query_num +
      2)``: 1 at the image's latent queries after the first token (``input_ids`` and ``attention_mask`` lengthened);
    - offline-RL trajectories (``states``/``actions``, config ``state_dim``): see ``_trajectory``; ``target_sizes``:
      several images' patches packed in one row, see ``_packed_images``;
    - a ``*ForMultipleChoice`` head gets every per-token input as ``(batch, CHOICES, seq, ...)`` (:func:`_choices`);
      an encoder-decoder ``*ForSequenceClassification`` head rows ending with the end-of-sequence token and no
      ``decoder_input_ids`` (:func:`_ended_sentences`);
    - families of :data:`SINGLE_SAMPLE` get every batch-first input cut to one sample;
    - config ``keypoint_detector_config`` (or a family of :data:`IMAGE_PAIRS`): ``pixel_values`` as an image pair
      ``(batch, 2, channels, height, width)``;
    - ``action_embeds`` ``(batch, chunk_size + 1, action expert hidden)``, with a one-camera prefix ``pixel_values``
      ``(batch, 1, channels, height, width)``, ``pixel_attention_mask`` ``(batch, 1)`` and image placeholders in
      ``input_ids``; ``context_hidden_states`` with config ``target_layer_ids``: ``(batch, seq, hidden * layers)``;
      with ``noise_embeds`` (a block-diffusion drafter), ``attention_mask`` ``(batch, context + seq)`` over both;
    - random draws the forward would make itself (``noise``, ``noise_sequence``, sampled patches): see
      ``_seeded_draws``.
    Runtime objects (``inference_session``) are never built.

    Raises:
        InputError: the forward requires an argument this function cannot build, or the model defines no forward.
    """
    if getattr(type(model).forward, "__name__", "") == "_forward_unimplemented":
        raise InputError(f"{type(model).__name__} defines no forward (it is called through other methods, e.g. generate or encode)")
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    config = model.config
    params = inspect.signature(model.forward).parameters
    names = set(params)
    has_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    required = [
        n for n, p in params.items() if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    main = getattr(model, "main_input_name", "input_ids")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = _get(text, "vocab_size", default=None) or _get(config, "vocab_size", default=None)
    placeholder_image = any(
        _get(config, n) is not None for n in ("image_token_id", "image_token_index", "video_token_id", "audio_token_id")
    )

    inputs: dict[str, Any] = {}
    if "input_ids" in names and vocab:
        high = max(2, min(int(vocab), 200))
        inputs["input_ids"] = torch.randint(1 if high > 2 else 0, high, (BATCH, SEQ), generator=generator)
        if "attention_mask" in names:
            inputs["attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
        if "token_type_ids" in names and (_get(text, "type_vocab_size", default=0) or 0) > 0:
            inputs["token_type_ids"] = torch.zeros(BATCH, SEQ, dtype=torch.long)
    grid_name = next((n for n in ("grid_thw", "image_grid_thw") if n in required), None)
    patch_name = next((n for n in ("hidden_states", "pixel_values") if n in required), None)
    if grid_name and patch_name:  # vision tower on flattened patches
        inputs[patch_name], inputs[grid_name] = _flat_patches(config, generator)
        if "merge_sizes" in names:
            merge = int(_get(config, "spatial_merge_size", "merge_size", default=1))
            inputs["merge_sizes"] = torch.full((1,), merge, dtype=torch.long)
    if "spatial_shapes" in required and "pixel_values" in names:  # patch sequences with their (h, w) grid
        inputs.update(_patch_sequences(config, names, generator))
    if "pixel_position_ids" in required and "pixel_values" in names:  # patch sequences with (x, y) positions
        side = 4
        rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        positions = torch.stack([cols.reshape(-1), rows.reshape(-1)], dim=-1)
        inputs["pixel_values"] = torch.randn(BATCH, side * side, 3 * _patch(config) ** 2, generator=generator)
        inputs["pixel_position_ids"] = positions.unsqueeze(0).expand(BATCH, -1, -1).contiguous()
    if "pixel_values_videos" in names and (main == "pixel_values_videos" or "pixel_values_videos" in required):
        inputs["pixel_values_videos"] = _video(config, generator)
    if "pixel_values" in names and "pixel_values" not in inputs and (main == "pixel_values" or "pixel_values" in required or not placeholder_image or "input_ids" not in inputs):
        if _is_video(model, config):
            inputs["pixel_values"] = _video(config, generator)
        elif "image_attention_mask" in names and "bool_masked_pos" not in names:  # several images per sample: (batch, images, channels, height, width)
            inputs["pixel_values"] = _image(config).unsqueeze(1)
            if "input_ids" in inputs:
                inputs["image_attention_mask"] = torch.ones(BATCH, SEQ, 1, dtype=torch.long)
        elif "spatial_shapes" in names:  # an image-text model whose vision tower reads patch sequences
            inputs.update(_patch_sequences(config, names, generator))
        else:
            inputs["pixel_values"] = _image(config)
    queries = _get(config, "num_query_tokens")
    image_token = _get(config, "image_token_id", "image_token_index", "video_token_id", "video_token_index")
    if queries and image_token is not None and "pixel_values" in inputs and "input_ids" in inputs and inputs["input_ids"].dim() == 2:
        # the querying transformer's outputs replace num_query_tokens placeholders (per frame of a clip), put
        # before the text
        frames = inputs["pixel_values"].shape[1] if inputs["pixel_values"].dim() == 5 else 1
        placeholders = torch.full((BATCH, int(queries) * frames), int(image_token), dtype=torch.long)
        inputs["input_ids"] = torch.cat([placeholders, inputs["input_ids"]], dim=1)
        if "attention_mask" in inputs:
            inputs["attention_mask"] = torch.ones(inputs["input_ids"].shape, dtype=torch.long)
    if "prompt_pixel_values" in required and "pixel_values" in inputs:
        # in-context segmentation: the model stacks image and prompt along the height, so each gets half of it
        image = inputs["pixel_values"]
        inputs["pixel_values"] = image[:, :, : image.shape[2] // 2]
        inputs["prompt_pixel_values"] = torch.randn(inputs["pixel_values"].shape, generator=generator)
        if "prompt_masks" in names:
            inputs["prompt_masks"] = torch.randn(inputs["pixel_values"].shape, generator=generator)
    if "qformer_input_ids" in names:
        qformer = _sub(config, "qformer_config")
        high = max(2, min(int(_get(qformer, "vocab_size", default=200)), 200))
        inputs["qformer_input_ids"] = torch.randint(1, high, (BATCH, SEQ), generator=generator)
        if "qformer_attention_mask" in names:
            inputs["qformer_attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
    if "query_embeds" in required:  # querying transformer: learned queries attending to image features
        queries = int(_get(config, "num_query_tokens", default=DECODER_SEQ))
        inputs["query_embeds"] = torch.randn(BATCH, queries, config.hidden_size, generator=generator)
        if "encoder_hidden_states" in names and _get(config, "encoder_hidden_size") is not None:
            inputs["encoder_hidden_states"] = torch.randn(BATCH, SEQ, config.encoder_hidden_size, generator=generator)
    if "visual_feats" in names and _get(config, "visual_feat_dim") is not None:  # region features and boxes
        inputs["visual_feats"] = torch.randn(BATCH, DECODER_SEQ, config.visual_feat_dim, generator=generator)
        inputs["visual_pos"] = torch.rand(BATCH, DECODER_SEQ, int(_get(config, "visual_pos_dim", default=4)), generator=generator)
    if "bbox" in names and "input_ids" in inputs and (
        "bbox" in required or _get(config, "max_2d_position_embeddings") is None or getattr(config, "is_encoder_decoder", False)
    ):  # encoder-decoder document models place image patches by the boxes
        corners = torch.rand(BATCH, SEQ, 2, 2, generator=generator).sort(dim=2).values  # (x0, y0) <= (x1, y1)
        inputs["bbox"] = corners.reshape(BATCH, SEQ, 4)
    if "lang_ids" in names and "input_ids" in inputs and _get(config, "languages") is not None:
        inputs["lang_ids"] = torch.zeros(BATCH, dtype=torch.long)
    # audio through placeholder tokens: the config names an audio token field, even unset
    placeholder_audio = placeholder_image or any(hasattr(config, n) for n in ("audio_token_id", "audio_token_index"))
    if "input_values" in names and (main == "input_values" or "input_values" in required):
        inputs["input_values"] = _waveform(model, config, generator)
        if "decoder_input_values" in names and inputs["input_values"].dim() == 3 and inputs["input_values"].is_floating_point():
            if inputs["input_values"].shape[-1] == _get(config, "hidden_size"):  # decoder fed hidden states too
                inputs["decoder_input_values"] = torch.randn(BATCH, DECODER_SEQ, config.hidden_size, generator=generator)
    if "input_features" in names and (main == "input_features" or "input_features" in required or not placeholder_audio):
        samples = inputs["input_values"].shape[-1] if inputs.get("input_values") is not None and inputs["input_values"].dim() == 3 else None
        tokens = inputs["input_ids"].shape[1] if "input_ids" in inputs else None
        mask = None
        if getattr(config, "is_encoder_decoder", False) and "input_ids" in inputs and "input_features_mask" not in names:
            # text and speech are alternative encoder inputs: the speech encoder reads the features (batch, 32,
            # width) and the one attention_mask (batch, 32) covers their frames
            for name in ("input_ids", "attention_mask", "token_type_ids"):
                inputs.pop(name, None)
            tokens, mask = None, "attention_mask" if "attention_mask" in names else None
        inputs.update(_audio_inputs(model, config, names, generator, samples, tokens, mask))
    if "input_ids" in inputs and _get(config, "codebook_vocab_size") and _get(config, "num_codebooks"):
        inputs["input_ids"] = _code_streams(inputs["input_ids"], config, generator)
    if "audio_mel" in required:  # (batch, frames, mel) with a padding mask (True = padded)
        mel = int(_get(config, "input_feat_size", "num_mel_bins", "n_mels", default=128))
        inputs["audio_mel"] = torch.randn(BATCH, AUDIO_FRAMES, mel, generator=generator)
        inputs["audio_mel_mask"] = torch.zeros(BATCH, AUDIO_FRAMES, dtype=torch.bool)
    if "past_time_features" in required and "past_observed_mask" in required:  # lag-based forecasting transformers
        inputs.update({k: v for k, v in _lagged_series(config, generator).items() if k in names})
    if "past_values" in required and "past_values" not in inputs:  # time series: (batch, context) or (batch, context, channels)
        context = int(_get(config, "context_length", default=32))
        patch = int(_get(config, "patch_length", default=1))
        if context > 128:
            context = 4 * patch
        channels = _get(config, "num_input_channels", default=None)
        shape = (BATCH, context) if channels is None else (BATCH, context, int(channels))
        inputs["past_values"] = torch.randn(shape, generator=generator)
        if "past_values_padding" in names:
            inputs["past_values_padding"] = torch.zeros(BATCH, context, dtype=torch.long)
        if "freq" in names:
            inputs["freq"] = torch.zeros(BATCH, 1, dtype=torch.long)
    # ---- non-audio input kinds (trajectories, packed images, image pairs, actions, seeded draws) ----
    if "states" in names and "actions" in names and _get(config, "state_dim") is not None:  # offline-RL trajectory
        inputs.update({k: v for k, v in _trajectory(config, generator).items() if k in names})
    if "target_sizes" in names and "pixel_values" in required:  # patches of several images packed in one row
        inputs["pixel_values"], inputs["target_sizes"] = _packed_images(config, generator)
    pair = _get(config, "keypoint_detector_config") is not None or getattr(config, "model_type", None) in IMAGE_PAIRS
    if pair and "pixel_values" in inputs and inputs["pixel_values"].dim() == 4:
        # keypoint matching: an image pair per sample, (batch, 2, channels, height, width)
        image = inputs["pixel_values"]
        inputs["pixel_values"] = torch.stack([image, torch.randn(image.shape, generator=generator)], dim=1)
    if "image_embeds_position_mask" in names and "input_ids" in inputs and "pixel_values" in inputs:
        # (batch, seq): 1 where the image's latent queries replace tokens, right after the first token
        queries = int(_get(config, "latent_query_num", default=SEQ - 2))
        length = queries + 2
        inputs["input_ids"] = torch.randint(1, max(2, min(int(vocab), 200)), (BATCH, length), generator=generator)
        mask = torch.zeros(BATCH, length, dtype=torch.long)
        mask[:, 1 : 1 + queries] = 1
        inputs["image_embeds_position_mask"] = mask
        if "attention_mask" in inputs:
            inputs["attention_mask"] = torch.ones(BATCH, length, dtype=torch.long)
    if "action_embeds" in required:  # action expert: (batch, chunk_size + 1, hidden), the state then the actions
        expert = _sub(config, "dit_config", "action_expert_config")
        steps = int(_get(config, "chunk_size", default=DECODER_SEQ)) + 1
        inputs["action_embeds"] = torch.randn(BATCH, steps, int(_get(expert, "hidden_size")), generator=generator)
        vlm = _sub(config, "vlm_config")
        if "pixel_attention_mask" in names and "input_ids" in names:  # the prefix: one camera image per sample
            if "input_ids" not in inputs:  # the vocabulary is the vision-language model's
                high = max(2, min(int(_get(vlm.get_text_config(), "vocab_size", default=200)), 200))
                inputs["input_ids"] = torch.randint(1, high, (BATCH, SEQ), generator=generator)
            # pixel_values (batch, cameras=1, channels, height, width), pixel_attention_mask (batch, 1) all True,
            # the first DECODER_SEQ tokens of input_ids are image placeholders
            inputs["pixel_values"] = _image(vlm).unsqueeze(1)
            inputs["pixel_attention_mask"] = torch.ones(BATCH, 1, dtype=torch.bool)
            image_token = _get(vlm, "image_token_id", "image_token_index")
            if image_token is not None:
                inputs["input_ids"][:, :DECODER_SEQ] = int(image_token)
    if "context_hidden_states" in required and _get(config, "target_layer_ids") is not None:
        # drafter context: the target's hidden states of each listed layer, concatenated (batch, seq, hidden * layers)
        width = int(config.hidden_size) * len(config.target_layer_ids)
        inputs["context_hidden_states"] = torch.randn(BATCH, SEQ, width, generator=generator)
    _seeded_draws(model, config, inputs, names, generator)
    embedded = (("inputs_embeds", "hidden_size"), ("noise_embeds", "hidden_size"), ("context_hidden_states", "hidden_size"), ("inputs", "d_model"))
    for name, width in embedded:
        if name in required and name not in inputs and _get(config, width) is not None:  # embeddings fed directly: (batch, seq, hidden)
            inputs[name] = torch.randn(BATCH, SEQ, int(_get(config, width)), generator=generator)
    if {"noise_embeds", "context_hidden_states"} <= inputs.keys() and "attention_mask" in names and "attention_mask" not in inputs:
        # a block-diffusion drafter's keys are the context followed by the denoised window: its mask spans both. Without
        # it the traced mask builder sizes the keys by the window alone (eager skips the all-ones mask).
        keys = inputs["context_hidden_states"].shape[1] + inputs["noise_embeds"].shape[1]
        inputs["attention_mask"] = torch.ones(BATCH, keys, dtype=torch.long)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in names:
        dec_vocab = _get(config, "decoder_vocab_size", default=None) or vocab or 2
        inputs["decoder_input_ids"] = torch.randint(1, max(2, min(int(dec_vocab), 200)), (BATCH, DECODER_SEQ), generator=generator)
    streams = _codebook_streams(model, config)
    ids_name = "decoder_input_ids" if "decoder_input_ids" in inputs else "input_ids"
    if streams and ids_name in inputs and inputs[ids_name].dim() == 2:  # (batch * num_codebooks, seq)
        ids = inputs[ids_name]
        inputs[ids_name] = torch.randint(1, int(ids.max()) + 1, (ids.shape[0] * streams, ids.shape[1]), generator=generator)
    table = _channel_table(model, config) if "decoder_input_ids" in inputs else None
    if table:  # (batch, seq, num_channels), each stream below the decoder's vocabulary
        channels, size = table
        inputs["decoder_input_ids"] = torch.randint(0, min(size, 200), (BATCH, DECODER_SEQ, channels), generator=generator)
    if "hidden_states" in required and "hidden_states" not in inputs and isinstance(_front_end(model), torch.nn.Conv1d):
        layer = _front_end(model)
        if layer.in_channels == _get(config, "hidden_size"):  # a decoder fed latents: (batch, hidden_size, 8)
            inputs["hidden_states"] = torch.randn(BATCH, layer.in_channels, SEQ, generator=generator)
        else:  # an encoder fed the waveform
            inputs["hidden_states"] = _waveform(model, config, generator)
    if "latents" in required and _get(config, "hidden_size") is not None:  # a codec decoder's continuous latents
        inputs["latents"] = torch.randn(BATCH, int(config.hidden_size), SEQ, generator=generator)  # (batch, hidden, frames)
    if not inputs and has_kwargs and vocab:
        inputs["input_ids"] = torch.randint(1, max(2, min(int(vocab), 200)), (BATCH, SEQ), generator=generator)
    if not inputs and "input_ids" in names and main == "input_ids":
        # no vocabulary at the top: a sub-config's (a model wrapped with its vocoder), else character-level code points
        nested = next((int(c.vocab_size) for c in _configs(config) if _get(c, "vocab_size")), 200)
        inputs["input_ids"] = torch.randint(1, max(2, min(nested, 200)), (BATCH, SEQ), generator=generator)
        if "attention_mask" in names:
            inputs["attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
    missing = [n for n in required if n not in inputs]
    if missing:
        raise InputError(f"the forward requires {', '.join(missing)}, which the sweep cannot build")
    if not inputs:
        raise InputError(f"no known input among the forward's parameters ({', '.join(list(names)[:8])})")
    if type(model).__name__.endswith("ForMultipleChoice"):
        inputs = _choices(inputs, generator)
    if type(model).__name__.endswith("ForSequenceClassification") and getattr(config, "is_encoder_decoder", False):
        inputs = _ended_sentences(inputs, config)
    if getattr(config, "model_type", None) in SINGLE_SAMPLE:
        inputs = {k: v[:1] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == BATCH else v for k, v in inputs.items()}
    return inputs
