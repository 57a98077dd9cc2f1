"""An ONNX text-generation folder laid out for onnxruntime-genai as well as for :class:`ExportedGenerator`.

onnxruntime-genai (the ``onnxruntime-genai`` package: ``og.Model(folder)``, ``og.Generator``) runs a
decoder-only model from a folder holding ``genai_config.json`` and the ONNX graphs it names. Its
``decoder-pipeline`` model type runs one graph on the prompt and another on each new token, which is
what a generation folder's ``prefill`` and ``decode`` parts are; it finds the cache by the names
``past_key_values.<layer>.key|value`` (inputs) and ``present.<layer>.key|value`` (outputs) and reads
``logits`` as ``(batch, sequence, vocabulary)``.

:func:`apply_genai_layout` renames each part's graph inputs and outputs to those names and makes the
logits ``(B, 1, V)`` (an ``Unsqueeze`` after the graph's ``(B, V)`` last-position logits);
:func:`genai_config` writes the configuration. Applied to decoder-only folders whose cache is a plain
list of keys and values per layer (``cache.kind == "dynamic"``); not to hybrid or state-space caches,
static caches, encoder-decoder or multimodal folders, which onnxruntime-genai's decoder pipeline does
not describe (:func:`genai_layout_refusal` says why).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

#: the file onnxruntime-genai reads
GENAI_CONFIG = "genai_config.json"


def genai_layout_refusal(backend: str, roles: set[str], cache: dict[str, Any], is_encoder_decoder: bool) -> str | None:
    """Why a generation folder gets no onnxruntime-genai layout, or None when it does."""
    if backend != "onnx":
        return "not an ONNX folder"
    if is_encoder_decoder:
        return "an encoder-decoder model (onnxruntime-genai's decoder pipeline runs decoder-only models)"
    if roles != {"prefill", "decode"}:
        return f"parts {sorted(roles)} (the decoder pipeline takes a prefill and a decode graph)"
    if cache.get("kind") != "dynamic" or cache.get("tensors"):
        return f"a {cache.get('kind')} cache with recurrent states or a fixed size (the pipeline names keys and values only)"
    return None


def genai_graph_refusal(paths: list[Path], layers: int) -> str | None:
    """Why the graphs at ``paths`` cannot take the genai layout (:func:`apply_genai_layout` would refuse
    them), or None; reads the graphs' inputs and outputs only.

    A graph qualifies when it has ``input_ids``, ``attention_mask`` and, for a decode graph, ``2 x layers``
    cache inputs, returns logits then ``2 x layers`` cache tensors, no output is a graph input, an
    initializer or another output, and every key and value has the same (heads, head size).
    """
    import onnx

    for path in paths:
        graph = onnx.load(str(path), load_external_data=False).graph
        where = f"{path.parent.name}/{path.name}"
        if len(graph.output) != 1 + 2 * layers or len(graph.input) not in (2, 2 + 2 * layers):
            return (
                f"{where} has {len(graph.input)} inputs and {len(graph.output)} outputs, not a "
                f"prefill or decode graph over {layers} layers of keys and values"
            )
        outputs = [o.name for o in graph.output]
        taken = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        if len(set(outputs)) != len(outputs) or taken & set(outputs):
            return f"{where} returns one of its inputs, initializers or outputs twice (onnxruntime-genai binds each output once)"
        if _cache_dims(graph) is None:
            return f"{where}: its keys and values differ in heads or head size from layer to layer (onnxruntime-genai sizes them all alike)"
    return None


def _cache_dims(graph: Any) -> tuple[int, int] | None:
    """(heads, head size) shared by every cache output of ``graph`` (an ``onnx.GraphProto``), or None."""
    dims = set()
    for output in list(graph.output)[1:]:
        shape = output.type.tensor_type.shape.dim
        if len(shape) != 4 or not shape[1].HasField("dim_value") or not shape[3].HasField("dim_value"):
            return None
        dims.add((shape[1].dim_value, shape[3].dim_value))
    return dims.pop() if len(dims) == 1 else None


def _vocabulary(graph: Any) -> int | None:
    shape = graph.output[0].type.tensor_type.shape.dim
    return shape[-1].dim_value if shape and shape[-1].HasField("dim_value") else None


def graph_dims(path: Path) -> dict[str, int | None]:
    """The cache's heads and head size and the logits' vocabulary, read off the graph at ``path``."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    heads, head_size = _cache_dims(graph) or (None, None)
    return {"num_key_value_heads": heads, "head_size": head_size, "vocab_size": _vocabulary(graph)}


def _names(layers: int, prefix: str) -> list[str]:
    return [f"{prefix}.{layer}.{kind}" for layer in range(layers) for kind in ("key", "value")]


def apply_genai_layout(path: Path, layers: int, out: Path | None = None) -> tuple[list[str], list[str]]:
    """Write the graph at ``path`` (``model.onnx``, beside its ``model.onnx.data`` when it has one) renamed for
    onnxruntime-genai into the folder ``out`` (the graph's own folder when None): inputs ``input_ids,
    attention_mask, past_key_values.<l>.key|value``, outputs ``logits (B, 1, V), present.<l>.key|value``.
    The weights stay in an external ``.data`` file only when they were in one. Returns ``(input names,
    output names)``.

    Raises:
        ValueError: the graph's inputs or outputs are not those of a prefill or decode part over ``layers``
            layers of keys and values.
    """
    import onnx_ir as ir

    model = ir.load(path)
    graph = model.graph
    inputs, outputs = list(graph.inputs), list(graph.outputs)
    if len(outputs) != 1 + 2 * layers or len(inputs) not in (2, 2 + 2 * layers):
        raise ValueError(f"{path}: {len(inputs)} inputs and {len(outputs)} outputs are not a generation part over {layers} layers")
    for value, name in zip(inputs[2:], _names(layers, "past_key_values")):
        value.name = name
    for value, name in zip(outputs[1:], _names(layers, "present")):
        value.name = name
    logits = outputs[0]
    logits.name = "logits_last_position"
    axes = ir.Value(name="logits_sequence_axis", const_value=ir.tensor(np.array([1], dtype=np.int64)))
    graph.register_initializer(axes)
    shape = logits.shape
    unsqueeze = ir.Node("", "Unsqueeze", [logits, axes], outputs=[ir.Value(name="logits")], name="logits_as_sequence")
    unsqueeze.outputs[0].type = logits.type
    if shape is not None and len(shape) == 2:
        unsqueeze.outputs[0].shape = ir.Shape([shape[0], 1, shape[1]])
    graph.append(unsqueeze)
    graph.outputs[0] = unsqueeze.outputs[0]
    data = path.name + ".data"
    external = (path.parent / data).exists()
    target = out or path.parent
    # the weights are read from the files being replaced: write beside them, then move into place
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        staged = Path(tmp) / path.name
        if external:
            ir.save(model, staged, external_data=data)
        else:
            ir.save(model, staged)
        del model, graph
        for name in (path.name, data):
            if (Path(tmp) / name).exists():
                shutil.move(str(Path(tmp) / name), str(target / name))
    return [v.name for v in inputs], ["logits", *_names(layers, "present")]


def genai_config(config: Any, generation_config: Any, parts: dict[str, dict[str, Any]], dims: dict[str, int | None] | None = None) -> dict[str, Any]:
    """The ``genai_config.json`` of a folder whose ``prefill`` and ``decode`` parts have the genai layout
    (the model must name an ``eos_token_id``: onnxruntime-genai refuses a configuration without one).

    ``parts``: part name -> ``{"file", "inputs", "outputs"}`` (graph names, as :func:`apply_genai_layout` returns);
    ``dims``: the cache's ``num_key_value_heads`` and ``head_size`` and the logits' ``vocab_size`` as the graphs
    have them (:func:`graph_dims`), which onnxruntime-genai sizes its buffers by; the model config's values
    stand in for any that is None."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    dims = dims or {}
    heads = int(text.num_attention_heads)
    head_size = int(dims.get("head_size") or getattr(text, "head_dim", None) or text.hidden_size // heads)
    kv_heads = int(dims.get("num_key_value_heads") or getattr(text, "num_key_value_heads", None) or heads)
    vocab = int(dims.get("vocab_size") or text.vocab_size)

    def token(name: str) -> Any:
        value = getattr(generation_config, name, None)
        if value is None:
            value = getattr(text, name, None)
        return value

    eos = token("eos_token_id")
    pad = token("pad_token_id")
    pipeline = [
        {
            name: {
                "filename": parts[name]["file"],
                "inputs": parts[name]["inputs"],
                "outputs": parts[name]["outputs"],
                "run_on_prompt": name == "prefill",
                "run_on_token_gen": name == "decode",
            }
        }
        for name in ("prefill", "decode")
    ]
    context = int(getattr(text, "max_position_embeddings", None) or 2048)
    return {
        "model": {
            "type": "decoder-pipeline",
            "bos_token_id": token("bos_token_id") if token("bos_token_id") is not None else -1,
            "eos_token_id": eos,
            "pad_token_id": pad if pad is not None else (eos[0] if isinstance(eos, list) else eos if eos is not None else 0),
            "vocab_size": vocab,
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "hf-exporters", "provider_options": []},
                "head_size": head_size,
                "hidden_size": int(text.hidden_size),
                "num_attention_heads": heads,
                "num_key_value_heads": kv_heads,
                "num_hidden_layers": int(text.num_hidden_layers),
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"},
                "pipeline": pipeline,
            },
        },
        "search": {
            "do_sample": bool(getattr(generation_config, "do_sample", False)),
            "max_length": context,
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "temperature": float(getattr(generation_config, "temperature", None) or 1.0),
            "top_k": int(getattr(generation_config, "top_k", None) or 50),
            "top_p": float(getattr(generation_config, "top_p", None) or 1.0),
            "repetition_penalty": float(getattr(generation_config, "repetition_penalty", None) or 1.0),
        },
    }


def rename_genai_files(directory: Path, renamed: dict[str, str]) -> None:
    """Point the ``filename`` of every pipeline graph in ``directory``'s genai config at its new name
    (``renamed``: old file -> new file, relative to ``directory``)."""
    path = directory / GENAI_CONFIG
    config = json.loads(path.read_text())
    for step in config["model"]["decoder"]["pipeline"]:
        for graph in step.values():
            graph["filename"] = renamed.get(graph["filename"], graph["filename"])
    path.write_text(json.dumps(config, indent=2) + "\n")


def write_genai_config(
    directory: Path, config: Any, generation_config: Any, parts: dict[str, dict[str, Any]], dims: dict[str, int | None] | None = None
) -> str:
    """Write :func:`genai_config` to ``directory``; returns the file name."""
    (directory / GENAI_CONFIG).write_text(json.dumps(genai_config(config, generation_config, parts, dims), indent=2) + "\n")
    return GENAI_CONFIG
