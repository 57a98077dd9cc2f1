"""Step modules: one ``torch.nn.Module`` per graph of the generation loop, each taking and returning
its cache as a flat tensor list (:mod:`hf_exporters.generation.cache_layout`).

- :class:`DecoderStep`: a decoder-only step over a dynamic (or hybrid) cache: prefill and decode.
- :class:`MultimodalPrefillStep`: the prefill of a decoder-only multimodal model, given its encoder's features.
- :class:`ModalityEncoderStep`: a multimodal model's encoder for one modality (``get_<modality>_features``).
- :class:`StaticDecoderStep`: a decoder-only step over a fixed-size ``StaticCache``.
- :class:`EncoderStep`: the encoder of an encoder-decoder model.
- :class:`Seq2SeqDecoderStep`: a decoder step of an encoder-decoder model.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from ..errors import InputError
from .cache_layout import dynamic_cache, flat_cache, flat_hybrid, hybrid_cache, hybrid_schema


def _accepts(module: torch.nn.Module, name: str) -> bool:
    parameters = inspect.signature(module.forward).parameters
    return name in parameters or any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values()) and name in (
        "logits_to_keep",
    )


def _position_ids(attention_mask: torch.Tensor, length: int) -> torch.Tensor:
    """Positions as ``generate()`` computes them from a (left-padded) mask: ``(B, length)``."""
    positions = attention_mask.long().cumsum(-1) - 1
    positions = positions.masked_fill(attention_mask == 0, 1)
    return positions[:, -length:]


class DecoderStep(torch.nn.Module):
    """A decoder-only model step over a flat ``DynamicCache``: ``(input_ids (B, q), attention_mask (B, P + q),
    past_key_values [2L x (B, H, P, D)] or None) -> (logits (B, V), *present [2L x (B, H, P + q, D)])``.

    For a state-space or hybrid model (``hybrid``) the flat list follows ``schema``: per layer, keys and
    values (B, H, P, D) of an attention part, then each convolution state (B, channels, kernel) and
    state-space state (B, ...) of a recurrent part, fixed in size from step to step."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.config = model.config
        self._positions = _accepts(model, "position_ids")
        self._keep = _accepts(model, "logits_to_keep")
        #: set for a hybrid model (recurrent and attention layers): the cache is built from the config,
        #: and the flat tensors follow this schema (:func:`hybrid_schema`), read off the eager prefill
        self.hybrid = False
        self.schema: list[dict[str, Any]] | None = None
        #: the forward argument (and output field) that carries the cache: ``cache_params`` for the
        #: state-space models (Mamba, Mamba-2, FalconMamba)
        self.cache_name = "past_key_values"
        #: whether the model takes the attention mask on decode steps: the state-space models
        #: (``cache_params``: Mamba, Mamba-2, FalconMamba) take None there, as their
        #: ``prepare_inputs_for_generation`` gives (their padding mask applies to the prompt only), and
        #: a (B, P + 1) mask would be applied to the one new token's states. Not read off the example's
        #: decode call: ``generate()`` drops an all-ones mask for every model
        self.decode_mask = True

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past_key_values: list[torch.Tensor] | None = None):
        return self._step(input_ids, attention_mask, past_key_values)

    def _step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, past_key_values: list[torch.Tensor] | None, **extra: Any):
        if self.hybrid:
            cache = hybrid_cache(self.config, self.schema or [], past_key_values)
        else:
            cache = dynamic_cache(past_key_values)
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            # the graph keeps the (B, P + 1) mask input on a decode step without a mask: the positions
            # still come from it, and the model does not read it
            "attention_mask": attention_mask if past_key_values is None or self.decode_mask else None,
            self.cache_name: cache,
            "use_cache": True,
            **extra,
        }
        if self._positions:
            kwargs["position_ids"] = _position_ids(attention_mask, input_ids.shape[1])
        if self._keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        if self.hybrid:
            returned = getattr(out, self.cache_name)
            if self.schema is None:
                self.schema = hybrid_schema(returned)
            return (out.logits[:, -1, :], *flat_hybrid(returned, self.schema))
        return (out.logits[:, -1, :], *flat_cache(out.past_key_values))


class MultimodalPrefillStep(DecoderStep):
    """The prefill step of a decoder-only multimodal model (LLaVA, ...) given its encoder's features:
    ``(input_ids (B, T), attention_mask (B, T), <modality>_features (N, E)) -> (logits (B, V), *present)``.

    ``input_ids`` hold one placeholder token per feature row; the model puts the features in their
    place (``mm_encoder_outputs``, transformers' interface for precomputed encoder outputs), so the
    graph has no vision or audio tower in it. ``N`` is the number of placeholder tokens in the batch.
    """

    def __init__(self, model: torch.nn.Module, modality: str):
        super().__init__(model)
        self.modality = modality

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor):  # type: ignore[override]
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        outputs = {self.modality: BaseModelOutputWithPooling(pooler_output=[features])}
        return self._step(input_ids, attention_mask, None, mm_encoder_outputs=outputs)


class ModalityEncoderStep(torch.nn.Module):
    """A multimodal model's encoder for one modality, projector included: ``get_<modality>_features``.

    ``(pixel_values (B, C, H, W), ...) -> features (N, E)``: the rows of every item, in batch order,
    in the language model's hidden size ``E`` (one row per placeholder token of the prompt).
    """

    def __init__(self, model: torch.nn.Module, getter: str):
        super().__init__()
        self.model = model
        self.getter = getter

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        out = getattr(self.model, self.getter)(**inputs, return_dict=True)
        features = getattr(out, "pooler_output", out)
        if isinstance(features, (list, tuple)):
            features = torch.cat(list(features), dim=0)
        return features.reshape(-1, features.shape[-1])


def _fill_static_layer(layer: Any, keys: torch.Tensor, values: torch.Tensor, start: torch.Tensor) -> None:
    """Make ``layer`` (a ``StaticLayer``) hold ``keys`` and ``values`` (``(B, H, M, D)``, used as they are: the
    layer writes into them) with its running length at ``start`` (a 0-d tensor)."""
    layer.batch_size, layer.num_heads = keys.shape[0], keys.shape[1]
    layer.k_head_dim, layer.v_head_dim = keys.shape[-1], values.shape[-1]
    layer.dtype, layer.device = keys.dtype, keys.device
    layer.keys, layer.values = keys, values
    layer.cumulative_length = start.clone()
    layer.is_initialized = True


@functools.cache
def _positioned_layer_class() -> type:
    """A ``StaticLayer`` that writes the new keys and values at the step's ``positions`` (its
    ``cache_position``, ``index_copy_`` along the sequence axis), where transformers' layer writes at
    ``arange(q)`` past its own running length: the program's write positions are then its input, which
    the runners bound-check (:func:`hf_exporters.exporters.executorch.input_index_bounds`)."""
    from transformers.cache_utils import StaticLayer

    class PositionedLayer(StaticLayer):
        positions: torch.Tensor

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            self.keys.index_copy_(2, self.positions, key_states)
            self.values.index_copy_(2, self.positions, value_states)
            self.cumulative_length.add_(key_states.shape[-2])
            return self.keys, self.values

    return PositionedLayer


class StaticDecoderStep(torch.nn.Module):
    """A decoder-only model step over a flat ``StaticCache`` of ``max_cache_len`` positions:
    ``(input_ids (B, q), attention_mask (B, M), cache_position (q,), past_key_values [2L x (B, H, M, D)])
    -> (logits (B, V), *updated caches [2L x (B, H, M, D)])``."""

    def __init__(self, model: torch.nn.Module, max_cache_len: int):
        super().__init__()
        self.model = model
        self.config = model.config
        self.max_cache_len = max_cache_len
        self._positions = _accepts(model, "position_ids")
        self._keep = _accepts(model, "logits_to_keep")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache_position: torch.Tensor, past_key_values: list[torch.Tensor]):
        from transformers.cache_utils import StaticCache

        cache = StaticCache(config=self.config, max_cache_len=self.max_cache_len)
        for layer, i in zip(cache.layers, range(0, len(past_key_values), 2)):
            # the layer writes at cumulative_length .. + q (a tensor it advances in place), into copies of the inputs
            _fill_static_layer(layer, past_key_values[i].clone(), past_key_values[i + 1].clone(), cache_position[0])
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "cache_position": cache_position,
            "past_key_values": cache,
            "use_cache": True,
        }
        if self._positions:
            positions = attention_mask.long().cumsum(-1) - 1
            kwargs["position_ids"] = positions.masked_fill(attention_mask == 0, 1).index_select(1, cache_position)
        if self._keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        return (out.logits[:, -1, :], *flat_cache(out.past_key_values))


class ProgramCacheStep(torch.nn.Module):
    """A decoder-only model step whose key/value cache is held by the module, as buffers the step updates in
    place: ``(input_ids (1, q), cache_position (q,)) -> logits (1, q, V)``.

    The buffers are a ``StaticCache`` of ``max_cache_len`` positions for batch 1 (``key_cache_<i>`` and
    ``value_cache_<i>``, ``(1, kv_heads, max_cache_len, head_dim)``); each call builds a ``StaticCache``
    over them that writes the ``q`` new keys and values at ``cache_position`` and attends to every earlier
    position. ``torch.export`` records the writes as buffer mutations, which ExecuTorch keeps as mutable
    buffers of the program. transformers' own wrapper (``TorchExportableModuleWithStaticCache``) keeps each
    layer's write position as a buffer too, and its program fails ``run_decompositions`` in torch 2.13
    (AOTAutograd's duplicate-argument wrapper); here the position comes from ``cache_position`` alone.

    With ``custom_ops`` (ExecuTorch's LLM operators, :mod:`hf_exporters.generation.executorch_ops`), the
    buffers are ``(1, max_cache_len, kv_heads, head_dim)``, ``llama::update_cache`` writes them at
    ``cache_position[0]`` and ``llama::custom_sdpa`` attends over the filled positions only; the model's
    attention implementation is switched to that operator for the step's forward and restored after.

    Raises:
        InputError: a layer of the model's cache is not a full static layer (sliding-window, chunked or
            recurrent layers: their update is data-dependent).
    """

    def __init__(self, model: torch.nn.Module, max_cache_len: int, custom_ops: bool = False):
        super().__init__()
        from transformers.cache_utils import StaticLayer
        from transformers.configuration_utils import get_head_shapes

        self.model = model
        self.max_cache_len = max_cache_len
        config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        self.text_config = config
        cache = self._cache(config, max_cache_len)
        others = sorted({type(layer).__name__ for layer in cache.layers if type(layer) is not StaticLayer})
        if others:
            sliding = any("Sliding" in name or "Chunked" in name for name in others)
            raise InputError(
                f"--kv-cache program holds full static caches; {type(model).__name__}'s cache has {', '.join(others)} layers"
                + (" (a sliding window is a full cache only when --max-seq-len is at most the window)" if sliding else " (recurrent state, not a key/value cache)")
            )
        heads, head_dim = get_head_shapes(config)
        cache.early_initialization(1, heads, head_dim, model.dtype, torch.device("cpu"))
        self.layers = len(cache.layers)
        self.custom_ops = custom_ops
        for i, layer in enumerate(cache.layers):
            keys, values = (layer.keys.transpose(1, 2), layer.values.transpose(1, 2)) if custom_ops else (layer.keys, layer.values)
            self.register_buffer(f"key_cache_{i}", torch.zeros_like(keys, memory_format=torch.contiguous_format), persistent=False)
            self.register_buffer(f"value_cache_{i}", torch.zeros_like(values, memory_format=torch.contiguous_format), persistent=False)
        self._positions = _accepts(model, "position_ids")

    @staticmethod
    def _cache(config: Any, max_cache_len: int) -> Any:
        """A ``StaticCache`` of ``max_cache_len`` positions whose sliding-window layers with a window of at
        least ``max_cache_len`` are full layers: such a window never drops a position the cache holds."""
        from transformers.cache_utils import StaticCache, StaticLayer, StaticSlidingWindowLayer

        cache = StaticCache(config=config, max_cache_len=max_cache_len)
        for i, layer in enumerate(cache.layers):
            if type(layer) is StaticSlidingWindowLayer and int(getattr(layer, "max_cache_len", 0) or 0) >= max_cache_len:  # min(window, max_cache_len)
                cache.layers[i] = StaticLayer(max_cache_len)
        return cache

    def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        from transformers.cache_utils import StaticCache

        cache = StaticCache(config=self.text_config, max_cache_len=self.max_cache_len)
        kwargs: dict[str, Any] = {"input_ids": input_ids, "cache_position": cache_position, "past_key_values": cache, "use_cache": True}
        if self._positions:
            kwargs["position_ids"] = cache_position.unsqueeze(0)
        if self.custom_ops:
            from .executorch_ops import custom_op_attention, custom_op_layer_class

            start = cache_position[0].item()
            torch._check_is_size(start)
            torch._check(start + input_ids.shape[1] <= self.max_cache_len)
            cache.layers = [custom_op_layer_class()(self.max_cache_len) for _ in range(self.layers)]
            for i, layer in enumerate(cache.layers):
                # the buffers, (1, M, kv_heads, head_dim): the layer reports the heads-first shape transformers reads
                _fill_static_layer(layer, getattr(self, f"key_cache_{i}").transpose(1, 2), getattr(self, f"value_cache_{i}").transpose(1, 2), cache_position[0])
                layer.keys, layer.values = getattr(self, f"key_cache_{i}"), getattr(self, f"value_cache_{i}")
            with custom_op_attention(self.model.config, start) as calls:
                logits = self.model(**kwargs).logits
            if calls[0] != self.layers:  # attention of the model's own (Bloom): it would read the caches heads-first
                raise InputError(
                    f"{type(self.model).__name__} attends through transformers' attention interface in {calls[0]} of its {self.layers} "
                    "layers, so ExecuTorch's custom SDPA cannot stand in for its attention; export with --no-custom-sdpa"
                )
            return logits
        cache.layers = [_positioned_layer_class()(self.max_cache_len) for _ in range(self.layers)]
        for i, layer in enumerate(cache.layers):
            layer.positions = cache_position
            # not copies: the layer writes into the buffers
            _fill_static_layer(layer, getattr(self, f"key_cache_{i}"), getattr(self, f"value_cache_{i}"), cache_position[0])
        return self.model(**kwargs).logits


class EncoderStep(torch.nn.Module):
    """The encoder of an encoder-decoder model: ``(**encoder inputs) -> encoder_hidden_states (B, S, E)``."""

    def __init__(self, encoder: torch.nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.encoder(**inputs, return_dict=True).last_hidden_state


class Seq2SeqDecoderStep(torch.nn.Module):
    """A decoder step of an encoder-decoder model over a flat ``EncoderDecoderCache``:
    ``(decoder_input_ids (B, q), encoder_hidden_states (B, S, E), attention_mask (B, S) or None,
    past_key_values [2L self (B, H, P, D)] + [2L cross (B, H, S, D)] or None)
    -> (logits (B, V), *self caches (B, H, P + q, D), *cross caches)``."""

    def __init__(self, model: torch.nn.Module, encoder_output_class: type | None = None):
        super().__init__()
        self.model = model
        self.config = model.config
        # the class the model's own encoder returns (Moonshine's carries an attention_mask field the
        # decoder reads); its other fields stay None
        self.encoder_output_class = encoder_output_class

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: list[torch.Tensor] | None = None,
    ):
        from transformers.cache_utils import EncoderDecoderCache
        from transformers.modeling_outputs import BaseModelOutput

        flat = past_key_values or []
        half = len(flat) // 2
        cache = EncoderDecoderCache(dynamic_cache(flat[:half] or None), dynamic_cache(flat[half:] or None))
        kwargs: dict[str, Any] = {
            "decoder_input_ids": decoder_input_ids,
            "encoder_outputs": (self.encoder_output_class or BaseModelOutput)(last_hidden_state=encoder_hidden_states),
            "past_key_values": cache,
            "use_cache": True,
        }
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        out = self.model(**kwargs)
        return (out.logits[:, -1, :], *flat_cache(out.past_key_values))

