"""Generation from exported graphs: decompose a model into the parts a generation loop calls, export
each part with one backend, write an artifact folder, and run ``generate()`` from that folder alone.

The flow::

    captured = decompose_for_generation(model, inputs)          # hooks on a real generate() (2 new tokens)
    parts = exporter.export_for_generation(model, inputs, cfg)  # {part name: native artifact}
    parts.save_pretrained("out/")                               # part files, configs, export.json
    ExportedGenerator.from_pretrained("out/").generate(input_ids, max_new_tokens=8)

Parts and their graphs (``B`` batch, ``T`` prompt length, ``P`` cached positions, ``V`` vocabulary,
``L`` decoder layers, ``H`` key/value heads, ``D`` head dim, ``S`` encoder length, ``E`` hidden size):

* decoder-only models

  - ``prefill``: ``input_ids (B, T)``, ``attention_mask (B, T)`` ->
    ``logits (B, V)`` (last position), ``present_0 .. present_{2L-1}`` (``(B, H, T, D)``, key then value per layer).
  - ``decode``: ``input_ids (B, 1)``, ``attention_mask (B, P + 1)``, ``past_key_values_0 .. _{2L-1}``
    (``(B, H, P, D)``) -> ``logits (B, V)``, ``present_*`` (``(B, H, P + 1, D)``).

* encoder-decoder models (T5, Bart, Whisper, ...)

  - ``encoder``: the encoder's own inputs (``input_ids``/``attention_mask`` or ``input_features``) ->
    ``encoder_hidden_states (B, S, E)``.
  - ``decoder_prefill``: ``decoder_input_ids (B, 1)``, ``encoder_hidden_states``, ``attention_mask (B, S)``
    (when the encoder took one) -> ``logits (B, V)``, self-attention then cross-attention key/values.
  - ``decoder``: the same plus ``past_key_values_*`` (the self-attention cache ``(B, H, P, D)`` then the
    cross-attention cache ``(B, H, S, D)``) -> ``logits``, the updated caches.

* ``cache_implementation="static"`` (decoder-only): ``prefill`` and ``decode`` graphs of one step module over a fixed-size cache.
  ``input_ids (B, q)``, ``attention_mask (B, M)`` (``M`` = ``max_cache_len``, 1 where a position is
  filled or written by this step), ``cache_position (q,)``, ``past_key_values_* (B, H, M, D)`` ->
  ``logits (B, V)``, the updated caches (``(B, H, M, D)``, written at ``cache_position``). The prefill
  graph takes ``q = T`` tokens and a zeroed cache, the decode graph ``q = 1``.

The caches cross the graph boundary as flat tensor lists: each graph rebuilds a transformers
``DynamicCache`` / ``EncoderDecoderCache`` / ``StaticCache`` around them, so no cache object (and no
Python int a cache keeps, such as a sliding window layer's running length) is baked into a graph.
Sliding-window layers are kept as full layers: the sliding window is applied by the attention mask
(transformers' ``create_sliding_window_causal_mask``), so tokens equal eager generation past the window.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import inspect
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from .errors import ArtifactRunError, HfExportersError, InputError, ManifestError
from .folders import MANIFEST_NAME

logger = logging.getLogger("hf_exporters")

__all__ = [
    "GENERATION_SCHEMA_VERSION",
    "ExportedGenerator",
    "GenerationArtifacts",
    "GenerationPart",
    "decompose_for_generation",
    "export_for_generation",
    "export_generation_folder",
]

#: version of the ``export.json`` layout of a generation folder; readers refuse other versions
GENERATION_SCHEMA_VERSION = 1
#: relative part of a part's parity tolerance: outputs may differ by ``atol + PARITY_RTOL * max|eager output|``
PARITY_RTOL = 1e-5
#: names of generation-config keys the CLI and :meth:`ExportedGenerator.generate` accept as overrides
_SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "num_beams")


# ── Capture ───────────────────────────────────────────────────────────────────


def _clone(value: Any) -> Any:
    from .pytree import register_model_pytrees
    from .shapes import clone_tree

    register_model_pytrees(None, value)
    try:
        return clone_tree(value)
    except TypeError:  # a cache the generic flatten cannot walk: keep a deep copy
        return copy.deepcopy(value)


@contextlib.contextmanager
def _capture_calls(module: torch.nn.Module) -> Iterator[list[dict[str, Any]]]:
    """Record the keyword arguments (positional ones bound to their names) of every ``module`` call."""
    calls: list[dict[str, Any]] = []
    signature = inspect.signature(module.forward)

    def hook(mod: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        bound = signature.bind_partial(*args, **kwargs).arguments
        flat: dict[str, Any] = {}
        for name, value in bound.items():
            kind = signature.parameters[name].kind
            if kind == inspect.Parameter.VAR_KEYWORD:
                flat.update(value)
            elif kind != inspect.Parameter.VAR_POSITIONAL:
                flat[name] = value
        calls.append({k: _clone(v) for k, v in flat.items()})

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def _encoder_of(model: torch.nn.Module) -> torch.nn.Module | None:
    if not getattr(model.config, "is_encoder_decoder", False):
        return None
    get = getattr(model, "get_encoder", None)
    return get() if callable(get) else None


def decompose_for_generation(model: torch.nn.Module, inputs: Mapping[str, Any], generation_config: Any = None) -> dict[str, dict[str, Any]]:
    """Run ``model.generate(**inputs)`` for two new tokens and capture the keyword arguments of each step.

    Args:
        model: a transformers generative model (``GenerationMixin``).
        inputs: ``generate()`` keyword arguments: ``input_ids (B, T)``, ``attention_mask (B, T)``,
            ``input_features (B, F, N)`` (speech), ...
        generation_config: optional ``GenerationConfig`` (e.g. ``cache_implementation="static"``).

    Returns:
        ``{"prefill": kwargs, "decode": kwargs}`` for decoder-only models; encoder-decoder models add
        ``"encoder"`` (the encoder's kwargs) and the prefill/decode kwargs are the decoder steps;
        ``"generate"`` holds ``{"sequences": ids generate() returned}``. Tensors
        and caches are copies taken when the call was made (a decode step's cache is the filled one).

    Raises:
        InputError: ``generate()`` failed with these inputs, or did not call ``forward`` once per token.
    """
    config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    config.max_new_tokens = config.min_new_tokens = 2
    config.do_sample = False
    encoder = _encoder_of(model)
    with contextlib.ExitStack() as stack, torch.no_grad():
        calls = stack.enter_context(_capture_calls(model))
        encoder_calls = stack.enter_context(_capture_calls(encoder)) if encoder is not None else []
        try:
            generated = model.generate(**_clone(dict(inputs)), generation_config=config)
        except Exception as error:  # noqa: BLE001 - reported with the inputs given
            raise InputError(f"generate() failed for {type(model).__name__} with inputs {sorted(inputs)}: {error}") from error
    if len(calls) < 2:
        raise InputError(
            f"{type(model).__name__}.generate() called forward {len(calls)} time(s) for 2 new tokens; "
            "a generation loop that bypasses forward() cannot be decomposed"
        )
    captured = {"prefill": calls[0], "decode": calls[1]}
    sequences = getattr(generated, "sequences", generated)
    captured["generate"] = {"sequences": sequences.clone() if isinstance(sequences, torch.Tensor) else None}
    if encoder is not None:
        if not encoder_calls:
            raise InputError(f"{type(model).__name__}.generate() did not call its encoder")
        captured["encoder"] = encoder_calls[0]
    return captured


# ── Graph modules (one per part) ──────────────────────────────────────────────


def _accepts(module: torch.nn.Module, name: str) -> bool:
    parameters = inspect.signature(module.forward).parameters
    return name in parameters or any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values()) and name in (
        "logits_to_keep",
    )


def _dynamic_cache(flat: list[torch.Tensor] | None) -> Any:
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


def _flat_cache(cache: Any) -> list[torch.Tensor]:
    """Key and value tensors of every layer of a transformers cache, in layer order (self then cross)."""
    if cache is None:
        raise InputError(
            "the model returned no key/value cache (past_key_values is None): it does not cache as configured "
            "(for BERT-like ...ForCausalLM classes set config.is_decoder=True)"
        )
    if hasattr(cache, "self_attention_cache"):
        return _flat_cache(cache.self_attention_cache) + _flat_cache(cache.cross_attention_cache)
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


#: cache layer classes whose tensors a hybrid (recurrent + attention) flat cache carries (a DummyLayer,
#: for a layer without attention or recurrence, holds none)
_HYBRID_LAYER_CLASSES = ("DynamicLayer", "LinearAttentionLayer", "LinearAttentionAndFullAttentionLayer", "DummyLayer")


def _hybrid_schema(cache: Any) -> list[dict[str, Any]]:
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


def _flat_hybrid(cache: Any, schema: list[dict[str, Any]]) -> list[torch.Tensor]:
    """The tensors of a hybrid cache in ``schema`` order (:func:`_hybrid_schema`)."""
    flat = []
    for layer, layout in zip(cache.layers, schema):
        for entry in layout["entries"]:
            if entry[0] in ("keys", "values"):
                flat.append(getattr(layer, entry[0]))
            else:
                flat.append((layer.conv_states if entry[0] == "conv" else layer.recurrent_states)[entry[1]])
    return flat


def _hybrid_cache(config: Any, schema: list[dict[str, Any]], flat: list[torch.Tensor] | None) -> Any:
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


def _hybrid_kinds(schema: list[dict[str, Any]]) -> list[str]:
    """Each flat tensor's role and layer: ``key 1``/``value 1`` (batch, kv_heads, seq, head_dim), or
    ``conv.0 0``/``recurrent.0 0`` (batch, ...): the kind with its state index, then the layer index."""
    return [
        (entry[0][:-1] if entry[0] in ("keys", "values") else f"{entry[0]}.{entry[1]}") + f" {index}"
        for index, layout in enumerate(schema)
        for entry in layout["entries"]
    ]


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
        #: and the flat tensors follow this schema (:func:`_hybrid_schema`), read off the eager prefill
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
            cache = _hybrid_cache(self.config, self.schema or [], past_key_values)
        else:
            cache = _dynamic_cache(past_key_values)
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
                self.schema = _hybrid_schema(returned)
            return (out.logits[:, -1, :], *_flat_hybrid(returned, self.schema))
        return (out.logits[:, -1, :], *_flat_cache(out.past_key_values))


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
            layer.batch_size, layer.num_heads = past_key_values[i].shape[0], past_key_values[i].shape[1]
            layer.k_head_dim, layer.v_head_dim = past_key_values[i].shape[-1], past_key_values[i + 1].shape[-1]
            layer.dtype, layer.device = past_key_values[i].dtype, past_key_values[i].device
            layer.keys, layer.values = past_key_values[i].clone(), past_key_values[i + 1].clone()
            # the layer writes at cumulative_length .. + q (a tensor it advances in place)
            layer.cumulative_length = cache_position[0].clone()
            layer.is_initialized = True
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
        return (out.logits[:, -1, :], *_flat_cache(out.past_key_values))


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
        cache = EncoderDecoderCache(_dynamic_cache(flat[:half] or None), _dynamic_cache(flat[half:] or None))
        kwargs: dict[str, Any] = {
            "decoder_input_ids": decoder_input_ids,
            "encoder_outputs": (self.encoder_output_class or BaseModelOutput)(last_hidden_state=encoder_hidden_states),
            "past_key_values": cache,
            "use_cache": True,
        }
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        out = self.model(**kwargs)
        return (out.logits[:, -1, :], *_flat_cache(out.past_key_values))


# ── Parts ─────────────────────────────────────────────────────────────────────


@dataclasses.dataclass
class GenerationPart:
    """One graph of the generation loop before export: the module, its example inputs and its metadata.

    Attributes:
        name: part name (``prefill``, ``decode``, ``encoder``, ``decoder_prefill``, ``decoder``).
        role: ``encoder``, ``prefill`` or ``decode``.
        module: the ``torch.nn.Module`` exported (a :class:`DecoderStep`, ...).
        inputs: example keyword arguments (tensors; ``past_key_values`` a list of tensors).
        dynamic_shapes: the ``dynamic_shapes`` used for export (``Dim.AUTO`` on batch, sequence and cache axes).
        output_names: names of the graph outputs in order.
        cache: cache layout (``kind``, ``layers``, ``tensor_layout``), or None for the encoder.
        extra: loop facts written to the manifest (``returns_decoder_prompt``: whether eager
            ``generate()`` returns the decoder start tokens of an encoder-decoder model).
    """

    name: str
    role: str
    module: torch.nn.Module
    inputs: dict[str, Any]
    dynamic_shapes: dict[str, Any]
    output_names: list[str]
    cache: dict[str, Any] | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def _auto(*axes: int) -> dict[int, Any]:
    return dict.fromkeys(axes, torch.export.Dim.AUTO)


# Dim.AUTO on batch, sequence and cache axes. Shared named dimensions (Dim("batch"), Dim("past"))
# would let a lowering that re-traces the program prove the caches, mask and queries agree, but they
# fail the trace on guards such as ``batch != 1`` from the masking utilities; kept as AUTO for now.
_BATCH = _SEQ = _PAST = _ENCODER_SEQ = torch.export.Dim.AUTO
#: upper bound of a named cache-length dimension (positions)
_MAX_PAST = 4096


def _relaxed(spec: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with every named dimension whose example size is 0 or 1 (and every dimension derived
    from it) replaced by ``Dim.AUTO``: a named dimension torch.export sees as 1 in the example fails
    the export (it specialises), while ``Dim.AUTO`` with size-oblivious sizes stays symbolic."""
    small: set[str] = set()
    for name, axes in spec.items():
        values = inputs.get(name)
        tensors = values if isinstance(values, list) else [values]
        specs = axes if isinstance(axes, list) else [axes]
        for tensor, dims in zip(tensors, specs):
            for axis, dim in (dims or {}).items():
                if hasattr(dim, "__name__") and isinstance(tensor, torch.Tensor) and tensor.shape[axis] < 2:
                    small.add(dim.__name__)

    def fix(dims: Any) -> Any:
        if dims is None:
            return None
        return {a: (torch.export.Dim.AUTO if any(n in str(d) for n in small) else d) for a, d in dims.items()}

    return {k: ([fix(d) for d in v] if isinstance(v, list) else fix(v)) for k, v in spec.items()}


def _cache_spec(flat: list[torch.Tensor], length: Any = None, kinds: list[str] | None = None) -> list[dict[int, Any]]:
    """Dynamic axes of flat cache tensors: batch, and the sequence axis 2 of key/value tensors when
    ``length`` is given (recurrent states, named by ``kinds``, have no sequence axis)."""
    def seq(i: int) -> bool:
        return length is not None and (kinds is None or kinds[i].split(" ")[0] in ("key", "value"))

    return [{0: _BATCH, 2: length} if seq(i) else {0: _BATCH} for i in range(len(flat))]


def _present_names(count: int) -> list[str]:
    return [f"present_{i}" for i in range(count)]


def _mask_or_ones(call: dict[str, Any], ids: torch.Tensor, key: str = "attention_mask") -> torch.Tensor:
    mask = call.get(key)
    return mask.clone() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else torch.ones_like(ids)


def build_parts(model: torch.nn.Module, inputs: Mapping[str, Any], generation_config: Any = None) -> dict[str, GenerationPart]:
    """The parts of ``model``'s generation loop with example inputs taken from a real ``generate()``.

    Args:
        model: a transformers generative model, in eval mode.
        inputs: ``generate()`` keyword arguments (``input_ids (B, T)``, ``attention_mask (B, T)``, ...).
        generation_config: optional; ``cache_implementation="static"`` (with ``max_cache_len``) selects
            the static-cache decode graph.

    Returns:
        ``{part name: GenerationPart}`` in the order the loop calls them.

    Raises:
        InputError: ``generate()`` cannot run on ``inputs``, or the model kind is not supported
            (a sliding-window recurrent layer, a video or audio encoder of a decoder-only model).
    """
    model.eval()
    captured = decompose_for_generation(model, inputs, generation_config)
    prefill_call, decode_call = captured["prefill"], captured["decode"]
    gen = generation_config if generation_config is not None else model.generation_config
    given = {**dict(inputs), **prefill_call}
    modality = _modality_of(model, given)
    with torch.no_grad():
        if modality is not None:
            return _multimodal_parts(model, given, decode_call, modality)
        if "encoder" in captured:
            return _seq2seq_parts(model, captured)
        if getattr(gen, "cache_implementation", None) == "static":
            return _static_parts(model, prefill_call, decode_call, int(gen.max_cache_len or 0) or None)
        return _decoder_only_parts(model, prefill_call, decode_call)


def _decode_example(decode_call: dict[str, Any], mask: torch.Tensor, cache: list[torch.Tensor]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The decode graph's example (the token eager's decode step took, the mask one longer, the prefill's
    cache) and the dynamic cache layout."""
    inputs = {
        "input_ids": decode_call["input_ids"][:, -1:].clone(),
        "attention_mask": torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1),
        "past_key_values": cache,
    }
    layout = {"kind": "dynamic", "layers": len(cache) // 2, "tensor_layout": "(batch, kv_heads, seq, head_dim); key then value per layer"}
    return inputs, layout


def _hybrid_cache_layers(model: torch.nn.Module, cache: Any) -> bool:
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
    other = sorted({type(layer).__name__ for layer in layers if type(layer).__name__ not in _HYBRID_LAYER_CLASSES})
    if other:
        raise InputError(
            f"{type(model).__name__}: generate()'s cache holds recurrent state beside layers of kind {', '.join(other)}; "
            f"only {', '.join(_HYBRID_LAYER_CLASSES)} layers are supported in a hybrid cache yet"
        )
    return True


def _hybrid_layout(step: DecoderStep, layout: dict[str, Any]) -> tuple[dict[str, Any], list[str] | None]:
    """The manifest's cache entry and each flat tensor's role for ``step``: ``layout`` unchanged and None
    for a key/value cache, the hybrid layout (:func:`_hybrid_kinds`) for a recurrent one."""
    if not step.hybrid:
        return layout, None
    kinds = _hybrid_kinds(step.schema or [])
    return {
        "kind": "dynamic",
        "layers": len(step.schema or []),
        "tensor_layout": "per layer in order: key then value (batch, kv_heads, seq, head_dim) for an attention layer, then "
        "each recurrent state (batch, ...), fixed size; the past's tensors are the previous step's presents",
        "tensors": kinds,
    }, kinds


def _decoder_only_parts(model: torch.nn.Module, prefill_call: dict[str, Any], decode_call: dict[str, Any]) -> dict[str, GenerationPart]:
    parameters = inspect.signature(model.forward).parameters
    filled = decode_call.get("past_key_values", decode_call.get("cache_params"))
    if not {"past_key_values", "cache_params"} & set(parameters) and not any(
        isinstance(t, torch.Tensor) for layer in getattr(filled, "layers", []) for t in (getattr(layer, "keys", None), *getattr(layer, "conv_states", {}).values())
    ):
        # generate() hands its cache through **kwargs, and the prefill left it empty
        if "state" in parameters:  # RWKV: its own recurrent state list
            raise InputError(
                f"{type(model).__name__}: forward carries its recurrent state as `state` (not a transformers cache); "
                "a decode step over it is not exported yet"
            )
        raise InputError(
            f"{type(model).__name__}: forward takes no cache (neither past_key_values nor cache_params); generate() "
            "recomputes the whole sequence at every step, so there is no decode step to export"
        )
    cache_name = "cache_params" if "cache_params" in prefill_call or "past_key_values" not in parameters else "past_key_values"
    if "input_ids" not in prefill_call:
        raise InputError(f"{type(model).__name__}: generate() did not pass input_ids to forward")
    step = DecoderStep(model)
    step.cache_name = cache_name
    step.hybrid = _hybrid_cache_layers(model, prefill_call.get(cache_name))
    step.decode_mask = cache_name != "cache_params"
    if cache_name == "cache_params" and not step.hybrid:
        raise InputError(
            f"{type(model).__name__}: a state-space cache (cache_params) of kind {type(prefill_call.get(cache_name)).__name__} "
            "is not supported; only caches of transformers' recurrent cache layers are"
        )
    ids = prefill_call["input_ids"]
    mask = _mask_or_ones(prefill_call, ids)
    prefill_inputs = {"input_ids": ids, "attention_mask": mask}
    out = step(**prefill_inputs)
    cache = [t.clone() for t in out[1:]]
    if not cache:
        raise InputError(f"{type(model).__name__}: the model returned no cache tensors (neither keys and values nor recurrent states)")
    decode_inputs, layout = _decode_example(decode_call, mask, cache)
    layout, kinds = _hybrid_layout(step, layout)
    return {
        "prefill": GenerationPart(
            "prefill",
            "prefill",
            step,
            prefill_inputs,
            {"input_ids": {0: _BATCH, 1: _SEQ}, "attention_mask": {0: _BATCH, 1: _SEQ}},
            ["logits", *_present_names(len(cache))],
            layout,
        ),
        "decode": GenerationPart(
            "decode",
            "decode",
            step,
            decode_inputs,
            {"input_ids": {0: _BATCH}, "attention_mask": {0: _BATCH, 1: _PAST}, "past_key_values": _cache_spec(cache, _PAST, kinds)},
            ["logits", *_present_names(len(cache))],
            layout,
        ),
    }


#: modality -> (the input that carries it, the model method that encodes it, the part name)
_MODALITIES = {"image": ("pixel_values", "get_image_features", "image_encoder")}
#: inputs of a modality this module cannot export yet
_UNSUPPORTED_MODALITY_INPUTS = ("pixel_values_videos", "input_features", "input_values", "audio_values")


def _modality_of(model: torch.nn.Module, prefill_call: dict[str, Any]) -> str | None:
    """The modality whose encoder a decoder-only model's prefill step ran (None for text only):
    ``generate()`` passes either the raw input (``pixel_values``) or the encoder's outputs it computed
    before the loop (``mm_encoder_outputs={"image": ...}``); ``prefill_call`` holds the prefill step's
    keyword arguments merged over the ``generate()`` inputs.

    Raises:
        InputError: a modality without an encoder part here (video, audio in a decoder-only model), or
            a model without ``mm_encoder_outputs`` (transformers' precomputed-features interface).
    """
    if getattr(model.config, "is_encoder_decoder", False):
        return None
    encoded = prefill_call.get("mm_encoder_outputs") or {}
    present = [name for name, (key, _, _) in _MODALITIES.items() if isinstance(prefill_call.get(key), torch.Tensor) or name in encoded]
    unknown = [name for name in encoded if name not in _MODALITIES]
    if unknown:
        raise InputError(f"{type(model).__name__}: generation with {unknown} encoder parts is not supported yet")
    unsupported = [key for key in _UNSUPPORTED_MODALITY_INPUTS if isinstance(prefill_call.get(key), torch.Tensor)]
    if unsupported:
        raise InputError(f"{type(model).__name__}: generation with {unsupported} (video or audio encoder parts) is not supported yet")
    if not present:
        return None
    modality = present[0]
    getter = _MODALITIES[modality][1]
    if not _accepts_named(model, "mm_encoder_outputs") or not callable(getattr(model, getter, None)):
        raise InputError(
            f"{type(model).__name__}: multimodal generation needs forward(mm_encoder_outputs=...) and {getter}(); "
            "this model has not both"
        )
    return modality


def _accepts_named(module: torch.nn.Module, name: str) -> bool:
    return name in inspect.signature(module.forward).parameters


def _multimodal_parts(model: torch.nn.Module, prefill_call: dict[str, Any], decode_call: dict[str, Any], modality: str) -> dict[str, GenerationPart]:
    """Encoder (``get_<modality>_features``), prefill over the features, and the text decode step."""
    key, getter, part_name = _MODALITIES[modality]
    wanted = inspect.signature(getattr(model, getter)).parameters
    batched = {k: v for k, v in prefill_call.items() if k in wanted and isinstance(v, torch.Tensor)}
    # one item (image) per encoder call: models split the features per item in Python (a list as long
    # as the batch), which would fix the batch of the graph; the generator calls it once per item
    grids = sorted(k for k in batched if k != key and "grid" in k)
    if grids:
        # Qwen-VL-style towers take every image's patches as one (patches, patch_dim) tensor beside a
        # (images, 3) grid: the rows are patches, not images, so the per-image encoder split below does not apply
        raise InputError(
            f"{type(model).__name__}: its {modality} encoder takes flattened patches ({key} of shape "
            f"{tuple(batched[key].shape)}) with {', '.join(grids)}; generation with {modality} inputs of this layout "
            f"is not supported yet (text-only generation is)"
        )
    items = batched[key].shape[0]
    encoder_inputs = {k: (v[:1].clone() if v.dim() and v.shape[0] == items else v) for k, v in batched.items()}
    encoder_step = ModalityEncoderStep(model, getter)
    features = torch.cat([encoder_step(**{k: (v[i : i + 1] if v.dim() and v.shape[0] == items else v) for k, v in batched.items()}) for i in range(items)])
    ids = prefill_call["input_ids"]
    mask = _mask_or_ones(prefill_call, ids)
    feature_name = f"{modality}_features"
    prefill_step = MultimodalPrefillStep(model, modality)
    prefill_step.hybrid = _hybrid_cache_layers(model, prefill_call.get("past_key_values"))
    prefill_inputs = {"input_ids": ids, "attention_mask": mask, "features": features}
    out = prefill_step(**prefill_inputs)
    cache = [t.clone() for t in out[1:]]
    decode_inputs, layout = _decode_example(decode_call, mask, cache)
    layout, kinds = _hybrid_layout(prefill_step, layout)
    decode_step = DecoderStep(model)
    decode_step.hybrid, decode_step.schema = prefill_step.hybrid, prefill_step.schema
    return {
        part_name: GenerationPart(
            part_name, "encoder", encoder_step, encoder_inputs, {}, [feature_name], extra={"modality": modality, "input": key, "per_item": True}
        ),
        "prefill": GenerationPart(
            "prefill",
            "prefill",
            prefill_step,
            prefill_inputs,
            {"input_ids": {0: _BATCH, 1: _SEQ}, "attention_mask": {0: _BATCH, 1: _SEQ}, "features": _auto(0)},
            ["logits", *_present_names(len(cache))],
            layout,
            {"features_input": "features", "modality": modality},
        ),
        "decode": GenerationPart(
            "decode",
            "decode",
            decode_step,
            decode_inputs,
            {"input_ids": {0: _BATCH}, "attention_mask": {0: _BATCH, 1: _PAST}, "past_key_values": _cache_spec(cache, _PAST, kinds)},
            ["logits", *_present_names(len(cache))],
            layout,
        ),
    }


def _static_parts(model: torch.nn.Module, prefill_call: dict[str, Any], decode_call: dict[str, Any], max_cache_len: int | None) -> dict[str, GenerationPart]:
    ids = prefill_call["input_ids"]
    max_len = max_cache_len or int(decode_call["past_key_values"].layers[0].keys.shape[2])
    step = StaticDecoderStep(model, max_len)
    cache_template = decode_call["past_key_values"]
    zeros = [torch.zeros_like(t) for t in _flat_cache(cache_template)]
    batch, length = ids.shape
    mask = torch.zeros(batch, max_len, dtype=torch.long)
    mask[:, :length] = _mask_or_ones(prefill_call, ids)
    out = step(ids, mask, torch.arange(length), zeros)
    cache = [t.clone() for t in out[1:]]
    mask = mask.clone()
    mask[:, length] = 1
    decode_inputs = {
        "input_ids": decode_call["input_ids"][:, -1:].clone(),
        "attention_mask": mask,
        "cache_position": torch.tensor([length]),
        "past_key_values": cache,
    }
    layout = {
        "kind": "static",
        "layers": len(cache) // 2,
        "max_cache_len": max_len,
        "tensor_layout": "(batch, kv_heads, max_cache_len, head_dim); key then value per layer; written at cache_position",
    }
    prefill_mask = torch.zeros(batch, max_len, dtype=torch.long)
    prefill_mask[:, :length] = _mask_or_ones(prefill_call, ids)
    prefill_inputs = {"input_ids": ids, "attention_mask": prefill_mask, "cache_position": torch.arange(length), "past_key_values": zeros}
    return {
        "prefill": GenerationPart(
            "prefill",
            "prefill",
            step,
            prefill_inputs,
            {"input_ids": {0: _BATCH, 1: _SEQ}, "attention_mask": {0: _BATCH}, "cache_position": {0: _SEQ}, "past_key_values": _cache_spec(cache)},
            ["logits", *_present_names(len(cache))],
            layout,
        ),
        "decode": GenerationPart(
            "decode",
            "decode",
            step,
            decode_inputs,
            {"input_ids": {0: _BATCH}, "attention_mask": {0: _BATCH}, "cache_position": None, "past_key_values": _cache_spec(cache)},
            ["logits", *_present_names(len(cache))],
            layout,
        )
    }


def _past_limit(model: torch.nn.Module) -> int:
    """Upper bound of the decoder's named cache length: :data:`_MAX_PAST`, or fewer where the decoder's
    position table is shorter (a decode step at position ``past`` reads row ``past`` of a table of
    ``max_position_embeddings`` rows; past the table the model fails or grows it, so the trace guards
    ``past <= max_position_embeddings - 1``)."""
    config = model.config
    decoder = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    for name in ("max_position_embeddings", "max_target_positions", "n_positions"):
        positions = getattr(decoder, name, None)
        if isinstance(positions, int) and positions > 2:
            return min(_MAX_PAST, positions - 1)
    return _MAX_PAST


def _encoder_output_class(model: torch.nn.Module, encoder_outputs: Any) -> type | None:
    """The ModelOutput class of the encoder outputs ``generate()`` passed to the decoder, or None for a
    plain ``BaseModelOutput``.

    Raises:
        InputError: those outputs carry an encoder-side attention mask with padding (Moonshine's
            downsampled mask), which the exported decoder step does not take yet.
    """
    from transformers.modeling_outputs import BaseModelOutput

    if not isinstance(encoder_outputs, BaseModelOutput) or type(encoder_outputs) is BaseModelOutput:
        return None
    mask = getattr(encoder_outputs, "attention_mask", None)
    if isinstance(mask, torch.Tensor) and not bool((mask != 0).all()):
        raise InputError(
            f"{type(model).__name__}: the encoder returns its own attention mask ({type(encoder_outputs).__name__}.attention_mask) "
            "and the batch is padded; the exported decoder step takes no encoder-side mask yet: generate from unpadded inputs"
        )
    return type(encoder_outputs)


def _seq2seq_parts(model: torch.nn.Module, captured: dict[str, dict[str, Any]]) -> dict[str, GenerationPart]:
    encoder_call = {k: v for k, v in captured["encoder"].items() if isinstance(v, torch.Tensor)}
    encoder_step = EncoderStep(_encoder_of(model))
    hidden = encoder_step(**encoder_call)
    first = captured["prefill"]
    decoder_step = Seq2SeqDecoderStep(model, _encoder_output_class(model, first.get("encoder_outputs")))
    start = first["decoder_input_ids"].clone()
    mask = encoder_call.get("attention_mask")
    prefill_inputs: dict[str, Any] = {"decoder_input_ids": start, "encoder_hidden_states": hidden}
    spec: dict[str, Any] = {"decoder_input_ids": {0: _BATCH}, "encoder_hidden_states": {0: _BATCH, 1: _ENCODER_SEQ}}
    if mask is not None:
        prefill_inputs["attention_mask"] = mask
        spec["attention_mask"] = {0: _BATCH, 1: _ENCODER_SEQ}
    out = decoder_step(**prefill_inputs)
    cache = [t.clone() for t in out[1:]]
    half = len(cache) // 2
    token = captured["decode"]["decoder_input_ids"][:, -1:].clone()
    past = torch.export.Dim.AUTO
    if half and cache[0].shape[2] < 2:
        # The decode example takes one step more, so that its self-attention cache holds 2 positions:
        # the shared named dimension ``past`` (one symbol for every layer's self-attention key and
        # value) then survives the trace, and lowerings that re-trace the program (ExecuTorch's
        # to_edge) still see that the layers' cache lengths are equal.
        stepped = decoder_step(**prefill_inputs, past_key_values=[t.clone() for t in cache])
        cache = [t.clone() for t in stepped[1:]]
        token = stepped[0].argmax(-1, keepdim=True)
        past = torch.export.Dim("past", min=1, max=_past_limit(model))
    decode_inputs = {**prefill_inputs, "decoder_input_ids": token, "past_key_values": cache}
    sequences = captured.get("generate", {}).get("sequences")
    # Some models (Whisper) return only the generated tokens, without the decoder start tokens.
    extra = {"returns_decoder_prompt": sequences is None or sequences.shape[1] >= start.shape[1] + 2}
    layout = {
        "kind": "encoder_decoder",
        "layers": half // 2,
        "tensor_layout": "self-attention (batch, heads, seq, head_dim) key/value per layer, then cross-attention (batch, heads, encoder_seq, head_dim)",
    }
    encoder_spec = {k: (_auto(0, 1) if v.dim() == 2 else _auto(0)) for k, v in encoder_call.items()}
    return {
        "encoder": GenerationPart("encoder", "encoder", encoder_step, encoder_call, encoder_spec, ["encoder_hidden_states"]),
        "decoder_prefill": GenerationPart(
            "decoder_prefill", "prefill", decoder_step, prefill_inputs, spec, ["logits", *_present_names(len(cache))], layout
        ),
        "decoder": GenerationPart(
            "decoder",
            "decode",
            decoder_step,
            decode_inputs,
            {**spec, "decoder_input_ids": {0: _BATCH}, "past_key_values": _cache_spec(cache[:half], past) + _cache_spec(cache[half:], _ENCODER_SEQ)},
            ["logits", *_present_names(len(cache))],
            layout,
            extra,
        ),
    }


# ── Export ────────────────────────────────────────────────────────────────────


class GenerationArtifacts(dict):
    """``{part name: native artifact}`` (``ExportedProgram``, ``ONNXProgram`` or ``ExecutorchProgramManager``)
    returned by :func:`export_for_generation`, with what is needed to write the artifact folder.

    Attributes:
        exporter: the exporter that produced the artifacts.
        parts: ``{part name: GenerationPart}``.
        model: the eager model (its config, generation config, and the reference for parity).
        dynamic_axes: ``{part name: {input name: [axes]}}`` symbolic in each exported program.
    """

    def __init__(self, exporter: Any, model: torch.nn.Module, parts: dict[str, GenerationPart], artifacts: dict[str, Any], dynamic_axes: dict[str, Any]):
        super().__init__(artifacts)
        self.exporter = exporter
        self.model = model
        self.parts = parts
        self.dynamic_axes = dynamic_axes
        self.export_seconds: dict[str, float] = {}

    def save_pretrained(
        self,
        directory: str | os.PathLike[str],
        preprocessor: Any = None,
        validate: bool = True,
        overwrite: bool = True,
        source_model: str | None = None,
        aoti: bool = False,
    ) -> dict[str, Any]:
        """Write every part's file (``<part>/<artifact name>``), ``config.json``, ``generation_config.json``,
        the tokenizer or processor files (when ``preprocessor`` is given) and ``export.json``.

        With ``validate``, each saved part is run in the backend's runtime on its example inputs and
        compared with the eager module (max abs difference, recorded as ``parity``; the tolerance is the
        exporter's ``default_atol`` plus :data:`PARITY_RTOL` times the largest eager output value).
        The folder is written beside the target and moved into place at the end.

        With ``aoti`` (dynamo only), each part is also compiled into an AOTInductor package
        (``<part>/model.aoti.pt2``, the part's ``aoti_package`` in the manifest) for the C++ runner, and
        checked like the part when ``validate``.

        Returns:
            the manifest written.

        Raises:
            InputError: ``directory`` exists, is not empty and ``overwrite`` is False; ``aoti`` for another backend.
            ParityError: a part's outputs differ from eager beyond the exporter's ``default_atol``.
            ExportStageError: the AOTInductor compile failed.
        """
        from .errors import ParityError
        from .pipeline import check_output_folder, library_versions, staged_folder
        from .runtime.compare import compare_leaves, raise_if_eager_nonfinite

        out = Path(directory)
        check_output_folder(out, overwrite)
        if aoti and self.exporter.name != "dynamo":
            raise InputError(f"aoti compiles the dynamo backend's programs; these parts were exported with {self.exporter.name!r}")
        manifest: dict[str, Any] = {}
        with staged_folder(out, manifest) as staging:
            parts_manifest: dict[str, Any] = {}
            for name, artifact in self.items():
                part = self.parts[name]
                folder = staging / name
                folder.mkdir()
                path = self.exporter.save(artifact, folder)
                files = sorted(str(p.relative_to(staging)) for p in folder.rglob("*") if p.is_file())
                entry: dict[str, Any] = {
                    "role": part.role,
                    "file": str(path.relative_to(staging)),
                    "files": files,
                    "inputs": _describe_inputs(part.inputs),
                    "outputs": part.output_names,
                    "dynamic_axes": self.dynamic_axes.get(name, {}),
                    "cache": part.cache,
                    **({"extra": part.extra} if part.extra else {}),
                    "export_seconds": round(self.export_seconds.get(name, 0.0), 3),
                }
                checked = [path]
                if aoti:
                    from .exporters.dynamo import AOTI_SUFFIX

                    package = self.exporter.compile_aoti(artifact, folder / ("model" + AOTI_SUFFIX))
                    entry["aoti_package"] = str(package.relative_to(staging))
                    entry["files"] = sorted(str(p.relative_to(staging)) for p in folder.rglob("*") if p.is_file())
                    checked.append(package)
                for path_checked in checked if validate else []:
                    runner = self.exporter.load_runner(path_checked)
                    with torch.no_grad():
                        expected = part.module(**_copy_inputs(part.inputs))
                    expected = list(expected) if isinstance(expected, tuple) else [expected]
                    actual = [torch.as_tensor(a) for a in runner(_copy_inputs(part.inputs))]
                    diffs = compare_leaves(list(zip(part.output_names, expected)), actual, self.exporter.default_atol)
                    worst = max((d.max_abs_diff for d in diffs), default=0.0)
                    # float32 rounding grows with the values' size (logits of tens): atol + rtol * max|eager|
                    scale = max((float(e.abs().max()) for e in expected if isinstance(e, torch.Tensor) and e.numel()), default=0.0)
                    limit = self.exporter.default_atol + PARITY_RTOL * scale
                    ok = all(not d.nonfinite and d.max_abs_diff <= limit for d in diffs) and len(actual) == len(expected)
                    entry["aoti_parity" if path_checked != path else "parity"] = {
                        "atol": self.exporter.default_atol, "rtol": PARITY_RTOL, "max_abs_eager": scale, "max_abs_diff": worst, "ok": ok
                    }
                    if not ok:
                        failing = [d.name for d in diffs if d.nonfinite or d.max_abs_diff > limit]
                        raise_if_eager_nonfinite(list(zip(part.output_names, expected)), failing)
                        raise ParityError(
                            f"part {name!r}{' (AOTInductor package)' if path_checked != path else ''}: outputs differ from eager beyond atol {self.exporter.default_atol} + "
                            f"rtol {PARITY_RTOL} x max|eager| {scale:.3g} (max abs diff {worst:.3g}; {len(actual)} outputs vs {len(expected)} expected)"
                        )
                parts_manifest[name] = entry
            self.model.config.save_pretrained(staging)
            self.model.generation_config.save_pretrained(staging)
            if preprocessor is not None:
                preprocessor.save_pretrained(staging)
            manifest.update(
                {
                    "schema_version": GENERATION_SCHEMA_VERSION,
                    "kind": "generation",
                    "backend": self.exporter.name,
                    "recipe": getattr(getattr(self.exporter, "config", None), "backend", None),
                    "model_class": type(self.model).__name__,
                    "is_encoder_decoder": bool(getattr(self.model.config, "is_encoder_decoder", False)),
                    "source_model": source_model,
                    "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "versions": library_versions(),
                    "parts": parts_manifest,
                }
            )
        return manifest


def _describe_inputs(inputs: dict[str, Any]) -> list[dict[str, Any]]:
    from .pipeline import describe_tensors
    from .shapes import tensor_leaves

    return describe_tensors(tensor_leaves(inputs))


def _copy_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: ([t.clone() for t in v] if isinstance(v, list) else v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _widen_batch(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``inputs`` with a batch of 1 repeated to a batch of 2 (every tensor whose leading size is the batch).

    The examples only drive the trace. From a batch-1 example, size-oblivious sizes keep the batch
    symbolic but torch.export then solves reshapes such as ``view(batch, seq, -1, head_dim)`` to head
    counts like ``4 // batch`` (seen with Mistral and Gemma3), which the ONNX SDPA lowering refuses and
    which would fix the batch of later graphs; a batch of 2 gives plain head counts.
    """
    ids = inputs.get("input_ids", inputs.get("input_features", inputs.get("inputs_embeds")))
    if not isinstance(ids, torch.Tensor) or ids.dim() == 0 or ids.shape[0] != 1:
        return dict(inputs)
    return {k: (v.repeat(2, *([1] * (v.dim() - 1))) if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == 1 else v) for k, v in inputs.items()}


def export_for_generation(exporter: Any, model: torch.nn.Module, inputs: Mapping[str, Any], config: Any = None, generation_config: Any = None) -> GenerationArtifacts:
    """Export each part of ``model``'s generation loop with ``exporter`` (dynamic batch, sequence and cache axes).

    Args:
        exporter: a ``DynamoExporter``, ``OnnxExporter`` or ``ExecutorchExporter``.
        model: a transformers generative model.
        inputs: ``generate()`` keyword arguments (``input_ids (B, T)``, ``attention_mask (B, T)``, ...).
        config: the exporter's config (``dynamic_shapes`` is set per part; other fields are kept).
        generation_config: optional ``GenerationConfig``; ``cache_implementation="static"`` with
            ``max_cache_len`` exports the static-cache decode graph.

    A batch of 1 in ``inputs`` is repeated to a batch of 2 for the trace (see :func:`_widen_batch`);
    the graphs take any batch size.

    Returns:
        a :class:`GenerationArtifacts`: ``{part name: native artifact}`` with ``save_pretrained(dir)``.

    Raises:
        InputError: ``generate()`` cannot run on ``inputs`` or the model kind is not supported.
        ExportStageError: exporting a part failed (the message names the stage).
    """
    from .pipeline import dynamic_axes

    parts = build_parts(model, _widen_batch(inputs), generation_config)
    base = config if config is not None else exporter.config_class()
    artifacts: dict[str, Any] = {}
    axes: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for name, part in parts.items():
        part.dynamic_shapes = _relaxed(part.dynamic_shapes, part.inputs)
        part_config = dataclasses.replace(base, dynamic=True, dynamic_shapes=part.dynamic_shapes)
        if hasattr(part_config, "output_path"):
            part_config.output_path = None
        started = time.perf_counter()
        artifacts[name] = exporter.export(part.module, _copy_inputs(part.inputs), part_config)
        seconds[name] = time.perf_counter() - started
        if exporter.exported_program is not None:
            axes[name] = dynamic_axes(exporter.exported_program, part.inputs)
    result = GenerationArtifacts(exporter, model, parts, artifacts, axes)
    result.export_seconds = seconds
    return result


def export_generation_folder(
    model_path: str | os.PathLike[str],
    backend: str,
    output: str | os.PathLike[str],
    *,
    recipe: str | None = None,
    validate: bool = True,
    overwrite: bool = False,
    prompt: str = "Exported models should give the same tokens",
    aoti: bool = False,
    allow_random_weights: bool = False,
    max_seq_len: int | None = None,
) -> dict[str, Any]:
    """Load the checkpoint folder ``model_path``, export its generation parts with ``backend`` and write ``output``.

    The example inputs are the tokenizer's encoding of ``prompt`` (or 8 token ids when the folder has
    no tokenizer). Used by ``hf-exporters export --task text-generation`` / ``text2text-generation``.

    Returns:
        the manifest written.

    Raises:
        InputError: the folder cannot be loaded, transformers initialised some of its weights at random
            (unless ``allow_random_weights``; a base-model checkpoint has no ``lm_head``), or ``output``
            exists and is not empty (without ``overwrite``).
        ExportStageError, ParityError: as :func:`export_for_generation` and :meth:`GenerationArtifacts.save_pretrained`.
    """
    import transformers

    from .pipeline import _load_preprocessor, check_output_folder, load_pretrained, make_config, make_exporter, read_config

    out = Path(output)
    path = Path(model_path)
    check_output_folder(out, overwrite, source=path)
    config = read_config(path)
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    auto = transformers.AutoModelForSeq2SeqLM if seq2seq else transformers.AutoModelForCausalLM
    task = "text2text-generation" if seq2seq else "text-generation"
    model = load_pretrained(auto, path, f"task {task!r}", allow_random_weights)
    preprocessor = _load_preprocessor(path)
    if preprocessor is not None:
        inputs = dict(preprocessor([prompt], return_tensors="pt"))
    else:
        vocab = config.get_text_config().vocab_size
        ids = torch.arange(1, 9).remainder(vocab).unsqueeze(0)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    exporter = make_exporter(backend)
    artifacts = export_for_generation(exporter, model, inputs, make_config(exporter, True, recipe, max_seq_len))
    return artifacts.save_pretrained(
        out, preprocessor=preprocessor, validate=validate, overwrite=overwrite, source_model=str(path.resolve()), aoti=aoti
    )


# ── Generator ─────────────────────────────────────────────────────────────────


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a generation folder's ``export.json``.

    Raises:
        ManifestError: the folder or manifest is missing or unreadable, the schema version is unknown,
            it is not a generation folder, a part's file is missing, or a path leaves the folder.
    """
    root = Path(directory)
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise ManifestError(f"{root} is not an exported generation folder: {MANIFEST_NAME} is missing")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ManifestError(f"{path} cannot be read: {error}") from error
    if not isinstance(manifest, dict):
        raise ManifestError(f"{path} is not a JSON object")
    version = manifest.get("schema_version")
    if version != GENERATION_SCHEMA_VERSION:
        raise ManifestError(f"{path}: unknown schema_version {version!r} (this version of hf-exporters reads {GENERATION_SCHEMA_VERSION})")
    parts = manifest.get("parts")
    if manifest.get("kind") != "generation" or not isinstance(parts, dict) or not parts:
        raise ManifestError(f"{path} does not describe a generation export (no 'parts'); export with --task text-generation")
    resolved_root = root.resolve()
    for name, part in parts.items():
        if not isinstance(part, dict):
            raise ManifestError(f"{path}: part {name!r} is not a JSON object")
        if part.get("role") not in PART_ROLES:
            raise ManifestError(f"{path}: part {name!r} has an unknown role {part.get('role')!r} (known: {', '.join(PART_ROLES)})")
    roles = [part["role"] for part in parts.values()]
    if len(set(roles)) != len(roles):
        raise ManifestError(f"{path}: two parts share a role ({', '.join(sorted(r for r in set(roles) if roles.count(r) > 1))})")
    for role in ("prefill", "decode"):
        if role not in roles:
            raise ManifestError(f"{path}: no part has the role {role!r}; a generation folder needs a prefill and a decode part")
    for name, part in parts.items():
        for rel in [part.get("file"), *part.get("files", [])]:
            if not isinstance(rel, str) or not rel:
                raise ManifestError(f"{path}: part {name!r} has no file")
            target = (root / rel).resolve()
            if Path(rel).is_absolute() or not target.is_relative_to(resolved_root):
                raise ManifestError(f"{path}: part {name!r} names a path outside the folder: {rel!r}")
            if not target.is_file():
                raise ManifestError(f"{path}: part {name!r}: file {rel!r} is missing")
    return manifest


#: the roles a generation folder's parts play (``export.json`` ``parts.<name>.role``)
PART_ROLES = ("encoder", "prefill", "decode")


class _ProcessorShim:
    """The two things ``GenerationMixin._get_logits_processor`` / ``_prepare_special_tokens`` read from a model."""

    def __init__(self, config: Any):
        from transformers.generation.utils import GenerationMixin

        self.config = config
        self.device = torch.device("cpu")
        self._merge_criteria_processor_list = GenerationMixin._merge_criteria_processor_list.__get__(self)


class ExportedGenerator:
    """Greedy or sampled generation with the exported parts of a folder, in the backend's runtime.

    The cache tensors a part returns are fed to the next decode step; logits go through transformers'
    logits processors built from ``generation_config.json`` (temperature, top-k/p, repetition
    penalty, suppressed tokens, ...); generation stops at ``max_new_tokens`` or when every row has
    produced a stop token (finished rows are padded with ``pad_token_id``), as ``generate()`` does.

    Example::

        gen = ExportedGenerator.from_pretrained("out/")
        ids = gen.generate(input_ids, attention_mask=mask, max_new_tokens=8)   # (B, T + new)
    """

    def __init__(self, directory: Path, manifest: dict[str, Any], runners: dict[str, Any], config: Any, generation_config: Any, preprocessor: Any = None):
        self.directory = directory
        self.manifest = manifest
        self.runners = runners
        self.config = config
        self.generation_config = generation_config
        self.preprocessor = preprocessor
        self.roles = {part["role"]: name for name, part in manifest["parts"].items()}
        self.is_encoder_decoder = bool(manifest.get("is_encoder_decoder"))
        decode = manifest["parts"][self.roles["decode"]]
        self.cache = decode.get("cache") or {}
        self.decode_inputs = [i["name"] for i in decode["inputs"]]
        self.returns_decoder_prompt = bool(decode.get("extra", {}).get("returns_decoder_prompt", True))

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str], load_preprocessor: bool = True, runtime: str = "python") -> "ExportedGenerator":
        """Load a folder written by :meth:`GenerationArtifacts.save_pretrained`.

        Args:
            runtime: ``"python"`` (the backend's Python runtime) or ``"cpp"`` (ExecuTorch folders only:
                the C++ runner's ExecuTorch runtime through its bindings, see ``cpp/``).

        Raises:
            ManifestError: see :func:`read_manifest`; also a missing ``config.json`` or an unknown backend.
            MissingDependencyError: the backend's runtime is not installed.
            InputError: an unknown ``runtime``, or ``"cpp"`` for a folder of another backend.
            CppRunnerError: ``runtime="cpp"`` and the C++ runner is not built or refuses a part's file.
        """
        import transformers

        from .pipeline import _load_preprocessor, make_exporter
        from .pytree import register_model_pytrees

        root = Path(directory)
        manifest = read_manifest(root)
        try:
            exporter = make_exporter(manifest.get("backend", ""))
        except InputError as error:
            raise ManifestError(f"{root / MANIFEST_NAME}: {error}") from error
        from .exporters._common import first_line

        if runtime not in ("python", "cpp"):
            raise InputError(f"unknown runtime {runtime!r}: choose 'python' or 'cpp'")
        if runtime == "cpp" and manifest.get("backend") != "executorch":
            raise InputError(f"runtime 'cpp' runs ExecuTorch folders; {root} was exported with {manifest.get('backend')!r}")
        if not (root / "config.json").is_file():
            raise ManifestError(f"{root}: config.json is missing")
        try:
            config = transformers.AutoConfig.from_pretrained(root)
        except Exception as error:  # noqa: BLE001 - a corrupt or foreign file
            raise ManifestError(f"{root / 'config.json'} cannot be read: {first_line(error)}") from error
        try:
            if (root / "generation_config.json").is_file():
                generation_config = transformers.GenerationConfig.from_pretrained(root)
            else:
                generation_config = transformers.GenerationConfig.from_model_config(config)
        except Exception as error:  # noqa: BLE001
            raise ManifestError(f"{root / 'generation_config.json'} cannot be read: {first_line(error)}") from error
        register_model_pytrees(None)
        runners = {}
        for name, part in manifest["parts"].items():
            try:
                if runtime == "python":
                    runners[name] = exporter.load_runner(root / part["file"])
                else:
                    from .runtime.cpp_runner import CppExecutorchRunner

                    runners[name] = CppExecutorchRunner(root / part["file"])
            except HfExportersError:
                raise
            except Exception as error:  # noqa: BLE001 - the runtime refused the file
                raise ManifestError(
                    f"{root / part['file']}: part {name!r} cannot be loaded by the {manifest.get('backend')} runtime "
                    f"(corrupt or truncated file?): {first_line(error)}"
                ) from error
        preprocessor = _load_preprocessor(root) if load_preprocessor else None
        return cls(root, manifest, runners, config, generation_config, preprocessor)

    # ── the loop ──

    def _max_size(self, role: str, input_name: str, axis: int) -> int | None:
        """The largest size the part's runtime accepts on ``input_name[axis]``, when it tells (ExecuTorch
        plans memory for the largest size of each input)."""
        name = self.roles.get(role)
        limits = getattr(self.runners.get(name), "input_max_sizes", None) if name else None
        if not limits:
            return None
        names = [i["name"] for i in self.manifest["parts"][name]["inputs"]]
        if input_name not in names or names.index(input_name) >= len(limits):
            return None
        sizes = limits[names.index(input_name)]
        return int(sizes[axis]) if sizes is not None and len(sizes) > axis else None

    def _check_lengths(self, prompt: int, new_tokens: int) -> None:
        """Refuse a prompt (or prompt plus new tokens) longer than the folder's programs take.

        Raises:
            InputError: "prompt of N tokens: this folder was exported for at most M ...".
        """
        hint = "re-export with a larger --max-seq-len" if self.manifest.get("backend") == "executorch" else "re-export"
        longest_prompt = self._max_size("prefill", "input_ids", 1)
        if longest_prompt is not None and prompt > longest_prompt:
            raise InputError(f"prompt of {prompt} tokens: this folder was exported for at most {longest_prompt} ({hint})")
        longest = self._max_size("decode", "attention_mask", 1)
        if longest is not None and prompt + new_tokens - 1 > longest:
            raise InputError(
                f"prompt of {prompt} tokens plus {new_tokens} new tokens needs {prompt + new_tokens - 1} positions: "
                f"this folder was exported for at most {longest} ({hint}, or ask for at most {max(longest - prompt + 1, 0)} new tokens)"
            )

    def _run(self, role: str, inputs: dict[str, Any]) -> list[torch.Tensor]:
        """Run the part playing ``role``.

        Raises:
            ArtifactRunError: the runtime failed on the part (a truncated weights file, a kernel error).
        """
        name = self.roles[role]
        try:
            outputs = self.runners[name](inputs)
        except HfExportersError:
            raise
        except Exception as error:  # noqa: BLE001 - the runtime's own failure, named by part and file
            from .exporters._common import first_line

            raise ArtifactRunError(
                f"part {name!r} ({self.directory / self.manifest['parts'][name]['file']}) failed in the "
                f"{self.manifest.get('backend')} runtime: {first_line(error)}"
            ) from error
        return [torch.as_tensor(o) for o in outputs]

    def _prepare_config(self, max_new_tokens: int | None, generation_config: Any, overrides: dict[str, Any]) -> Any:
        config = copy.deepcopy(generation_config if generation_config is not None else self.generation_config)
        if max_new_tokens is not None:
            config.max_new_tokens = max_new_tokens
        for key, value in overrides.items():
            setattr(config, key, value)
        if getattr(config, "num_beams", 1) not in (None, 1):
            raise InputError("beam search is not supported by ExportedGenerator (num_beams must be 1)")
        if config.max_new_tokens is None:
            config.max_new_tokens = 20
        return config

    def generate(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int | None = None,
        generation_config: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Generate up to ``max_new_tokens`` tokens.

        Args:
            input_ids: ``(B, T)`` prompt ids (decoder-only: left-padded; encoder-decoder: encoder input).
            attention_mask: ``(B, T)``; all ones when None.
            max_new_tokens: overrides the generation config's.
            generation_config: a ``GenerationConfig`` replacing the folder's.
            **kwargs: ``do_sample``, ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty`` overrides,
                and other encoder inputs (``input_features (B, F, N)`` for speech models, ``pixel_values
                (B, C, H, W)`` for a vision-language model, whose ``input_ids`` then hold its image tokens).

        Returns:
            ``(B, T + n)`` ids for decoder-only models (prompt then new tokens), ``(B, 1 + n)`` decoder ids
            (start token then new tokens) for encoder-decoder models, as ``generate()`` returns (``(B, n)``
            for models whose ``generate()`` drops the start token, such as Whisper).

        Raises:
            InputError: no input given, an encoder input missing or an unknown one given, beam search
                asked for, or a static cache too short for the request.
        """
        from transformers.generation.utils import GenerationMixin

        overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in _SAMPLING_KEYS}
        config = self._prepare_config(max_new_tokens, generation_config, overrides)
        shim = _ProcessorShim(self.config)
        if self.is_encoder_decoder:
            encoder_inputs = {k: v for k, v in {"input_ids": input_ids, "attention_mask": attention_mask, **kwargs}.items() if v is not None}
            if not encoder_inputs:
                raise InputError("generate() needs the encoder inputs (input_ids or input_features)")
            batch = next(iter(encoder_inputs.values())).shape[0]
        else:
            if input_ids is None:
                raise InputError("generate() needs input_ids (B, T)")
            batch = input_ids.shape[0]
            if "encoder" in self.roles:  # multimodal: the encoder's features go to the prefill step
                prefill_extra = {"features": self._encode(kwargs)}
            elif kwargs:
                raise InputError(f"unexpected inputs {sorted(kwargs)}: this folder's model takes input_ids and attention_mask")
        GenerationMixin._prepare_special_tokens(shim, config, attention_mask is not None, device="cpu", batch_size=batch)
        eos = config._eos_token_tensor
        pad = config._pad_token_tensor

        with torch.no_grad():
            if self.is_encoder_decoder:
                hidden = self._encode(encoder_inputs)
                sequences = torch.full((batch, 1), int(config._decoder_start_token_tensor), dtype=torch.long)
                step_inputs: dict[str, Any] = {"decoder_input_ids": sequences, "encoder_hidden_states": hidden}
                if "attention_mask" in self.decode_inputs and attention_mask is not None:
                    step_inputs["attention_mask"] = attention_mask
                encoder_ids = encoder_inputs.get("input_ids")
            else:
                sequences = input_ids.long()
                mask = attention_mask.long() if attention_mask is not None else torch.ones_like(sequences)
                encoder_ids = None
            # as generate() does: the length limit that length-aware processors read (forced EOS at the end)
            config.max_length = sequences.shape[1] + config.max_new_tokens
            processors = GenerationMixin._get_logits_processor(
                shim,
                config,
                input_ids_seq_length=sequences.shape[1],
                encoder_input_ids=encoder_ids,
                device="cpu",
                model_kwargs={},
            )
            unfinished = torch.ones(batch, dtype=torch.long)
            cache: list[torch.Tensor] = []
            static = self.cache.get("kind") == "static"
            if not self.is_encoder_decoder and not static:
                self._check_lengths(sequences.shape[1], config.max_new_tokens)
            if static:
                max_len = int(self.cache["max_cache_len"])
                if sequences.shape[1] + config.max_new_tokens - 1 > max_len:
                    raise InputError(
                        f"the static cache holds {max_len} positions; a {sequences.shape[1]}-token prompt with "
                        f"max_new_tokens={config.max_new_tokens} needs {sequences.shape[1] + config.max_new_tokens - 1}"
                    )
            for step in range(config.max_new_tokens):
                if self.is_encoder_decoder:
                    outputs = self._run("prefill" if step == 0 else "decode", {**step_inputs, **({"past_key_values": cache} if step else {})})
                elif static:
                    outputs, static_state = self._static_step(sequences, mask, step, cache)
                else:
                    current = sequences if step == 0 else sequences[:, -1:]
                    feed = {"input_ids": current, "attention_mask": mask}
                    if step:
                        feed["past_key_values"] = cache
                    elif "encoder" in self.roles:
                        feed.update(prefill_extra)
                    outputs = self._run("prefill" if step == 0 else "decode", feed)
                logits, cache = outputs[0].float(), outputs[1:]
                scores = processors(sequences, logits)
                if config.do_sample:
                    next_tokens = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
                else:
                    next_tokens = scores.argmax(dim=-1)
                if eos is not None:
                    next_tokens = next_tokens * unfinished + pad * (1 - unfinished)
                sequences = torch.cat([sequences, next_tokens[:, None]], dim=1)
                if eos is not None:
                    unfinished = unfinished & ~torch.isin(next_tokens, eos)
                    if int(unfinished.max()) == 0:
                        break
                if self.is_encoder_decoder:
                    step_inputs["decoder_input_ids"] = sequences[:, -1:]
                elif not static:
                    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                else:
                    mask = static_state
        if self.is_encoder_decoder and not self.returns_decoder_prompt:
            sequences = sequences[:, 1:]
        return sequences

    def _encode(self, encoder_inputs: dict[str, Any]) -> torch.Tensor:
        part = self.manifest["parts"][self.roles["encoder"]]
        names = [i["name"] for i in part["inputs"]]
        missing = [n for n in names if n not in encoder_inputs]
        if missing:
            raise InputError(f"the encoder takes {names}; missing {missing}")
        unknown = sorted(set(encoder_inputs) - set(names) - {"input_ids", "attention_mask"})
        if unknown:
            raise InputError(f"unexpected inputs {unknown}: the encoder takes {names}")
        extra = part.get("extra", {})
        if not extra.get("per_item"):
            return self._run("encoder", {n: encoder_inputs[n] for n in names})[0]
        # a per-item encoder (a vision tower): one call per image, features concatenated in batch order
        items = encoder_inputs[extra["input"]].shape[0]
        rows = []
        for i in range(items):
            feed = {n: (encoder_inputs[n][i : i + 1] if encoder_inputs[n].dim() and encoder_inputs[n].shape[0] == items else encoder_inputs[n]) for n in names}
            rows.append(self._run("encoder", feed)[0])
        return torch.cat(rows)

    def _static_step(self, sequences: torch.Tensor, mask: torch.Tensor, step: int, cache: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """One static-cache step; ``mask`` is the ``(B, T)`` prompt mask at step 0, the ``(B, M)`` running mask after."""
        max_len = int(self.cache["max_cache_len"])
        if step == 0:
            length = sequences.shape[1]
            full = torch.zeros(sequences.shape[0], max_len, dtype=torch.long)
            full[:, :length] = mask
            shapes = [i for i in self.manifest["parts"][self.roles["decode"]]["inputs"] if i["name"].startswith("past_key_values")]
            cache = [torch.zeros([sequences.shape[0], *s["shape"][1:]], dtype=getattr(torch, s["dtype"])) for s in shapes]
            feed = {"input_ids": sequences, "attention_mask": full, "cache_position": torch.arange(length), "past_key_values": cache}
            position = length
        else:
            position = sequences.shape[1] - 1
            full = mask.clone()
            full[:, position] = 1
            feed = {"input_ids": sequences[:, -1:], "attention_mask": full, "cache_position": torch.tensor([position]), "past_key_values": cache}
            position += 1
        outputs = self._run("prefill" if step == 0 else "decode", feed)
        return outputs, full

    def generate_text(self, prompt: str, max_new_tokens: int = 20, **kwargs: Any) -> tuple[str, torch.Tensor, torch.Tensor]:
        """Tokenize ``prompt`` with the folder's tokenizer, generate, and decode the new tokens.

        Returns:
            ``(text, input_ids (1, T), output ids)``.

        Raises:
            InputError: the folder has no tokenizer.
        """
        tokenizer = getattr(self.preprocessor, "tokenizer", self.preprocessor)
        if tokenizer is None:
            raise InputError(f"{self.directory} has no tokenizer files; pass token ids to generate() instead")
        encoded = tokenizer([prompt], return_tensors="pt")
        ids = self.generate(encoded["input_ids"], attention_mask=encoded.get("attention_mask"), max_new_tokens=max_new_tokens, **kwargs)
        new = ids if self.is_encoder_decoder else ids[:, encoded["input_ids"].shape[1] :]
        return tokenizer.decode(new[0], skip_special_tokens=True), encoded["input_ids"], ids
