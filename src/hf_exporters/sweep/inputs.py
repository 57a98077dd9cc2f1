"""Example inputs for a tiny model, from its forward signature, its config and its modality."""

from __future__ import annotations

import inspect
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


def _image(config: Any) -> torch.Tensor:
    vision = _sub(config, "vision_config", "backbone_config", "encoder_config")
    size = _get(vision, "image_size", default=None) or _get(config, "image_size", default=64)
    if isinstance(size, dict):
        size = size.get("height", 64)
    height, width = (size, size) if isinstance(size, int) else tuple(size)[:2]
    channels = _get(vision, "num_channels", default=None) or _get(config, "num_channels", default=3)
    return torch.randn(BATCH, channels, height, width)


def _vision(config: Any) -> Any:
    return _sub(config, "vision_config", "backbone_config", "encoder_config")


def _channels(config: Any) -> int:
    return int(_get(config, "in_channels", "num_channels", "in_chans", default=3))


def _patch(config: Any) -> int:
    size = _get(config, "patch_size", default=14)
    return int(size[-1] if isinstance(size, (list, tuple)) else size)


def _flat_patches(config: Any, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattened patches and their grid for a vision tower that takes one token row per patch.

    Returns ``(patches, grid_thw)``: ``grid_thw`` is ``[[1, h, w]]`` (int64, shape ``(1, 3)``) with ``h = w = 2 *
    merge`` (the config's spatial merge size) and ``patches`` has shape ``(h * w, channels * temporal_patch_size *
    patch_size ** 2)``.
    """
    merge = int(_get(config, "spatial_merge_size", "merge_size", default=1))
    side = 2 * merge
    temporal = int(_get(config, "temporal_patch_size", "patch_temporal", default=1))
    width = _channels(config) * temporal * _patch(config) ** 2
    grid = torch.tensor([[1, side, side]], dtype=torch.long)
    return torch.randn(side * side, width, generator=generator), grid


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


def _is_video(config: Any) -> bool:
    return _get(_vision(config), "num_frames", default=None) is not None or _get(config, "num_frames", default=None) is not None


def _features(config: Any) -> torch.Tensor:
    audio = _sub(config, "audio_config", "encoder_config")
    mel = _get(audio, "num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels", default=80)
    source = _get(audio, "max_source_positions", default=None)
    if getattr(audio, "model_type", "") in ("whisper",) or (source and _get(audio, "num_mel_bins") and "whisper" in type(audio).__name__.lower()):
        return torch.randn(BATCH, mel, 2 * source)
    channels = _get(audio, "input_channels", default=1)
    if _get(audio, "input_feat_per_channel") is not None:  # speech_to_text: (batch, frames, features)
        return torch.randn(BATCH, AUDIO_FRAMES, mel * channels)
    if source and _get(audio, "num_mel_bins") is not None:  # whisper-like encoders: (batch, mel, 2 * positions)
        return torch.randn(BATCH, mel, 2 * source)
    return torch.randn(BATCH, AUDIO_FRAMES, mel)


def build_inputs(model: torch.nn.Module, seed: int = 0) -> dict[str, Any]:
    """Forward keyword arguments for ``model`` (a tiny transformers model).

    Text: ``input_ids`` (and ``attention_mask``, ``token_type_ids``) drawn from the vocabulary below the
    special ids; vision: ``pixel_values`` at the config's image size; audio: ``input_values`` (raw
    waveform) or ``input_features`` (log-mel frames); encoder-decoder: ``decoder_input_ids``.
    A multimodal decoder whose image comes through placeholder tokens runs on text only.

    Other input kinds, each built when the forward takes it:

    - vision tower on flattened patches (``hidden_states``/``pixel_values`` with ``grid_thw``/``image_grid_thw``):
      one image, grid ``[[1, h, w]]`` with ``h = w = 2 * spatial_merge_size``, patches ``(h * w, channels *
      temporal_patch_size * patch_size ** 2)``, and ``merge_sizes`` ``(1,)`` when asked;
    - patch sequences with ``spatial_shapes`` ``(batch, 2)`` and ``pixel_attention_mask`` ``(batch, 16)``, or with
      ``pixel_position_ids`` ``(batch, 16, 2)``: ``pixel_values`` ``(batch, 16, channels * patch_size ** 2)``;
    - video (``pixel_values_videos``, or ``pixel_values`` when the config has ``num_frames``):
      ``(batch, frames, channels, height, width)``; several images per sample (``image_attention_mask``):
      ``pixel_values`` ``(batch, 1, channels, height, width)`` and ``image_attention_mask`` ``(batch, seq, 1)``;
    - ``prompt_pixel_values``/``prompt_masks``: the image's shape, image and prompt each half the config's height;
    - ``qformer_input_ids`` ``(batch, seq)``; ``query_embeds`` ``(batch, num_query_tokens, hidden)`` with
      ``encoder_hidden_states`` ``(batch, seq, encoder_hidden_size)``;
    - ``visual_feats`` ``(batch, 4, visual_feat_dim)`` and ``visual_pos`` ``(batch, 4, visual_pos_dim)``;
      ``bbox`` ``(batch, seq, 4)`` in [0, 1] when required or the model has no 2-D position table;
      ``lang_ids`` ``(batch,)`` = 0 when the config lists adapter ``languages``;
    - ``input_features_mask`` ``(batch, frames)`` of ones (stacked-frame and chunked encoders get features sized
      for them); ``audio_mel`` ``(batch, frames, mel)`` with ``audio_mel_mask`` (all False: no padding);
    - time series: ``past_values`` ``(batch, context_length[, num_input_channels])`` (a long context is cut to
      four patches), ``past_values_padding`` ``(batch, context)`` of zeros, ``freq`` ``(batch, 1)`` = 0;
    - required ``inputs_embeds``/``noise_embeds``/``context_hidden_states``: ``(batch, seq, hidden_size)``;
    - ``input_ids`` without a vocabulary (character-level models): code points below 200.
    Runtime objects (``inference_session``) are never built.

    Raises:
        InputError: the forward requires an argument this function cannot build.
    """
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
        side = 4
        count = side * side
        inputs["pixel_values"] = torch.randn(BATCH, count, _channels(config) * _patch(config) ** 2, generator=generator)
        inputs["spatial_shapes"] = torch.tensor([[side, side]] * BATCH, dtype=torch.long)
        if "pixel_attention_mask" in names:
            inputs["pixel_attention_mask"] = torch.ones(BATCH, count, dtype=torch.long)
    if "pixel_position_ids" in required and "pixel_values" in names:  # patch sequences with (x, y) positions
        side = 4
        rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        positions = torch.stack([cols.reshape(-1), rows.reshape(-1)], dim=-1)
        inputs["pixel_values"] = torch.randn(BATCH, side * side, 3 * _patch(config) ** 2, generator=generator)
        inputs["pixel_position_ids"] = positions.unsqueeze(0).expand(BATCH, -1, -1).contiguous()
    if "pixel_values_videos" in names and (main == "pixel_values_videos" or "pixel_values_videos" in required):
        inputs["pixel_values_videos"] = _video(config, generator)
    if "pixel_values" in names and "pixel_values" not in inputs and (main == "pixel_values" or "pixel_values" in required or not placeholder_image or "input_ids" not in inputs):
        if _is_video(config):
            inputs["pixel_values"] = _video(config, generator)
        elif "image_attention_mask" in names:  # several images per sample: (batch, images, channels, height, width)
            inputs["pixel_values"] = _image(config).unsqueeze(1)
            if "input_ids" in inputs:
                inputs["image_attention_mask"] = torch.ones(BATCH, SEQ, 1, dtype=torch.long)
        else:
            inputs["pixel_values"] = _image(config)
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
    if "bbox" in names and "input_ids" in inputs and ("bbox" in required or _get(config, "max_2d_position_embeddings") is None):
        corners = torch.rand(BATCH, SEQ, 2, 2, generator=generator).sort(dim=2).values  # (x0, y0) <= (x1, y1)
        inputs["bbox"] = corners.reshape(BATCH, SEQ, 4)
    if "lang_ids" in names and "input_ids" in inputs and _get(config, "languages") is not None:
        inputs["lang_ids"] = torch.zeros(BATCH, dtype=torch.long)
    if "input_values" in names and (main == "input_values" or "input_values" in required):
        inputs["input_values"] = torch.randn(BATCH, AUDIO_SAMPLES, generator=generator)
    if "input_features" in names and (main == "input_features" or "input_features" in required or not placeholder_image):
        inputs["input_features"] = _features(config)
        if "input_features_mask" in names:  # (batch, frames): every frame valid
            audio = _sub(config, "audio_config", "encoder_config")
            stacked = _get(audio, "num_stacked_frames", default=None)
            window = _get(audio, "n_window", default=None)
            if stacked:  # frames stacked along features: (batch, frames, mel * stacked)
                mel = int(_get(audio, "num_mel_bins", default=80))
                inputs["input_features"] = torch.randn(BATCH, AUDIO_FRAMES, mel * int(stacked), generator=generator)
            elif window:  # chunked encoders: (batch, mel, 2 * window) frames, one whole chunk
                mel = int(_get(audio, "num_mel_bins", default=128))
                inputs["input_features"] = torch.randn(BATCH, mel, 2 * int(window), generator=generator)
            time_axis = 1 if inputs["input_features"].shape[1] == AUDIO_FRAMES else -1
            inputs["input_features_mask"] = torch.ones(BATCH, inputs["input_features"].shape[time_axis], dtype=torch.long)
    if "audio_mel" in required:  # (batch, frames, mel) with a padding mask (True = padded)
        mel = int(_get(config, "input_feat_size", "num_mel_bins", "n_mels", default=128))
        inputs["audio_mel"] = torch.randn(BATCH, AUDIO_FRAMES, mel, generator=generator)
        inputs["audio_mel_mask"] = torch.zeros(BATCH, AUDIO_FRAMES, dtype=torch.bool)
    if "past_values" in required:  # time series: (batch, context) or (batch, context, channels)
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
    for name, width in (("inputs_embeds", "hidden_size"), ("noise_embeds", "hidden_size"), ("context_hidden_states", "hidden_size")):
        if name in required and _get(config, width) is not None:  # embeddings fed directly: (batch, seq, hidden)
            inputs[name] = torch.randn(BATCH, SEQ, int(_get(config, width)), generator=generator)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in names:
        dec_vocab = _get(config, "decoder_vocab_size", default=None) or vocab or 2
        inputs["decoder_input_ids"] = torch.randint(1, max(2, min(int(dec_vocab), 200)), (BATCH, DECODER_SEQ), generator=generator)
    if not inputs and has_kwargs and vocab:
        inputs["input_ids"] = torch.randint(1, max(2, min(int(vocab), 200)), (BATCH, SEQ), generator=generator)
    if not inputs and "input_ids" in names and main == "input_ids":  # no vocabulary: character-level, code points
        inputs["input_ids"] = torch.randint(1, 200, (BATCH, SEQ), generator=generator)
        if "attention_mask" in names:
            inputs["attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
    missing = [n for n in required if n not in inputs]
    if missing:
        raise InputError(f"the forward requires {', '.join(missing)}, which the sweep cannot build")
    if not inputs:
        raise InputError(f"no known input among the forward's parameters ({', '.join(list(names)[:8])})")
    return inputs
