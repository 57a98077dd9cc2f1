"""OnnxExporter: interface, stages, runner, workarounds (each with the smallest test that needs it)."""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("onnxruntime", reason="the ONNX tests need the onnx extra")
pytest.importorskip("onnxscript", reason="the ONNX tests need the onnx extra")

import onnx_ir as ir  # noqa: E402

from hf_exporters import DynamoExporter, OnnxConfig, registry  # noqa: E402
from hf_exporters import known_issues  # noqa: E402
from hf_exporters.errors import ExportStageError, MissingDependencyError  # noqa: E402
from hf_exporters.exporters import onnx as onnx_module  # noqa: E402
from hf_exporters.exporters.onnx import OnnxExporter, newest_opset  # noqa: E402
from hf_exporters.runtime import check_parity, resized_inputs  # noqa: E402
from hf_exporters.shapes import StaticAxis  # noqa: E402

SOURCE = Path(onnx_module.__file__).read_text()


class _Tiny(torch.nn.Module):
    """A linear layer with a non-persistent buffer and a constant: neither may become a graph input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.full((4,), 0.5), persistent=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"y": self.linear(x) * self.scale * mask[..., None], "n": mask.sum(-1)}


def _tiny_inputs(batch: int = 2, seq: int = 3) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 10 + seq)
    return {"x": torch.randn(batch, seq, 8, generator=generator), "mask": torch.ones(batch, seq)}


# ── Interface ────────────────────────────────────────────────────────────────


def test_interface() -> None:
    assert issubclass(OnnxExporter, DynamoExporter)
    assert (OnnxExporter.name, OnnxExporter.artifact_name, OnnxExporter.default_atol) == ("onnx", "model.onnx", 1e-3)
    assert OnnxExporter.config_class is OnnxConfig


def test_export_save_run_dynamic(tmp_path: Path) -> None:
    model, inputs = _Tiny().eval(), _tiny_inputs()
    exporter = OnnxExporter()
    program = exporter.export(model, inputs, OnnxConfig(dynamic=True))
    assert isinstance(program, torch.onnx.ONNXProgram)
    assert exporter.exported_program is not None
    assert exporter.static_axes == [StaticAxis("x", 2, 8)]  # the feature axis meets the weight
    path = exporter.save(program, tmp_path)
    assert path == tmp_path / "model.onnx" and path.exists()
    assert (tmp_path / "model.onnx.data").exists()  # external_data=True by default

    run = exporter.load_runner(path)
    assert run.input_names == ["x", "mask"]  # no buffer, no constant leaks in
    assert run.output_names == ["y", "n"]  # named after the output dict keys, not the producing nodes
    resized = resized_inputs(exporter.exported_program, inputs)
    assert resized is not None and resized["x"].shape == (5, 6, 8)
    reports = check_parity(model, run, [inputs, resized], atol=exporter.default_atol)
    assert [r.input_shapes["x"] for r in reports] == [[2, 3, 8], [5, 6, 8]]
    assert all(r.ok and r.max_abs_diff < 1e-5 for r in reports)
    outputs = run(resized)
    assert [o.shape for o in outputs] == [(5, 6, 4), (5,)]
    np.testing.assert_allclose(outputs[1], np.full(5, 6.0))


def test_opset_and_inline_weights(tmp_path: Path) -> None:
    model, inputs = _Tiny().eval(), _tiny_inputs()
    exporter = OnnxExporter()
    config = OnnxConfig(opset_version=18, external_data=False, output_path=str(tmp_path / "direct.onnx"))
    program = exporter.export(model, inputs, config)
    assert program.model.opset_imports[""] == 18
    assert (tmp_path / "direct.onnx").exists() and not (tmp_path / "direct.onnx.data").exists()
    path = exporter.save(program, tmp_path / "out")
    assert not (tmp_path / "out" / "model.onnx.data").exists()
    (report,) = check_parity(model, exporter.load_runner(path), [inputs], atol=1e-3)
    assert report.max_abs_diff < 1e-5


def test_default_opset_is_newest_supported() -> None:
    program = OnnxExporter().export(_Tiny().eval(), _tiny_inputs())
    assert program.model.opset_imports[""] == newest_opset() >= 23


def test_five_stage_blocks_in_order() -> None:
    titles = re.findall(r"^\s*# ── (Stage \d): ([^─]+?) ──$", SOURCE, flags=re.MULTILINE)
    assert titles == [
        ("Stage 1", "Torch patches"),
        ("Stage 2", "ONNX patches"),
        ("Stage 3", "FX node fixes"),
        ("Stage 4", "ONNX translations"),
        ("Stage 5", "ONNX IR fixes"),
    ]
    for number, title in titles:
        assert f'stage(self.name, "{number}: {title}")' in SOURCE


def test_missing_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(MissingDependencyError) as info:
        OnnxExporter().export(_Tiny().eval(), _tiny_inputs())
    assert str(info.value) == (
        "The ONNX exporter needs the package 'onnxscript', which is not installed. "
        "Install it with: pip install 'hf-exporters[onnx]'"
    )


# ── Stage 2 guard ────────────────────────────────────────────────────────────


def test_stage2_refuses_other_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    with pytest.raises(ExportStageError) as info:
        OnnxExporter().export(_Tiny().eval(), _tiny_inputs())
    assert info.value.stage == "Stage 2: ONNX patches"
    assert info.value.detail == (
        "RuntimeError: the ONNX patches hook torch.onnx internals written for torch 2.13.x; torch 2.14.0 is installed"
    )


def test_stage2_refuses_moved_internal(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.onnx._internal.exporter import _fx_passes

    monkeypatch.delattr(_fx_passes, "decompose_with_registry")
    with pytest.raises(ExportStageError) as info:
        OnnxExporter().export(_Tiny().eval(), _tiny_inputs())
    assert info.value.stage == "Stage 2: ONNX patches"
    assert info.value.detail == (
        "RuntimeError: torch.onnx internal 'torch.onnx._internal.exporter._fx_passes.decompose_with_registry' "
        "has moved (no attribute 'decompose_with_registry'); _patch_decompose_with_registry cannot hook it"
    )


def test_stage2_hook_runs_fixes_after_decomposition(tmp_path: Path) -> None:
    class Reshaper(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(x.shape[0], -1) * 2

    model, inputs = Reshaper(), {"x": torch.randn(2, 3, 4)}
    exporter = OnnxExporter()
    program = exporter.export(model, inputs)
    # the trace holds aten.reshape (no view for Stage 3 to fix); the decomposition turns it into
    # aten.view, which only the Stage 2 hook sees and rewrites
    traced = [n.target for n in exporter.exported_program.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.reshape.default in traced and torch.ops.aten.view.default not in traced
    assert exporter.fx_fixes_applied == 1
    from torch.onnx._internal.exporter import _fx_passes

    assert _fx_passes.decompose_with_registry.__name__ == "decompose_with_registry"
    assert _fx_passes.decompose_with_registry.__qualname__ == "decompose_with_registry"  # the original is back
    (report,) = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs], atol=1e-3)
    assert report.max_abs_diff == 0.0


def test_lowering_error_names_the_real_cause() -> None:
    class Unlowerable(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.special.zeta(x, x)

    with pytest.raises(ExportStageError) as info:
        OnnxExporter().export(Unlowerable(), {"x": torch.rand(3) + 1})
    assert info.value.stage == "lowering (torch.onnx.export)"
    assert info.value.detail.startswith("DispatchError: No ONNX function found for <OpOverload(op='prims.zeta', overload='default')>")


# ── ONNX_DISABLE_OPTIMIZE ────────────────────────────────────────────────────

_UPSTREAM_REF = re.compile(r"(onnxscript#\d+|https://github\.com/microsoft/onnxscript/(issues|pull)/\d+)")


def test_disable_optimize_entries_name_an_upstream_issue() -> None:
    for model_class, reason in known_issues.ONNX_DISABLE_OPTIMIZE.items():
        assert _UPSTREAM_REF.search(reason), f"{model_class}: {reason!r} names no onnxscript issue"
    assert not _UPSTREAM_REF.search("the optimizer breaks this model")  # what the check refuses


def test_disable_optimize_is_applied_and_logged(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    reason = "constant folding drops a mask (onnxscript#1234)"
    monkeypatch.setitem(onnx_module.ONNX_DISABLE_OPTIMIZE, "_Tiny", reason)
    exporter = OnnxExporter()
    with caplog.at_level(logging.WARNING, logger="hf_exporters"):
        program = exporter.export(_Tiny().eval(), _tiny_inputs())
    assert exporter.optimized is False
    assert f"_Tiny: onnxscript optimizer turned off: {reason}" in caplog.text
    # unoptimized graphs keep the Constant nodes the optimizer would fold into initializers
    assert any(node.op_type == "Constant" for node in program.model.graph)


# ── Workarounds ──────────────────────────────────────────────────────────────

_PREFIX = {"patch": "_patch_", "fx_node_fix": "_fix_", "onnx_translation": "_aten_", "onnx_ir_fix": "_fix_ir_"}


def test_every_onnx_workaround_is_documented() -> None:
    workarounds = registry.list_workarounds("onnx")
    assert {w.kind for w in workarounds} >= {"patch", "fx_node_fix", "onnx_translation", "onnx_ir_fix"}
    for w in workarounds:
        assert w.name.startswith(_PREFIX[w.kind]), w.name
        doc = w.func.__doc__ or ""
        assert "Pattern:" in doc and "Models:" in doc, w.name
        assert w.upstream and "Remove when" not in w.upstream, w.name
        assert w.remove_when, w.name
        assert w.stage.startswith("Stage "), w.name


def test_fix_view_as_reshape() -> None:
    from hf_exporters.workarounds.onnx.fx_node_fixes import _fix_view_as_reshape

    class Viewer(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(2, -1) + 1

    gm = torch.export.export(Viewer(), (torch.randn(2, 3, 4),)).module()
    views = [n for n in gm.graph.nodes if n.target == torch.ops.aten.view.default]
    assert len(views) == 1
    assert _fix_view_as_reshape(gm, views[0]) is True
    assert views[0].target == torch.ops.aten.reshape.default
    gm.recompile()
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(gm(x), x.reshape(2, -1) + 1)


class _GroupedMM(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight)

    def forward(self, rows: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch.ops.transformers.grouped_mm_fallback(rows, self.weight, offs)


def test_grouped_mm_translation(tmp_path: Path) -> None:
    import transformers.integrations.moe  # noqa: F401  (defines torch.ops.transformers.grouped_mm_fallback)

    torch.manual_seed(0)
    model = _GroupedMM(torch.randn(4, 8, 5)).eval()
    # 7 rows: group 0 has 2, group 1 none, group 2 has 4, group 3 has 1
    inputs = {"rows": torch.randn(7, 8), "offs": torch.tensor([2, 2, 6, 7], dtype=torch.int32)}
    exporter = OnnxExporter()
    path = exporter.save(exporter.export(model, inputs), tmp_path)
    (report,) = check_parity(model, exporter.load_runner(path), [inputs], atol=1e-3)
    assert report.max_abs_diff < 1e-5
    # rows past the last group end stay zero, as in eager
    short = {"rows": inputs["rows"], "offs": torch.tensor([2, 2, 4, 5], dtype=torch.int32)}
    out = exporter.load_runner(path)(short)[0]
    np.testing.assert_array_equal(out[5:], 0.0)
    np.testing.assert_allclose(out, model(**short).detach().numpy(), atol=1e-5)


def test_fix_ir_topk_sorted() -> None:
    from hf_exporters.workarounds.onnx.ir_fixes import _fix_ir_topk_sorted

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([6]))
    k = ir.Value(name="k", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([1]))
    topk = ir.Node("", "TopK", [x, k], attributes=[ir.AttrInt64("sorted", 0)], num_outputs=2)
    graph = ir.Graph([x, k], list(topk.outputs), nodes=[topk], opset_imports={"": 18})
    function = ir.Function("local", "f", graph=graph, attributes=[])
    model = ir.Model(ir.Graph([], [], nodes=[], opset_imports={"": 18}), ir_version=10)
    model.functions[function.identifier()] = function
    assert onnx_module.apply_onnx_ir_fixes(model) == 1
    assert topk.attributes["sorted"].as_int() == 1
    assert _fix_ir_topk_sorted(graph) == 0  # already sorted
