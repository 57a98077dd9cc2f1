"""One copy of the weights for the ONNX graphs of a generation folder (generation/onnx_weights.py), on
two few-node graphs; the tiny Llama's ONNX folder is in tests/test_generation.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hf_exporters.generation.onnx_weights import INLINE_BYTES, SHARED_DATA, share_weights

ort = pytest.importorskip("onnxruntime", reason="the shared weights are checked in onnxruntime: the onnx extra")

SHARED = np.arange(32 * 32, dtype=np.float32).reshape(32, 32) / 100  # 4 KiB, in both graphs under other names
OWN = np.full((32, 32), 0.5, dtype=np.float32)  # 4 KiB, in the second graph only


def _graph(folder: Path, weights: dict[str, np.ndarray], bias: float) -> str:
    """x (2, 32) -> x @ w0 @ w1 ... + bias, saved in ``folder`` with its weights as external data."""
    folder.mkdir()
    nodes, last = [], "x"
    for i, name in enumerate(weights):
        nodes.append(helper.make_node("MatMul", [last, name], [f"m{i}"]))
        last = f"m{i}"
    nodes.append(helper.make_node("Add", [last, "bias"], ["y"]))
    initializers = [numpy_helper.from_array(value, name) for name, value in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([bias], dtype=np.float32), "bias"))  # 4 bytes: stays inline
    graph = helper.make_graph(
        nodes, folder.name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])], initializers
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return f"{folder.name}/model.onnx"


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_parts_move_to_the_root_and_store_each_tensor_once(tmp_path: Path) -> None:
    files = {"prefill": _graph(tmp_path / "prefill", {"a": SHARED}, 1.0), "decode": _graph(tmp_path / "decode", {"b": SHARED, "c": OWN}, 2.0)}
    x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
    before = {part: _run(tmp_path / file, x) for part, file in files.items()}
    checked = []

    result = share_weights(tmp_path, files, lambda part, old, new: checked.append((part, old.exists(), new.name)))

    assert result == {"prefill": ["prefill.onnx", SHARED_DATA], "decode": ["decode.onnx", SHARED_DATA]}
    assert checked == [("prefill", True, "prefill.onnx"), ("decode", True, "decode.onnx")]  # the old graphs still there
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decode.onnx", SHARED_DATA, "prefill.onnx"]  # subfolders gone
    assert (tmp_path / SHARED_DATA).stat().st_size == SHARED.nbytes + OWN.nbytes  # two tensors, not three (4 KiB: aligned)
    for part in files:
        np.testing.assert_array_equal(_run(tmp_path / f"{part}.onnx", x), before[part])
    decode = onnx.load(str(tmp_path / "decode.onnx"), load_external_data=False).graph.initializer
    locations = {t.name: {e.key: e.value for e in t.external_data} for t in decode}
    assert locations["b"] == {"location": SHARED_DATA, "offset": "0", "length": str(SHARED.nbytes)}
    assert locations["c"] == {"location": SHARED_DATA, "offset": str(SHARED.nbytes), "length": str(OWN.nbytes)}
    assert locations["bias"] == {} and INLINE_BYTES > 4


def test_a_failed_check_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    files = {"prefill": _graph(tmp_path / "prefill", {"a": SHARED}, 1.0), "decode": _graph(tmp_path / "decode", {"b": OWN}, 2.0)}
    listing = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))

    def refuse(part: str, old: Path, new: Path) -> None:
        if part == "decode":
            raise ValueError("part 'decode': differs")

    with pytest.raises(ValueError, match=r"^part 'decode': differs$"):
        share_weights(tmp_path, files, refuse)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == listing


def test_a_folder_that_already_has_the_data_file_is_refused(tmp_path: Path) -> None:
    files = {"prefill": _graph(tmp_path / "prefill", {"a": SHARED}, 1.0)}
    (tmp_path / SHARED_DATA).write_bytes(b"someone else's")
    with pytest.raises(ValueError, match=rf"^{tmp_path} already has a {SHARED_DATA}$"):
        share_weights(tmp_path, files)
    assert (tmp_path / SHARED_DATA).read_bytes() == b"someone else's" and (tmp_path / "prefill" / "model.onnx").exists()
