"""ONNX optimisation levels and opsets: the dead NaN guard fix, onnxruntime fusions, --opset / --optimize."""

from __future__ import annotations

import json
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

import onnx_ir as ir  # noqa: E402
import onnxruntime as ort  # noqa: E402
import transformers  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from hf_exporters import OnnxConfig  # noqa: E402
from hf_exporters.cli import app  # noqa: E402
from hf_exporters.errors import InputError  # noqa: E402
from hf_exporters.exporters.onnx import OnnxExporter  # noqa: E402
from hf_exporters.exporters.onnx_optimize import check_opset, default_opset, newest_opset, optimize_level  # noqa: E402
from hf_exporters.pipeline import make_config, make_exporter  # noqa: E402
from hf_exporters.runtime import check_parity  # noqa: E402

FLOAT_MIN = float(np.finfo(np.float32).min)


# ── The dead NaN guard after a finitely masked softmax (Stage 5 IR fix) ─────────


def _guarded_softmax(fill: float) -> ir.Model:
    """``Where(IsNaN(p), 0, p)`` with ``p = Softmax(scores + Where(mask, 0, fill))``, as torchlib lowers
    SDPA with a boolean mask below opset 23."""
    scores = ir.Value(name="scores", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 3]))
    mask = ir.Value(name="mask", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([2, 3]))
    zero = ir.Value(name="zero", const_value=ir.tensor(np.array(0.0, dtype=np.float32), name="zero"))
    low = ir.Value(name="low", const_value=ir.tensor(np.array(fill, dtype=np.float32), name="low"))
    additive = ir.node("Where", [mask, zero, low])
    masked = ir.node("Add", [scores, additive.outputs[0]])
    softmax = ir.node("Softmax", [masked.outputs[0]], attributes={"axis": -1})
    is_nan = ir.node("IsNaN", [softmax.outputs[0]])
    guard = ir.node("Where", [is_nan.outputs[0], zero, softmax.outputs[0]])
    final = ir.node("Identity", [guard.outputs[0]])
    final.outputs[0].name, final.outputs[0].type, final.outputs[0].shape = "p", ir.TensorType(ir.DataType.FLOAT), ir.Shape([2, 3])
    graph = ir.Graph(
        [scores, mask], final.outputs, nodes=[additive, masked, softmax, is_nan, guard, final], initializers=[zero, low], opset_imports={"": 18}
    )
    return ir.Model(graph, ir_version=10)


def _run(model: ir.Model, tmp_path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    path = tmp_path / "m.onnx"
    ir.save(model, path)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_fix_ir_dead_softmax_nan_guard(tmp_path: Path) -> None:
    """With the dtype's finite minimum as fill, a fully masked row is uniform, never NaN: the guard goes
    and the outputs stay the same bit for bit."""
    from hf_exporters.workarounds.onnx.ir_fixes import _fix_ir_dead_softmax_nan_guard

    feeds = {"scores": np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 4.0]], dtype=np.float32), "mask": np.array([[True, True, False], [False] * 3])}
    model = _guarded_softmax(FLOAT_MIN)
    before = _run(model, tmp_path, feeds)
    assert _fix_ir_dead_softmax_nan_guard(model.graph) == 1
    assert [n.op_type for n in model.graph] == ["Where", "Add", "Softmax", "Identity"]
    assert _fix_ir_dead_softmax_nan_guard(model.graph) == 0
    after = _run(model, tmp_path, feeds)
    np.testing.assert_array_equal(after, before)
    np.testing.assert_allclose(after[0], [0.26894143, 0.7310586, 0.0], rtol=1e-6)
    np.testing.assert_allclose(after[1], [1 / 3] * 3, rtol=1e-6)  # the fully masked row: uniform, as before


def test_nan_guard_kept_for_an_infinite_fill(tmp_path: Path) -> None:
    """With ``-inf`` as fill the guard is what turns a fully masked row's NaN into zeros: it stays."""
    from hf_exporters.workarounds.onnx.ir_fixes import _fix_ir_dead_softmax_nan_guard

    model = _guarded_softmax(float("-inf"))
    assert _fix_ir_dead_softmax_nan_guard(model.graph) == 0
    feeds = {"scores": np.zeros((2, 3), dtype=np.float32), "mask": np.array([[True] * 3, [False] * 3])}
    np.testing.assert_array_equal(_run(model, tmp_path, feeds)[1], [0.0, 0.0, 0.0])


# ── Levels and opsets ────────────────────────────────────────────────────────


def test_levels_and_their_errors() -> None:
    assert [optimize_level(v) for v in (True, False, None, "none", "default", "ort-cpu")] == ["default", "none", "none", "none", "default", "ort-cpu"]
    with pytest.raises(InputError, match=r"^unknown optimisation level 'O2'; choose one of: none, default, ort-cpu$"):
        optimize_level("O2")
    newest = newest_opset()
    assert (default_opset("default", newest), default_opset("none", newest), default_opset("ort-cpu", newest)) == (23, 23, 22)
    assert default_opset("default", 21) == 21
    assert check_opset(18) == 18
    with pytest.raises(InputError, match=rf"^opset 17 is not supported: choose one from 18 to {newest} \(onnx and onnxscript installed\)$"):
        check_opset(17)
    with pytest.raises(InputError, match=r"^--opset applies to the onnx backend only, not 'dynamo'$"):
        make_config(make_exporter("dynamo"), False, None, opset=20)
    with pytest.raises(InputError, match=r"^--optimize applies to the onnx backend only, not 'dynamo'$"):
        make_config(make_exporter("dynamo"), False, None, optimize="none")
    config = make_config(make_exporter("onnx"), True, None, opset=20, optimize="ort-cpu")
    assert (config.opset_version, config.optimize) == (20, "ort-cpu")


def _tiny_bert() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    config = transformers.BertConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, initializer_range=0.2
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 97, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0  # padded rows: the mask reaches the attention softmax
    mask[2, 4:] = 0
    return model, {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _ops(program) -> Counter:
    return Counter(f"{n.domain}:{n.op_type}" if n.domain else n.op_type for n in program.model.graph)


@pytest.mark.parametrize("level", ["none", "default", "ort-cpu"])
def test_levels_on_tiny_bert_match_eager_in_onnxruntime(level: str, tmp_path: Path) -> None:
    model, inputs = _tiny_bert()
    exporter = OnnxExporter()
    result = exporter.run(model, inputs, OnnxConfig(dynamic=True, optimize=level))
    program = result.program
    ops = _ops(program)
    assert exporter.optimize_level == level and result.optimized == (level != "none")
    assert ("Stage 6: ONNX Runtime fusions" in result.stage_seconds) and ("Stage 7: Quantization" in result.stage_seconds)
    if level == "ort-cpu":
        assert exporter.opset == 22 == program.model.opset_imports[""]
        assert exporter.fusions == {"skip_layer_normalization": 4, "sdpa": 2, "mha2": 2, "mha_bias": 2, "attention": 2, "bias_gelu": 2}
        assert (ops["com.microsoft:Attention"], ops["com.microsoft:SkipLayerNormalization"], ops["com.microsoft:BiasGelu"]) == (2, 4, 2)
        assert ops["Softmax"] == ops["Erf"] == ops["Gelu"] == 0
    else:
        assert exporter.opset == 23 == program.model.opset_imports[""] and exporter.fusions == {}
        assert ops["Attention"] == 2 and not any(op.startswith("com.microsoft") for op in ops)
    path = exporter.save(program, tmp_path)
    second = {k: v.repeat(2, 2)[:5, :17] for k, v in inputs.items()}
    reports = check_parity(model, exporter.load_runner(path), [inputs, second], atol=1e-4)
    assert all(r.ok for r in reports), [r.as_dict() for r in reports]
    assert max(r.max_abs_diff for r in reports) < 2e-5
    assert exporter.manifest_entries()["onnx"]["optimize"] == level


def test_opset_20_drops_the_guard_and_keeps_gelu_one_op(tmp_path: Path) -> None:
    """Opsets 20 to 22: SDPA is torchlib's softmax decomposition (its guard dropped by the IR fix), GELU
    one ``Gelu`` op (below 20 it is ``Erf`` arithmetic onnxruntime does not fuse)."""
    model, inputs = _tiny_bert()
    exporter = OnnxExporter()
    ops = {opset: _ops(exporter.export(model, inputs, OnnxConfig(opset_version=opset))) for opset in (18, 20)}
    assert exporter.ir_fixes_applied == 2  # one guard per layer
    assert (ops[20]["IsNaN"], ops[20]["Softmax"], ops[20]["Gelu"], ops[20]["Erf"]) == (0, 2, 2, 0)
    assert (ops[18]["IsNaN"], ops[18]["Gelu"], ops[18]["Erf"]) == (0, 0, 2)


def test_cli_optimize_and_opset(tmp_path: Path) -> None:
    model, _ = _tiny_bert()
    checkpoint = tmp_path / "bert"
    model.save_pretrained(checkpoint)
    runner = CliRunner()
    out = tmp_path / "out"
    result = runner.invoke(app, ["export", "-m", str(checkpoint), "-b", "onnx", "-o", str(out), "--dynamic", "--optimize", "ort-cpu", "--opset", "20"])
    assert result.exit_code == 0, result.output
    entry = json.loads((out / "export.json").read_text())["onnx"]
    assert entry == {
        "opset": 20,
        "optimize": "ort-cpu",
        "fusions": {"skip_layer_normalization": 4, "sdpa": 2, "mha2": 2, "mha_bias": 2, "attention": 2, "bias_gelu": 2},
        "ir_fixes_applied": 2,
        "quantize": None,
    }
    for option, value, message in (
        ("--optimize", "O2", "error: Invalid value for '--optimize': 'O2' is not one of none, default, ort-cpu"),
        ("--opset", "11", "error: Invalid value for '--opset': opset 11 is not supported: choose one from 18 to"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "hf_exporters.cli", "export", "-m", str(checkpoint), "-b", "onnx", "-o", str(tmp_path / "x"), option, value],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1].startswith(message) and "Traceback" not in proc.stderr and "╭" not in proc.stderr
    dynamo = runner.invoke(app, ["export", "-m", str(checkpoint), "-b", "dynamo", "-o", str(tmp_path / "x"), "--opset", "20"])
    assert dynamo.exit_code == 1 and dynamo.output.strip() == "error: --opset applies to the onnx backend only, not 'dynamo'"
    assert not (tmp_path / "x").exists()


def test_fully_masked_row_matches_eager_from_opset_23(tmp_path: Path) -> None:
    """A sequence whose attention mask is all zeros: eager's attention gives zeros there; the ONNX
    ``Attention`` op (opset 23 on, 23 the default) does too, torchlib's decomposition (opset 22)
    returns the mean of the values instead (documented in the README)."""
    model, inputs = _tiny_bert()
    inputs["attention_mask"][2] = 0
    diffs = {}
    for opset in (23, newest_opset(), 22):
        exporter = OnnxExporter()
        path = exporter.save(exporter.export(model, inputs, OnnxConfig(opset_version=opset)), tmp_path / str(opset))
        (report,) = check_parity(model, exporter.load_runner(path), [inputs], atol=1e-4, raise_on_mismatch=False)
        diffs[opset] = report.max_abs_diff
    assert diffs[23] < 2e-5 and diffs[newest_opset()] < 2e-5
    assert diffs[22] > 0.1


def test_tiny_llama_generation_folder_fused_for_onnxruntime(tmp_path: Path) -> None:
    """A text-generation folder at ``ort-cpu``: prefill and decode match eager (the folder's own check),
    RMS norms with their residual become ``SkipSimplifiedLayerNormalization`` and the prefill's
    attention ``MultiHeadAttention``."""
    import onnx

    from hf_exporters.generation import export_generation_folder

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    manifest = export_generation_folder(tmp_path / "llama", "onnx", tmp_path / "out", optimize="ort-cpu")
    assert sorted(manifest["parts"]) == ["decode", "prefill"]
    assert all(part["parity"]["ok"] and part["parity"]["max_abs_diff"] < 1e-5 for part in manifest["parts"].values())
    fused = {}
    for name in ("prefill", "decode"):
        proto = onnx.load(str(tmp_path / "out" / manifest["parts"][name]["file"]), load_external_data=False)
        assert {o.domain: o.version for o in proto.opset_import}[""] == 22
        fused[name] = Counter(n.op_type for n in proto.graph.node if n.domain == "com.microsoft")
    assert fused["prefill"] == {"SkipSimplifiedLayerNormalization": 4, "MultiHeadAttention": 2}
    assert fused["decode"]["SkipSimplifiedLayerNormalization"] == 4
