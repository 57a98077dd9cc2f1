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
    if "pixel_values" in names and (main == "pixel_values" or "pixel_values" in required or not placeholder_image or "input_ids" not in inputs):
        inputs["pixel_values"] = _image(config)
    if "input_values" in names and (main == "input_values" or "input_values" in required):
        inputs["input_values"] = torch.randn(BATCH, AUDIO_SAMPLES, generator=generator)
    if "input_features" in names and (main == "input_features" or "input_features" in required or not placeholder_image):
        inputs["input_features"] = _features(config)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in names:
        dec_vocab = _get(config, "decoder_vocab_size", default=None) or vocab or 2
        inputs["decoder_input_ids"] = torch.randint(1, max(2, min(int(dec_vocab), 200)), (BATCH, DECODER_SEQ), generator=generator)
    if not inputs and has_kwargs and vocab:
        inputs["input_ids"] = torch.randint(1, max(2, min(int(vocab), 200)), (BATCH, SEQ), generator=generator)
    missing = [n for n in required if n not in inputs]
    if missing:
        raise InputError(f"the forward requires {', '.join(missing)}, which the sweep cannot build")
    if not inputs:
        raise InputError(f"no known input among the forward's parameters ({', '.join(list(names)[:8])})")
    return inputs
