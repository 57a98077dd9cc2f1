"""Generation from exported graphs: decompose a model into the parts a generation loop calls, export
each part with one backend, write an artifact folder, and run ``generate()`` from that folder alone.

The flow::

    captured = decompose_for_generation(model, inputs)                   # hooks on a real generate() (2 new tokens)
    parts = export_for_generation(exporter, model, inputs, cfg)          # {part name: native artifact}
    parts.save_pretrained("out/")                                        # part files, configs, export.json
    ExportedGenerator.from_pretrained("out/").generate(input_ids, max_new_tokens=8)

The modules, in the order of the flow (each imports only the ones above it):

- ``capture``: :func:`decompose_for_generation`, the calls of a real ``generate()``.
- ``cache_layout``: transformers caches as flat tensor lists and back (key/value and hybrid layouts).
- ``steps``: the step modules exported as graphs (:class:`DecoderStep`, :class:`StaticDecoderStep`, ...).
- ``parts``: :func:`build_parts`, one :class:`GenerationPart` per graph with example inputs and dynamic shapes.
- ``manifest``: :func:`read_manifest`, the folder's ``export.json`` read and checked.
- ``generator``: :class:`ExportedGenerator`, the generation loop over a folder's parts.
- ``accuracy``: :func:`check_generation_accuracy`, a quantized folder's next-token agreement and KL
  divergence against float32 eager over the shipped prompts (teacher-forced through the generator).
- ``onnx_weights``: ``share_weights``, an ONNX folder's part graphs at its root with one copy of the
  weights they share (``<part>.onnx`` and ``model.onnx.data``).
- ``folder``: :func:`export_for_generation`, :class:`GenerationArtifacts` (writes the folder, checks it),
  :func:`export_generation_folder`.

Parts and their graphs (``B`` batch, ``T`` prompt length, ``P`` cached positions, ``V`` vocabulary,
``L`` decoder layers, ``H`` key/value heads, ``D`` head dim, ``S`` encoder length, ``E`` hidden size):

* decoder-only models

  - ``prefill``: ``input_ids (B, T)``, ``attention_mask (B, T)`` ->
    ``logits (B, V)`` (last position), ``present_0 .. present_{2L-1}`` (``(B, H, T, D)``, key then value per layer).
  - ``decode``: ``input_ids (B, 1)``, ``attention_mask (B, P + 1)``, ``past_key_values_0 .. _{2L-1}``
    (``(B, H, P, D)``) -> ``logits (B, V)``, ``present_*`` (``(B, H, P + 1, D)``).
  - An ONNX folder with onnxruntime-genai's layout (``export.json`` ``onnxruntime_genai.layout``) names the
    same tensors ``past_key_values.<l>.key|value`` and ``present.<l>.key|value`` and returns ``logits (B, 1, V)``
    (:mod:`hf_exporters.generation.genai`).

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

from .capture import decompose_for_generation
from .folder import PARITY_RTOL, GenerationArtifacts, export_for_generation, export_generation_folder
from .generator import ExportedGenerator
from .manifest import GENERATION_SCHEMA_VERSION, PART_ROLES, read_manifest
from .parts import GenerationPart, build_parts
from .steps import (
    DecoderStep,
    EncoderStep,
    ModalityEncoderStep,
    MultimodalPrefillStep,
    Seq2SeqDecoderStep,
    StaticDecoderStep,
)

__all__ = [
    "GENERATION_SCHEMA_VERSION",
    "PARITY_RTOL",
    "PART_ROLES",
    "DecoderStep",
    "EncoderStep",
    "ExportedGenerator",
    "GenerationArtifacts",
    "GenerationPart",
    "ModalityEncoderStep",
    "MultimodalPrefillStep",
    "Seq2SeqDecoderStep",
    "StaticDecoderStep",
    "build_parts",
    "decompose_for_generation",
    "export_for_generation",
    "export_generation_folder",
    "read_manifest",
]
