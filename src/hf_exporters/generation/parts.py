"""Parts: the graphs of a model's generation loop before export, with example inputs and dynamic shapes.

:func:`build_parts` captures a real ``generate()`` (:mod:`hf_exporters.generation.capture`), picks the
model kind (decoder-only, multimodal decoder-only, static cache, encoder-decoder) and returns one
:class:`GenerationPart` per graph: its step module (:mod:`hf_exporters.generation.steps`), example
inputs, ``dynamic_shapes``, output names and the cache layout written to the manifest.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import InputError
from ..runtime.compare import evaluation_mode
from .cache_layout import flat_cache, hybrid_kinds, is_hybrid_cache
from .capture import decompose_for_generation, encoder_of
from .steps import DecoderStep, EncoderStep, ModalityEncoderStep, MultimodalPrefillStep, ProgramCacheStep, Seq2SeqDecoderStep, StaticDecoderStep


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
        reference: builds the module the artifact's parity is checked against, where it is not ``module`` (a
            step whose exported attention is ExecuTorch's operator is checked against the model's own
            attention); built when the check runs, after the backend's preparation (a bfloat16 model cast
            to float32 for XNNPACK).
    """

    name: str
    role: str
    module: torch.nn.Module
    inputs: dict[str, Any]
    dynamic_shapes: dict[str, Any]
    output_names: list[str]
    cache: dict[str, Any] | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    reference: Callable[[], torch.nn.Module] | None = None


def _auto(*axes: int) -> dict[int, Any]:
    return dict.fromkeys(axes, torch.export.Dim.AUTO)


# Dim.AUTO on batch, sequence and cache axes. Shared named dimensions (Dim("batch"), Dim("past"))
# would let a lowering that re-traces the program prove the caches, mask and queries agree, but they
# fail the trace on guards such as ``batch != 1`` from the masking utilities; kept as AUTO for now.
_BATCH = _SEQ = _PAST = _ENCODER_SEQ = torch.export.Dim.AUTO
#: upper bound of a named cache-length dimension (positions)
_MAX_PAST = 4096


def relaxed_shapes(spec: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
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
        model: a transformers generative model (run in eval mode; its training flags are given back).
        inputs: ``generate()`` keyword arguments (``input_ids (B, T)``, ``attention_mask (B, T)``, ...).
        generation_config: optional; ``cache_implementation="static"`` (with ``max_cache_len``) selects
            the static-cache decode graph.

    Returns:
        ``{part name: GenerationPart}`` in the order the loop calls them.

    Raises:
        InputError: ``generate()`` cannot run on ``inputs``, or the model kind is not supported
            (a sliding-window recurrent layer, a video or audio encoder of a decoder-only model).
    """
    with evaluation_mode(model):  # generate() runs as the parts are traced; the caller's training flags come back
        return _build_parts(model, inputs, generation_config)


def _build_parts(model: torch.nn.Module, inputs: Mapping[str, Any], generation_config: Any) -> dict[str, GenerationPart]:
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


def _hybrid_layout(step: DecoderStep, layout: dict[str, Any]) -> tuple[dict[str, Any], list[str] | None]:
    """The manifest's cache entry and each flat tensor's role for ``step``: ``layout`` unchanged and None
    for a key/value cache, the hybrid layout (:func:`hybrid_kinds`) for a recurrent one."""
    if not step.hybrid:
        return layout, None
    kinds = hybrid_kinds(step.schema or [])
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
    step.hybrid = is_hybrid_cache(model, prefill_call.get(cache_name))
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
    prefill_step.hybrid = is_hybrid_cache(model, prefill_call.get("past_key_values"))
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
    zeros = [torch.zeros_like(t) for t in flat_cache(cache_template)]
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
    encoder_step = EncoderStep(encoder_of(model))
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



#: the cache layouts of a decoder-only generation folder: ``io`` (the cache tensors are inputs and
#: outputs of every step) and ``program`` (ExecuTorch: the cache is held in the program, see
#: :func:`program_cache_parts`)
KV_CACHE_LAYOUTS = ("io", "program")


def program_cache_parts(model: torch.nn.Module, inputs: Mapping[str, Any], max_cache_len: int, custom_ops: bool = False) -> dict[str, GenerationPart]:
    """The one part of a decoder-only model whose key/value cache lives in the program, as ExecuTorch's
    LLM runner drives it: ``(input_ids (1, q), cache_position (q,)) -> logits (1, q, V)``
    (:class:`~hf_exporters.generation.steps.ProgramCacheStep`).

    The same method runs the prompt (``q = T``, ``cache_position = 0..T-1``) and each new token (``q = 1``,
    the next position), with no cache tensor passed in or out. Positions are absolute: a new prompt starts
    again at 0. With ``custom_ops`` the cache is written and attended with ExecuTorch's LLM operators
    (``llama::update_cache``, ``llama::custom_sdpa``: :mod:`hf_exporters.generation.executorch_ops`), in
    ``(1, max_cache_len, kv_heads, head_dim)`` buffers, and each step attends over the filled positions only.

    Raises:
        InputError: the model is an encoder-decoder or multimodal model, its cache has recurrent layers or
            sliding-window layers whose window is shorter than ``max_cache_len``, or ``max_cache_len`` is below 2.
    """
    if getattr(model.config, "is_encoder_decoder", False):
        raise InputError("--kv-cache program exports decoder-only models; this one is an encoder-decoder model")
    ids = inputs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or set(inputs) - {"input_ids", "attention_mask"}:
        raise InputError(f"--kv-cache program exports models driven by input_ids alone; the inputs are {sorted(inputs)}")
    if max_cache_len < 2:
        raise InputError(f"--kv-cache program needs a --max-seq-len of at least 2, got {max_cache_len}")
    ids = ids[:1, : max_cache_len - 1]  # the example prompt, cut to leave the cache room for a new token
    step = ProgramCacheStep(model, max_cache_len, custom_ops=custom_ops)
    layout = {
        "kind": "program",
        "layers": step.layers,
        "max_cache_len": max_cache_len,
        "batch_size": 1,
        "tensor_layout": (
            "held in the program: (1, max_cache_len, kv_heads, head_dim) key and value buffers per layer, written at "
            "cache_position[0] by llama::update_cache and attended by llama::custom_sdpa"
            if custom_ops
            else "held in the program: (1, kv_heads, max_cache_len, head_dim) key and value buffers per layer, written at cache_position"
        ),
        "custom_ops": bool(custom_ops),
    }
    example = {"input_ids": ids.clone(), "cache_position": torch.arange(ids.shape[1])}
    # with the custom operators, parity is against the model's own attention over a cache of the same length
    reference = (lambda: ProgramCacheStep(model, max_cache_len)) if custom_ops else None
    shapes = {"input_ids": {1: _SEQ}, "cache_position": {0: _SEQ}}
    return {"decode": GenerationPart("decode", "decode", step, example, shapes, ["logits"], layout, reference=reference)}
