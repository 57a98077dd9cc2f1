"""int8 ONNX exports (onnxruntime's quantizer, Stage 7) and their accuracy on real sentences."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("onnxruntime", reason="the ONNX tests need the onnx extra")
pytest.importorskip("onnxscript", reason="the ONNX tests need the onnx extra")

import transformers  # noqa: E402

from hf_exporters import OnnxConfig  # noqa: E402
from hf_exporters.errors import InputError, ParityError  # noqa: E402
from hf_exporters.exporters.onnx import OnnxExporter  # noqa: E402
from hf_exporters.exporters.onnx_quantize import quantize_model  # noqa: E402
from hf_exporters.pipeline import default_model_path, export_to_folder, forward_parameters, load_checkpoint  # noqa: E402
from hf_exporters.runtime.embedding_accuracy import (  # noqa: E402
    SENTENCES,
    THRESHOLDS,
    check_embedding_accuracy,
    mean_pool,
    nearest_neighbours,
    sentence_batches,
)


@pytest.fixture(scope="module")
def minilm():
    model, tokenizer, _ = load_checkpoint(default_model_path(), "feature-extraction")
    return model, tokenizer


def _tiny_bert() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    config = transformers.BertConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, initializer_range=0.2
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def test_pooling_and_neighbours() -> None:
    hidden = np.array([[[1.0, 0.0], [3.0, 2.0], [100.0, 100.0]]])
    np.testing.assert_allclose(mean_pool(hidden, np.array([[1, 1, 0]])), [[2.0, 1.0]])  # the padded token is left out
    vectors = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.8]])
    assert nearest_neighbours(vectors).tolist() == [1, 0, 3, 2]
    assert len(SENTENCES) == 40 and len(set(SENTENCES)) == 40
    assert THRESHOLDS == {"min_cosine": 0.98, "mean_cosine": 0.99, "neighbour_agreement": 0.9}


def test_accuracy_below_threshold_fails_like_parity(minilm) -> None:
    """An artifact whose embeddings are eager's plus noise fails with every measure below its floor named."""
    model, tokenizer = minilm
    batches = sentence_batches(tokenizer, forward_parameters(model))
    assert [b["input_ids"].shape[0] for b in batches] == [8] * 5
    generator = np.random.default_rng(0)

    def noisy(inputs):
        with torch.no_grad():
            hidden = model(**inputs).last_hidden_state.numpy()
        return [hidden + generator.normal(0.0, 0.5, hidden.shape).astype(np.float32)]

    with pytest.raises(ParityError, match=r"^the quantized artifact's sentence embeddings differ from eager float32 over 40 sentences: min_cosine 0\.\d{4} < 0\.98, mean_cosine 0\.\d{4} < 0\.99"):
        check_embedding_accuracy(model, noisy, batches)

    def exact(inputs):
        with torch.no_grad():
            return [model(**inputs).last_hidden_state.numpy()]

    accuracy = check_embedding_accuracy(model, exact, batches)
    assert (accuracy.min_cosine, accuracy.neighbour_agreement, accuracy.ok) == (1.0, 1.0, True)


@pytest.mark.parametrize("level", ["default", "ort-cpu"])
def test_minilm_int8_dynamic_keeps_its_sentence_embeddings(minilm, tmp_path: Path, level: str) -> None:
    """Every sentence keeps cosine >= 0.99 at both levels: the feed-forward down projections whose
    GELU output has outliers stay float, the rest is int8 (under 0.4x the float32 bytes)."""
    model, tokenizer = minilm
    inputs = dict(tokenizer(SENTENCES[:2], padding=True, return_tensors="pt"))
    manifest = export_to_folder(
        model, inputs, "onnx", tmp_path / "q", dynamic=True, preprocessor=tokenizer, task="feature-extraction", quantize="int8-dynamic", optimize=level
    )
    accuracy = manifest["accuracy"]
    assert accuracy["ok"] and accuracy["sentences"] == 40
    assert accuracy["min_cosine"] >= 0.99 and accuracy["mean_cosine"] > 0.995 and accuracy["neighbour_agreement"] >= 0.95
    assert manifest["parity"] == [] and manifest["onnx"]["quantize"] == "int8-dynamic" and manifest["onnx"]["optimize"] == level
    import onnx

    graph = onnx.load(str(tmp_path / "q" / "model.onnx"), load_external_data=False).graph
    nodes = {n.name: n for n in graph.node}
    producers = {o: n.op_type for n in graph.node for o in n.output}
    kept = manifest["onnx"]["float_matmuls"]
    assert 1 <= len(kept) <= 4 and all(nodes[name].op_type == "MatMul" for name in kept)
    assert {producers[nodes[name].input[0]] for name in kept} <= {"Gelu", "BiasGelu", "FastGelu"}
    assert sum(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul", "QAttention") for n in graph.node) >= 12
    float_bytes = sum(p.numel() * 4 for p in model.parameters())
    quantized_bytes = sum(f.stat().st_size for f in (tmp_path / "q").iterdir() if f.name.startswith("model.onnx"))
    assert quantized_bytes < 0.4 * float_bytes


class _Outlier(torch.nn.Module):
    """Two linear layers; the second takes an activation of 8192 values, one of them 1000 (about 90
    standard deviations)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)
        bump = torch.zeros(256, 32)
        bump[0, 3] = 1000.0
        self.register_buffer("bump", bump)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x) + self.bump)


def test_outlier_matmuls_keeps_float_the_matmul_whose_activation_has_outliers() -> None:
    from hf_exporters.exporters.onnx_quantize import OUTLIER_RATIO, outlier_matmuls

    model, x = _Outlier().eval(), torch.randn(1, 256, 32, generator=torch.Generator().manual_seed(2))
    program = OnnxExporter().export(model, {"x": x})
    matmuls = [n for n in program.model.graph if n.op_type == "MatMul"]
    assert len(matmuls) == 2
    kept = outlier_matmuls(program.model, [{"x": x}])
    assert kept == [matmuls[1].name]
    assert outlier_matmuls(program.model, [{"x": x}], ratio=1e6) == []
    scaled = (model.first(x) + model.bump).detach().numpy()
    assert np.abs(scaled).max() > OUTLIER_RATIO * scaled.std()  # what the rule measured
    quantized = quantize_model(program.model, "int8-dynamic", keep_float=kept)
    ops = {n.name: n.op_type for n in quantized.graph}
    assert ops[matmuls[1].name] == "MatMul" and matmuls[0].name not in ops  # the first one replaced by its int8 form
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= set(ops.values())
    with pytest.raises(InputError, match=r"^int8-dynamic needs calibration inputs to find the activations with outliers$"):
        outlier_matmuls(program.model, [])
    with pytest.raises(InputError, match=r"^calibration inputs lack the graph inputs \['x'\]$"):
        outlier_matmuls(program.model, [{"y": x}])


def test_int8_dynamic_and_static_run_in_onnxruntime(tmp_path: Path) -> None:
    """Dynamic int8 of the ONNX ``Attention`` op graph (opset 23) loads: the standard op stays float;
    static int8 puts QDQ pairs around the MatMuls but the one after each GELU."""
    model, inputs = _tiny_bert()
    with torch.no_grad():
        eager = model(**inputs).last_hidden_state.numpy()
    for mode, quantized_op in (("int8-dynamic", "MatMulInteger"), ("int8-static", "QuantizeLinear")):
        exporter = OnnxExporter()
        program = exporter.export(model, inputs, OnnxConfig(quantize=mode))
        ops = Counter(n.op_type for n in program.model.graph)
        assert ops[quantized_op] > 0 and ops["Attention"] == 2, ops
        if mode == "int8-static":
            gelu = {n.outputs[0] for n in program.model.graph if n.op_type == "Gelu"}
            assert [n.op_type for n in program.model.graph if n.op_type == "MatMul" and n.inputs[0] in gelu] == ["MatMul", "MatMul"]
        (output, _) = exporter.load_runner(exporter.save(program, tmp_path / mode))(inputs)
        cosine = (output * eager).sum() / (np.linalg.norm(output) * np.linalg.norm(eager))
        assert cosine > 0.97, (mode, cosine)  # a random tiny model: the signal survives, the accuracy test is on MiniLM


def test_static_without_calibration_is_refused() -> None:
    model, inputs = _tiny_bert()
    program = OnnxExporter().export(model, inputs)
    with pytest.raises(InputError, match=r"^int8-static quantization needs calibration inputs$"):
        quantize_model(program.model, "int8-static", [])
    with pytest.raises(InputError, match=r"^unknown quantization 'int4'; choose one of: int8-dynamic, int8-static$"):
        quantize_model(program.model, "int4")


def test_cli_quantize_errors(tmp_path: Path) -> None:
    model, _ = _tiny_bert()
    checkpoint = tmp_path / "bert"
    model.save_pretrained(checkpoint)

    from typer.testing import CliRunner

    from hf_exporters.cli import app

    def cli(*args: str) -> tuple[int, str]:  # in process: the same exit code and error line as the command
        result = CliRunner().invoke(app, ["export", "-m", str(checkpoint), "-o", str(tmp_path / "x"), *args])
        return result.exit_code, result.stderr.strip().splitlines()[-1]

    # a usage error is one line from the command itself (click's own rendering is replaced in main())
    bad = subprocess.run(
        [sys.executable, "-m", "hf_exporters.cli", "export", "-m", str(checkpoint), "-o", str(tmp_path / "x"), "-b", "onnx", "--quantize", "int4"],
        capture_output=True, text=True, timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("error: Invalid value for '--quantize': 'int4' is not one of int8-dynamic, int8-static")
    assert cli("-b", "onnx", "--quantize", "int8-dynamic") == (
        1, "error: --quantize int8-dynamic calibrates and checks on real sentences: the checkpoint needs a tokenizer"
    )
    assert cli("-b", "dynamo", "--quantize", "int8-dynamic") == (1, "error: --quantize applies to the onnx and executorch backends, not 'dynamo'")
    assert not (tmp_path / "x").exists()
