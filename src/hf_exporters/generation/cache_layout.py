"""Cache layout: the flat tensor lists a transformers cache crosses a graph boundary as.

A key/value cache (``DynamicCache``, each half of an ``EncoderDecoderCache``) is flattened to its
layers' key and value tensors in layer order (:func:`flat_cache`) and rebuilt around such a list
(:func:`dynamic_cache`). A hybrid cache (recurrent and attention layers, from the model config) is
flattened in the order of a *schema* read off the eager prefill (:func:`hybrid_schema`,
:func:`flat_hybrid`, :func:`hybrid_cache`); :func:`is_hybrid_cache` tells whether ``generate()``'s cache
is one, and :func:`hybrid_kinds` names each flat tensor's role for the manifest.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError


def dynamic_cache(flat: list[torch.Tensor] | None) -> Any:
    """A ``DynamicCache`` of full layers holding ``flat`` (key, value per layer); empty when ``flat`` is None."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    cache = DynamicCache()
    for i in range(0, len(flat or []), 2):
        layer = DynamicLayer()
        layer.dtype, layer.device = flat[i].dtype, flat[i].device
        layer.keys, layer.values = flat[i], flat[i + 1]
        layer.is_initialized = True
        cache.layers.append(layer)
    return cache


def flat_cache(cache: Any) -> list[torch.Tensor]:
    """Key and value tensors of every layer of a transformers cache, in layer order (self then cross)."""
    if cache is None:
        raise InputError(
            "the model returned no key/value cache (past_key_values is None): it does not cache as configured "
            "(for BERT-like ...ForCausalLM classes set config.is_decoder=True)"
        )
    if hasattr(cache, "self_attention_cache"):
        return flat_cache(cache.self_attention_cache) + flat_cache(cache.cross_attention_cache)
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


#: cache layer classes whose tensors a hybrid (recurrent + attention) flat cache carries (a DummyLayer,
#: for a layer without attention or recurrence, holds none)
HYBRID_LAYER_CLASSES = ("DynamicLayer", "LinearAttentionLayer", "LinearAttentionAndFullAttentionLayer", "DummyLayer")


def hybrid_schema(cache: Any) -> list[dict[str, Any]]:
    """Per layer of a hybrid ``DynamicCache`` (built from the model config): which tensors it holds, in
    the flat order: ``("keys",)``, ``("values",)`` for an attention part that holds tokens, then
    ``("conv", i)`` and ``("recurrent", i)`` for each initialized state ``i`` of a recurrent part, with
    the flags a decode step needs (``has_previous_state``)."""
    from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin

    schema = []
    for layer in cache.layers:
        entries: list[tuple[Any, ...]] = []
        if isinstance(layer, DynamicLayer) and getattr(layer, "keys", None) is not None and layer.keys.numel() > 0:
            entries += [("keys",), ("values",)]
        previous: dict[int, bool] = {}
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            for i in range(layer.number_of_states):
                if layer.is_conv_states_initialized[i]:
                    entries.append(("conv", i))
                if layer.is_recurrent_states_initialized[i]:
                    entries.append(("recurrent", i))
            previous = dict(layer.has_previous_state)
        schema.append({"entries": entries, "has_previous_state": previous})
    return schema


def flat_hybrid(cache: Any, schema: list[dict[str, Any]]) -> list[torch.Tensor]:
    """The tensors of a hybrid cache in ``schema`` order (:func:`hybrid_schema`)."""
    flat = []
    for layer, layout in zip(cache.layers, schema):
        for entry in layout["entries"]:
            if entry[0] in ("keys", "values"):
                flat.append(getattr(layer, entry[0]))
            else:
                flat.append((layer.conv_states if entry[0] == "conv" else layer.recurrent_states)[entry[1]])
    return flat


def hybrid_cache(config: Any, schema: list[dict[str, Any]], flat: list[torch.Tensor] | None) -> Any:
    """A ``DynamicCache`` with the config's layer kinds, empty (``flat`` None: prefill) or holding
    ``flat`` in ``schema`` order with the prefill's flags set (decode). Recurrent states are cloned:
    the layers update them in place, which must not write into the step's inputs."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=config)
    if flat is None:
        return cache
    tensors = iter(flat)
    for layer, layout in zip(cache.layers, schema):
        for entry in layout["entries"]:
            tensor = next(tensors)
            layer.dtype, layer.device = tensor.dtype, tensor.device
            if entry[0] in ("keys", "values"):
                setattr(layer, entry[0], tensor)
                layer.is_initialized = True
            elif entry[0] == "conv":
                layer.conv_states[entry[1]] = tensor.clone()
                layer.is_conv_states_initialized[entry[1]] = True
                layer.conv_kernel_size[entry[1]] = tensor.shape[-1]
            else:
                layer.recurrent_states[entry[1]] = tensor.clone()
                layer.is_recurrent_states_initialized[entry[1]] = True
        for i, flag in layout["has_previous_state"].items():
            layer.has_previous_state[i] = flag
    return cache


def hybrid_kinds(schema: list[dict[str, Any]]) -> list[str]:
    """Each flat tensor's role and layer: ``key 1``/``value 1`` (batch, kv_heads, seq, head_dim), or
    ``conv.0 0``/``recurrent.0 0`` (batch, ...): the kind with its state index, then the layer index."""
    return [
        (entry[0][:-1] if entry[0] in ("keys", "values") else f"{entry[0]}.{entry[1]}") + f" {index}"
        for index, layout in enumerate(schema)
        for entry in layout["entries"]
    ]


def is_hybrid_cache(model: torch.nn.Module, cache: Any) -> bool:
    """Whether ``generate()``'s cache holds recurrent state (the linear-attention or Mamba layers of a
    hybrid model: convolution and state-space states), which the decode step then carries as fixed-size
    tensors beside the key/value tensors.

    Raises:
        InputError: a recurrent layer kind whose tensors the flat cache does not carry (a sliding-window
            or static attention part); names the kinds.
    """
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    layers = getattr(cache, "layers", [])
    if not any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers):
        return False
    other = sorted({type(layer).__name__ for layer in layers if type(layer).__name__ not in HYBRID_LAYER_CLASSES})
    if other:
        raise InputError(
            f"{type(model).__name__}: generate()'s cache holds recurrent state beside layers of kind {', '.join(other)}; "
            f"only {', '.join(HYBRID_LAYER_CLASSES)} layers are supported in a hybrid cache yet"
        )
    return True

