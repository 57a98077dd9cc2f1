"""The onnxruntime-genai layout of ONNX generation parts (generation/genai.py), on a few-node graph.

The round trip through onnxruntime-genai itself (ids equal to eager ``generate()``) is in
tests/test_generation.py, on the tiny Llama's ONNX folder.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hf_exporters.generation.genai import apply_genai_layout, genai_config, genai_layout_refusal

ort = pytest.importorskip("onnxruntime", reason="the genai layout is checked in onnxruntime: the onnx extra")


def _decode_like(path, layers: int = 1) -> None:
    """input_ids (B, 1), attention_mask (B, S), past (B, 2, P, 4) x 2 -> logits (B, 3) = first 3 columns of the
    mask as float, present = past + 1 (key) and past * 2 (value), with the torch exporter's numbered outputs."""
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", 1]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "S"]),
    ] + [helper.make_tensor_value_info(f"past_key_values_{i}", TensorProto.FLOAT, ["B", 2, "P", 4]) for i in range(2 * layers)]
    nodes = [
        helper.make_node("Cast", ["attention_mask"], ["mask_float"], to=TensorProto.FLOAT),
        helper.make_node("Slice", ["mask_float", "start", "end", "axis"], ["0"]),
    ]
    outputs = [helper.make_tensor_value_info("0", TensorProto.FLOAT, ["B", 3])]
    for i in range(2 * layers):
        nodes.append(helper.make_node("Add" if i % 2 == 0 else "Mul", [f"past_key_values_{i}", "one" if i % 2 == 0 else "two"], [str(i + 1)]))
        outputs.append(helper.make_tensor_value_info(str(i + 1), TensorProto.FLOAT, ["B", 2, "P", 4]))
    initializers = [
        helper.make_tensor(name, TensorProto.INT64, [1], [value]) for name, value in (("start", 0), ("end", 3), ("axis", 1))
    ] + [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]), helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])]
    graph = helper.make_graph(nodes, "decode", inputs, outputs, initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def _run(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()], session.run(None, feeds)


def test_layout_renames_inputs_and_outputs_and_keeps_the_values(tmp_path):
    path = tmp_path / "model.onnx"
    _decode_like(path)
    rng = np.random.default_rng(0)
    past = [rng.standard_normal((2, 2, 5, 4)).astype(np.float32) for _ in range(2)]
    mask = np.array([[1, 0, 1, 1, 1, 1], [1, 1, 0, 1, 1, 1]], dtype=np.int64)
    feeds = {"input_ids": np.ones((2, 1), np.int64), "attention_mask": mask}
    _, _, before = _run(path, {**feeds, "past_key_values_0": past[0], "past_key_values_1": past[1]})

    names = apply_genai_layout(path, layers=1)
    assert names == (
        ["input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value"],
        ["logits", "present.0.key", "present.0.value"],
    )
    inputs, outputs, after = _run(path, {**feeds, "past_key_values.0.key": past[0], "past_key_values.0.value": past[1]})
    assert (inputs, outputs) == names
    assert after[0].shape == (2, 1, 3)
    np.testing.assert_array_equal(after[0][:, 0], before[0])
    np.testing.assert_array_equal(after[0][:, 0], mask[:, :3].astype(np.float32))
    np.testing.assert_array_equal(after[1], past[0] + 1)
    np.testing.assert_array_equal(after[2], past[1] * 2)


def test_layout_refuses_a_graph_that_is_not_a_part_over_those_layers(tmp_path):
    path = tmp_path / "model.onnx"
    _decode_like(path, layers=1)
    with pytest.raises(ValueError, match=r"model\.onnx: 4 inputs and 3 outputs are not a generation part over 2 layers$"):
        apply_genai_layout(path, layers=2)


@pytest.mark.parametrize(
    "backend,roles,cache,encoder_decoder,reason",
    [
        ("onnx", {"prefill", "decode"}, {"kind": "dynamic", "layers": 2}, False, None),
        ("dynamo", {"prefill", "decode"}, {"kind": "dynamic"}, False, "not an ONNX folder"),
        ("onnx", {"encoder", "prefill", "decode"}, {"kind": "dynamic"}, True, "an encoder-decoder model"),
        ("onnx", {"encoder", "prefill", "decode"}, {"kind": "dynamic"}, False, "parts ['decode', 'encoder', 'prefill']"),
        ("onnx", {"prefill", "decode"}, {"kind": "static"}, False, "a static cache"),
        ("onnx", {"prefill", "decode"}, {"kind": "dynamic", "tensors": [{"name": "conv"}]}, False, "a dynamic cache with recurrent states"),
    ],
)
def test_which_folders_get_the_layout(backend, roles, cache, encoder_decoder, reason):
    got = genai_layout_refusal(backend, roles, cache, encoder_decoder)
    assert (got is None) if reason is None else got.startswith(reason)


def test_config_describes_the_model_and_the_pipeline():
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3, max_position_embeddings=256
    )
    generation = transformers.GenerationConfig(bos_token_id=1, eos_token_id=[2, 7], pad_token_id=None)
    parts = {role: {"file": f"{role}/model.onnx", "inputs": ["input_ids"], "outputs": ["logits"]} for role in ("prefill", "decode")}
    got = genai_config(config, generation, parts)
    model = got["model"]
    assert (model["type"], model["vocab_size"], model["context_length"]) == ("decoder-pipeline", 128, 256)
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == (1, [2, 7], 2)
    decoder = model["decoder"]
    assert (decoder["head_size"], decoder["num_key_value_heads"], decoder["num_hidden_layers"]) == (16, 2, 3)
    assert [list(step) for step in decoder["pipeline"]] == [["prefill"], ["decode"]]
    assert decoder["pipeline"][0]["prefill"]["run_on_prompt"] and not decoder["pipeline"][0]["prefill"]["run_on_token_gen"]
    assert decoder["pipeline"][1]["decode"]["run_on_token_gen"] and not decoder["pipeline"][1]["decode"]["run_on_prompt"]


def test_graph_refusal_reads_the_counts_before_anything_is_renamed(tmp_path):
    from hf_exporters.generation.genai import genai_graph_refusal

    (tmp_path / "decode").mkdir()
    path = tmp_path / "decode" / "model.onnx"
    _decode_like(path, layers=1)
    assert genai_graph_refusal([path], layers=1) is None
    assert genai_graph_refusal([path], layers=3) == (
        "decode/model.onnx has 4 inputs and 3 outputs, not a prefill or decode graph over 3 layers of keys and values"
    )
    assert onnx.load(str(path)).graph.input[2].name == "past_key_values_0"  # untouched
