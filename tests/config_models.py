"""Tiny models of real transformers families from the configs checked in under ``tests/configs``, and their inputs.

``tests/configs/<Class>.json`` is the ``config.json`` that ``save_pretrained`` would write for the tiny model
(the fields that differ from the config class's defaults, ``architectures`` naming the class); :func:`build`
loads it with the class's ``config_class.from_dict`` and builds the model with seed 0, in eval mode.
:func:`example_inputs` gives each family's forward keyword arguments, written out here with their shapes.
The tests of workarounds use these, so what they test changes only when a file here changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

CONFIGS = Path(__file__).with_name("configs")

BATCH, SEQ, DECODER_SEQ = 2, 8, 4


def load_config(class_name: str) -> transformers.PretrainedConfig:
    """The config of ``tests/configs/<class_name>.json`` (its ``architectures`` must name the class)."""
    data = json.loads((CONFIGS / f"{class_name}.json").read_text())
    if data.get("architectures") != [class_name]:
        raise ValueError(f"{class_name}.json names {data.get('architectures')} in architectures")
    return getattr(transformers, class_name).config_class.from_dict(data)


def build(class_name: str, **config_changes: Any) -> torch.nn.Module:
    """``class_name`` built from its checked-in config (with ``config_changes`` set on it), seed 0, eval mode."""
    config = load_config(class_name)
    for name, value in config_changes.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    model = getattr(transformers, class_name)(config).eval()
    fill = _UNTRAINED.get(class_name)
    if fill is not None:
        fill(model)
    return model


def example_inputs(model: torch.nn.Module) -> dict[str, Any]:
    """The forward keyword arguments of a model :func:`build` gave, drawn with seed 0."""
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    return _INPUTS[type(model).__name__](model.config, generator)


def _draw_codebooks(model: torch.nn.Module) -> None:
    """Encodec's codebooks start all zero (training fills them from the data): every frame would then pick code 0
    and the decoder see one constant vector. Drawn N(0, 1), the codes follow the audio."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.quantizer.layers:
            layer.codebook.embed.copy_(torch.randn(layer.codebook.embed.shape, generator=generator))


_UNTRAINED: dict[str, Callable[[torch.nn.Module], None]] = {"EncodecModel": _draw_codebooks}


# ── inputs ───────────────────────────────────────────────────────────────────


def _ids(config: Any, generator: torch.Generator, length: int = SEQ) -> torch.Tensor:
    """Token ids below min(vocabulary, 200), above 0."""
    vocab = config.get_text_config().vocab_size
    return torch.randint(1, min(vocab, 200), (BATCH, length), generator=generator)


def _ones(length: int = SEQ, dtype: torch.dtype = torch.long) -> torch.Tensor:
    return torch.ones(BATCH, length, dtype=dtype)


def _text(config: Any, generator: torch.Generator) -> dict[str, Any]:
    return {"input_ids": _ids(config, generator), "attention_mask": _ones()}


def _encoder_decoder(config: Any, generator: torch.Generator) -> dict[str, Any]:
    inputs = _text(config, generator)
    inputs["decoder_input_ids"] = _ids(config, generator, DECODER_SEQ)
    return inputs


def _flat_patches(width: int, side: int = 4) -> Callable[[Any, torch.Generator], dict[str, Any]]:
    """A vision tower on flattened patches: one image of ``side`` x ``side`` patches, one row of ``width`` per patch."""

    def inputs(config: Any, generator: torch.Generator, name: str = "hidden_states") -> dict[str, Any]:
        return {name: torch.randn(side * side, width, generator=generator), "grid_thw": torch.tensor([[1, side, side]])}

    return inputs


def _udop(config: Any, generator: torch.Generator) -> dict[str, Any]:
    inputs = _text(config, generator)
    inputs["pixel_values"] = torch.randn(BATCH, 3, 32, 32)
    corners = torch.rand(BATCH, SEQ, 2, 2, generator=generator).sort(dim=2).values  # (x0, y0) <= (x1, y1)
    inputs["bbox"] = corners.reshape(BATCH, SEQ, 4)
    inputs["decoder_input_ids"] = _ids(config, generator, DECODER_SEQ)
    return inputs


def _autoformer(config: Any, generator: torch.Generator) -> dict[str, Any]:
    """The lagged series as the data loader gives it: the past covers context_length 4 + the largest lag 7."""
    past, future = 11, 4
    return {
        "past_values": torch.randn(BATCH, past, generator=generator),
        "past_time_features": torch.randn(BATCH, past, 0, generator=generator),
        "past_observed_mask": torch.ones(BATCH, past, dtype=torch.bool),
        "future_values": torch.randn(BATCH, future, generator=generator),
        "future_time_features": torch.randn(BATCH, future, 0, generator=generator),
    }


_INPUTS: dict[str, Callable[[Any, torch.Generator], dict[str, Any]]] = {
    # text (input_ids, attention_mask)
    **dict.fromkeys(
        ("OpenAIPrivacyFilterModel", "DbrxModel", "DeepseekV2Model", "Llama4TextModel", "Step3p7Model", "LongcatFlashModel", "FalconMambaModel", "RecurrentGemmaModel",
         "RwkvModel", "FunnelModel", "ReformerModel", "FastSpeech2ConformerModel", "Qwen3_5ForConditionalGeneration", "Inkling2ForCausalLM"),
        _text,
    ),
    "CpmAntModel": lambda config, generator: {"input_ids": _ids(config, generator)},
    "LongformerModel": lambda config, generator: {**_text(config, generator), "token_type_ids": torch.zeros(BATCH, SEQ, dtype=torch.long)},
    "FNetModel": lambda config, generator: {"input_ids": _ids(config, generator), "token_type_ids": torch.zeros(BATCH, SEQ, dtype=torch.long)},
    # encoder-decoder (and decoder_input_ids)
    **dict.fromkeys(("SwitchTransformersModel", "FSMTModel", "LEDModel"), _encoder_decoder),
    "UdopModel": _udop,
    "Sam3LiteTextModel": lambda config, generator: {**_text(config, generator), "pixel_values": torch.randn(BATCH, 3, 32, 32)},
    # vision towers on flattened patches (grid [[1, 4, 4]] unless said)
    "Qwen2_5_VisionTransformerPretrainedModel": _flat_patches(3 * 2 * 14 * 14),
    "Qwen3VLVisionModel": _flat_patches(3 * 2 * 16 * 16),
    "MuseSparkVisionModel": lambda config, generator: _flat_patches(3 * 2 * 14 * 14)(config, generator, "pixel_values"),
    "Cosmos3EdgeVisionModel": lambda config, generator: _flat_patches(3 * 16 * 16)(config, generator, "pixel_values"),
    "Kimi_K25VisionModel": lambda config, generator: {
        "pixel_values": torch.randn(16, 3, 14, 14, generator=generator),  # each patch a small image, as its processor keeps it
        "grid_thw": torch.tensor([[1, 4, 4]]),
    },
    "VideoLlama3VisionModel": lambda config, generator: {
        **_flat_patches(3 * 16 * 16, side=2)(config, generator, "pixel_values"),
        "merge_sizes": torch.tensor([1]),
    },
    "MiniCPMOcrVisionModel": lambda config, generator: {  # two images of 4 x 4 patches of 16 pixels, packed in one row
        "pixel_values": torch.randn(1, 3, 16, BATCH * 16 * 16, generator=generator),
        "target_sizes": torch.tensor([[4, 4], [4, 4]]),
    },
    "PixtralVisionModel": lambda config, generator: {"pixel_values": torch.randn(BATCH, 3, 32, 32)},
    # audio
    "Qwen3ASREncoder": lambda config, generator: {  # one whole chunk of 2 * n_window frames of 128 mel bins
        "input_features": torch.randn(BATCH, 128, 100, generator=generator),
        "input_features_mask": _ones(100),
    },
    **dict.fromkeys(("EncodecModel", "MimiModel"), lambda config, generator: {"input_values": torch.randn(BATCH, 1, 3200, generator=generator)}),
    # time series
    "AutoformerModel": _autoformer,
}


def spread_tiny_llama(folder: Path | None = None) -> transformers.LlamaForCausalLM:
    """A 2-layer Llama of 96 tokens (hidden 32, 2 key/value heads, 64 positions, no end token), seed 0, its
    matrices scaled by 8 so that greedy ids do not settle on one token; saved to ``folder`` when given.
    The generation tests of the C++ runner and of the in-program cache use it."""
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64, eos_token_id=None)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.mul_(8.0)
    if folder is not None:
        model.save_pretrained(folder)
    return model
