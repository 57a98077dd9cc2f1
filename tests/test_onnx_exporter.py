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

from hf_exporters import DynamoExporter, ExportResult, OnnxConfig, registry  # noqa: E402
from hf_exporters import known_issues  # noqa: E402
from hf_exporters.errors import ExportStageError, MissingDependencyError, ParityError  # noqa: E402
from hf_exporters.exporters import onnx as onnx_module  # noqa: E402
from hf_exporters.exporters.onnx import OnnxExporter, newest_opset  # noqa: E402
from hf_exporters.runtime import check_parity, resized_inputs  # noqa: E402
from hf_exporters.shapes import StaticAxis, auto_dynamic_shapes  # noqa: E402
from config_models import build, example_inputs  # noqa: E402
from workaround_helpers import without_workarounds  # noqa: E402

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
    result = exporter.run(model, inputs, OnnxConfig(dynamic=True))
    program = result.program
    assert isinstance(program, torch.onnx.ONNXProgram)
    assert result.exported_program is not None
    assert result.static_axes == [StaticAxis("x", 2, 8)]  # the feature axis meets the weight
    path = exporter.save(program, tmp_path)
    assert path == tmp_path / "model.onnx" and path.exists()
    assert (tmp_path / "model.onnx.data").exists()  # external_data=True by default

    run = exporter.load_runner(path)
    assert run.input_names == ["x", "mask"]  # no buffer, no constant leaks in
    assert run.output_names == ["y", "n"]  # named after the output dict keys, not the producing nodes
    resized = resized_inputs(result.exported_program, inputs)
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


def test_default_opset_is_23() -> None:
    """23: onnxruntime 1.32 has a CPU kernel for Attention-23, none for 24 (see onnx_optimize.default_opset)."""
    program = OnnxExporter().export(_Tiny().eval(), _tiny_inputs())
    assert program.model.opset_imports[""] == 23 < newest_opset()


def test_stage_blocks_in_order() -> None:
    titles = re.findall(r"^\s*# ── (Stage \d): ([^─]+?) ──$", SOURCE, flags=re.MULTILINE)
    assert titles == [
        ("Stage 1", "Torch patches"),
        ("Stage 2", "ONNX patches"),
        ("Stage 3", "FX node fixes"),
        ("Stage 4", "ONNX translations"),
        ("Stage 5", "ONNX IR fixes"),
        ("Stage 6", "ONNX Runtime fusions"),
        ("Stage 7", "Quantization"),
    ]
    for number, title in titles:
        assert f'stage(self.name, "{number}: {title}"' in SOURCE


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
    result = exporter.run(model, inputs)
    program = result.program
    # the trace holds aten.reshape (no view for Stage 3 to fix); the decomposition turns it into
    # aten.view, which only the Stage 2 hook sees and rewrites
    traced = [n.target for n in result.exported_program.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.reshape.default in traced and torch.ops.aten.view.default not in traced
    assert result.fx_fixes_applied == 1
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
        result = exporter.run(_Tiny().eval(), _tiny_inputs())
        program = result.program
    assert result.optimized is False
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
    """Rows (S, in) times per-group weights (E, in, out) over ragged groups ending at ``offs`` (E,)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight)

    def forward(self, rows: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch.ops.transformers.grouped_mm_fallback(rows, self.weight, offs)


def test_grouped_mm_translation(tmp_path: Path) -> None:
    """``transformers::grouped_mm_fallback`` (``_aten_grouped_mm_fallback``: torchlib has no translation)
    gathers each row's group weight; onnxruntime matches eager, rows past the last group stay zero."""
    import transformers.integrations.moe  # noqa: F401  (defines torch.ops.transformers.grouped_mm_fallback)

    from hf_exporters.workarounds.onnx.translations import _aten_grouped_mm_fallback

    assert registry.onnx_translation_table()[torch.ops.transformers.grouped_mm_fallback.default] is _aten_grouped_mm_fallback
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


def test_aten_grouped_mm_translation_takes_offsets() -> None:
    """``aten::_grouped_mm`` with ``offs`` (transformers' grouped_mm experts with bfloat16 weights; torchlib
    refuses ``offs``): ``_aten_grouped_mm`` is registered for it and, evaluated by onnxscript on float32
    arrays (onnxruntime's CPU provider has no bfloat16 MatMul), gives torch's bfloat16 result to
    bfloat16 rounding, row by row within the groups."""
    from hf_exporters.workarounds.onnx.translations import _aten_grouped_mm

    assert registry.onnx_translation_table()[torch.ops.aten._grouped_mm.default] is _aten_grouped_mm
    generator = torch.Generator().manual_seed(0)
    rows, weight = torch.randn(7, 8, generator=generator), torch.randn(4, 8, 8, generator=generator)  # 16-byte strides
    offs = torch.tensor([2, 2, 6, 7], dtype=torch.int32)
    expected = torch._grouped_mm(rows.bfloat16(), weight.bfloat16(), offs=offs).float()
    got = _aten_grouped_mm(rows.bfloat16().float().numpy(), weight.bfloat16().float().numpy(), offs.numpy())
    got = np.asarray(got.value if hasattr(got, "value") else got)
    assert got.shape == (7, 8) and float(expected.abs().max()) > 1.0
    np.testing.assert_allclose(got, expected.numpy(), rtol=2e-2, atol=5e-2)


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


def _onnx_parity(model: torch.nn.Module, inputs: dict[str, Any], tmp_path: Path) -> tuple[ExportResult, float]:
    exporter = OnnxExporter()
    result = exporter.run(model, inputs)
    path = exporter.save(result.program, tmp_path)
    (report,) = check_parity(model, exporter.load_runner(path), [inputs], atol=1e-4)
    return result, report.max_abs_diff


class _VmapMask(torch.nn.Module):
    """A sliding-window, padded bidirectional mask expanded the way ``sdpa_mask(use_vmap=True)`` does."""

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        from transformers import masking_utils

        def allowed(b: Any, h: Any, q: Any, kv: Any) -> Any:
            return ((q - kv).abs() < 2) & padding[b, kv]

        batch, length = padding.shape
        arange = torch.arange(length)
        with masking_utils.TransformGetItemToIndex():  # as sdpa_mask(use_vmap=True) calls it
            mask = masking_utils._vmap_expansion_sdpa(allowed)(torch.arange(batch), torch.arange(1), arange, arange)
        return torch.where(mask, x, torch.zeros_like(x))


def test_vmap_mask_expansion_by_broadcast(tmp_path: Path) -> None:
    """``_patch_mask_expansion_by_broadcast`` gives the four nested vmaps' mask; with it and
    ``_patch_mask_index_mode_off`` (no ``TransformGetItemToIndex`` mode, so no ``flat_apply`` node) the
    mask exports to ONNX and to a .pt2 that saves and loads, both exact."""
    from transformers import masking_utils

    from hf_exporters.workarounds.dynamo.masks import _patch_mask_expansion_by_broadcast

    padding = torch.tensor([[True, True, True, False], [True, True, False, False]])
    inputs = {"x": torch.randn(2, 1, 4, 4), "padding": padding}
    # the same boolean mask as the four nested vmaps
    vmapped = masking_utils._vmap_expansion_sdpa(lambda b, h, q, kv: (q >= kv) & padding[b, kv])
    broadcast = _patch_mask_expansion_by_broadcast(masking_utils._vmap_expansion_sdpa)(lambda b, h, q, kv: (q >= kv) & padding[b, kv])
    ids = (torch.arange(2), torch.arange(3), torch.arange(4), torch.arange(4))
    assert broadcast(*ids).shape == (2, 3, 4, 4)
    assert torch.equal(broadcast(*ids), vmapped(*ids))
    original = masking_utils._vmap_expansion_sdpa, masking_utils.TransformGetItemToIndex
    _, diff = _onnx_parity(_VmapMask(), inputs, tmp_path)
    assert diff == 0.0
    assert (masking_utils._vmap_expansion_sdpa, masking_utils.TransformGetItemToIndex) == original  # restored
    # the dynamo backend writes the .pt2 (with _patch_mask_index_mode_off no flat_apply node is left to
    # serialise) and loads it back
    dynamo = DynamoExporter()
    path = dynamo.save(dynamo.export(_VmapMask(), inputs), tmp_path / "pt2")
    (report,) = check_parity(_VmapMask(), dynamo.load_runner(path), [inputs], atol=1e-6)
    assert report.max_abs_diff == 0.0


class _ComplexRotary(torch.nn.Module):
    """Rotary embedding in complex numbers: unsqueeze, expand, select and reshape of complex tensors."""

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        batch, length, heads, width = x.shape
        freqs = torch.polar(torch.ones_like(angles), angles)  # (L, W/2)
        xc = torch.view_as_complex(x.float().reshape(batch, length, heads, width // 2, 2))
        rotated = xc * freqs.unsqueeze(1).unsqueeze(0).expand(batch, -1, heads, -1)
        first = rotated.select(2, 0).reshape(batch, -1)  # (B, L * W/2)
        return torch.cat([torch.view_as_real(rotated).flatten(-2).flatten(1), torch.view_as_real(first).flatten(1)], dim=1)


def test_fix_complex_shape_ops(tmp_path: Path) -> None:
    inputs = {"x": torch.randn(2, 3, 2, 8), "angles": torch.randn(3, 4)}
    result, diff = _onnx_parity(_ComplexRotary(), inputs, tmp_path)
    assert diff < 1e-5
    assert result.fx_fixes_applied >= 4  # unsqueeze x2, expand, select, reshape: each rewritten
    # dynamic batch and length: the reshape and expand sizes are symbolic nodes
    dynamic = OnnxExporter()
    path = dynamic.save(dynamic.export(_ComplexRotary(), inputs, OnnxConfig(dynamic=True)), tmp_path / "dynamic")
    other = {"x": torch.randn(3, 5, 2, 8), "angles": torch.randn(5, 4)}
    reports = check_parity(_ComplexRotary(), dynamic.load_runner(path), [inputs, other], atol=1e-4)
    assert all(r.max_abs_diff < 1e-5 for r in reports)


def test_fix_rsub_scalar(tmp_path: Path) -> None:
    class Inverted(torch.nn.Module):
        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return x * (1.0 - mask) + (2 - 3 * x) + (1.0 - mask.to(torch.uint8))  # uint8 must not wrap

    inputs = {"x": torch.randn(2, 5), "mask": torch.tensor([[1, 1, 0, 0, 1], [0, 1, 1, 1, 1]])}
    result, diff = _onnx_parity(Inverted(), inputs, tmp_path)
    assert diff < 1e-6
    traced = [n.target for n in result.exported_program.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.rsub.Scalar not in traced  # Stage 3 rewrote both


def test_fix_sdpa_broadcast_kv_heads(tmp_path: Path) -> None:
    class MultiQuery(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    inputs = {"q": torch.randn(2, 4, 5, 8), "k": torch.randn(2, 1, 5, 8), "v": torch.randn(2, 1, 5, 8)}
    _, diff = _onnx_parity(MultiQuery(), inputs, tmp_path)
    assert diff < 1e-5


class _PaddingMaskAttention(torch.nn.Module):
    """SDPA with a BERT-style padding mask of one query row, (batch, 1, 1, keys), broadcast over the queries."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        extended = (1.0 - mask[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=extended)


@pytest.mark.parametrize("dynamic", [False, True])
def test_fix_sdpa_mask_over_query_rows(tmp_path: Path, dynamic: bool) -> None:
    """onnxruntime's opset-23 ``Attention`` refuses a mask of one query row at run time; expanded, it matches eager."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=generator) for _ in range(3))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0  # the second row's last two keys are padding
    inputs = {"q": q, "k": k, "v": v, "mask": mask}
    config = OnnxConfig(dynamic_shapes=auto_dynamic_shapes(inputs)) if dynamic else None
    exporter = OnnxExporter()
    with without_workarounds("_fix_sdpa_mask_over_query_rows"):
        path = exporter.save(exporter.export(_PaddingMaskAttention(), inputs, config), tmp_path / "without")
        with pytest.raises(Exception, match=re.escape("inconsistent q_sequence_length (between attn_mask and Q)")):
            exporter.load_runner(path)(inputs)
    result = exporter.run(_PaddingMaskAttention(), inputs, config)
    assert "_fix_sdpa_mask_over_query_rows" in [w.target for w in result.workarounds_fired]
    assert [n.op_type for n in result.program.model.graph].count("Attention") == 1
    path = exporter.save(result.program, tmp_path / "with")
    sets = [inputs] + ([{"q": q[:, :, :3], "k": k, "v": v, "mask": mask}] if dynamic else [])
    reports = check_parity(_PaddingMaskAttention(), exporter.load_runner(path), sets, atol=1e-5)
    assert all(r.ok and r.max_abs_diff < 1e-5 for r in reports) and len(reports) == len(sets)


class _CrossAttentionSplitByDecoderBatch(torch.nn.Module):
    """Cross-attention whose encoder states are split into heads, then regrouped by the decoder's batch: with
    dynamic shapes the two batch axes are two symbols, and the key's heads axis is traced as ``4 * b2 // b``."""

    def forward(self, hidden: torch.Tensor, encoder: torch.Tensor) -> torch.Tensor:
        batch, length, _ = hidden.shape
        q = hidden.view(batch, length, 4, 8).transpose(1, 2)
        k = encoder.view(encoder.shape[0], encoder.shape[1], 4, 8).transpose(1, 2).reshape(batch, -1, encoder.shape[1], 8)
        return torch.nn.functional.scaled_dot_product_attention(q, k, k)


def test_fix_sdpa_key_heads_to_query_heads(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    inputs = {"hidden": torch.randn(2, 5, 32, generator=generator), "encoder": torch.randn(2, 7, 32, generator=generator)}
    config = OnnxConfig(dynamic_shapes=auto_dynamic_shapes(inputs))
    exporter = OnnxExporter()
    with without_workarounds("_fix_sdpa_key_heads_to_query_heads"):
        with pytest.raises(ExportStageError, match=re.escape("SDPA (MHA) requires q_num_heads = kv_num_heads")):
            exporter.export(_CrossAttentionSplitByDecoderBatch(), inputs, config)
    result = exporter.run(_CrossAttentionSplitByDecoderBatch(), inputs, config)
    assert [w.target for w in result.workarounds_fired].count("_fix_sdpa_key_heads_to_query_heads") == 1
    path = exporter.save(result.program, tmp_path / "with")
    sets = [inputs, {"hidden": inputs["hidden"][:, :3], "encoder": torch.randn(2, 4, 32, generator=generator)}]
    reports = check_parity(_CrossAttentionSplitByDecoderBatch(), exporter.load_runner(path), sets, atol=1e-5)
    assert all(r.ok and r.max_abs_diff < 1e-5 for r in reports) and len(reports) == 2


def test_view_to_size_zero_axis_keeps_allowzero(tmp_path: Path) -> None:
    class EmptyPart(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            kept, empty = x.split([4, 0], dim=-1)
            return kept.view(2, 3, 2, 2), empty.view(2, 3, 2, 0)  # (B, S, heads, 0): a size-0 axis past x's rank

    _, diff = _onnx_parity(EmptyPart(), {"x": torch.randn(2, 3, 4)}, tmp_path)
    assert diff < 1e-6
    program = OnnxExporter().export(EmptyPart(), {"x": torch.randn(2, 3, 4)})
    (empty,) = [n for n in program.model.graph if n.op_type == "Reshape" and n.outputs[0].shape[-1] == 0]
    assert empty.attributes["allowzero"].as_int() == 1  # 0 is a size, not "copy this axis"


def test_output_number_constants_left_out(tmp_path: Path) -> None:
    from hf_exporters.shapes import output_names

    class WithSizes(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int], torch.Tensor]:
            return x * 2, (x.shape[1], 7), x.sum(-1)

    inputs = {"x": torch.randn(2, 3)}
    result, diff = _onnx_parity(WithSizes(), inputs, tmp_path)
    assert diff < 1e-6
    assert output_names(result.exported_program) == ["0", "2"]
    program = OnnxExporter().export(WithSizes(), inputs)
    assert [v.name for v in program.model.graph.outputs] == ["0", "2"]


def test_fix_squeeze_of_wide_axis(tmp_path: Path) -> None:
    class Joint(torch.nn.Module):
        def forward(self, encoder: torch.Tensor, decoder: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            joint = torch.tanh(encoder[:, :, None, :] + decoder[:, None, :, :])  # (B, T, U, D)
            return joint.squeeze(2), joint[:, :1].squeeze((1, 2))  # a no-op, then (1, 2) where only axis 1 is 1

    inputs = {"encoder": torch.randn(2, 4, 8), "decoder": torch.randn(2, 3, 8)}
    result, diff = _onnx_parity(Joint(), inputs, tmp_path)
    assert diff < 1e-6
    assert result.fx_fixes_applied >= 2


class _Joint(torch.nn.Module):
    """An RNN-T joint: an LSTM prediction network over the tokens, joined with the encoder frames and
    ``squeeze(2)``-ed as the model output (axis 2 is the token axis, 1 only for a single decoder step)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.lstm = torch.nn.LSTM(8, 8, num_layers=2, batch_first=True)

    def forward(self, encoder: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        decoder, _ = self.lstm(self.embed(tokens))
        return torch.tanh(encoder[:, :, None, :] + decoder[:, None, :, :]).squeeze(2)


def _token_axis(result: ExportResult) -> Any:
    [tokens] = [n for n in result.exported_program.graph.nodes if n.op == "placeholder" and n.name == "tokens"]
    return tokens.meta["val"].shape[1]


def test_lstm_keeps_a_dynamic_token_length_through_the_lowering(tmp_path: Path) -> None:
    """torch.onnx keeps ``aten.lstm.input`` whole (ONNX ``LSTM``) but computes its shapes, in the
    decomposition and in the type-promotion pass, by the op's own loop over time, which fixed the token
    length at the export's (4). With the two patches the length stays symbolic, the squeeze of the
    token axis (a model output, named in the output signature) becomes an alias, and onnxruntime
    matches eager at the export sizes and at longer ones."""
    torch.manual_seed(0)
    model = _Joint().eval()
    inputs = {"encoder": torch.randn(2, 5, 8), "tokens": torch.randint(0, 10, (2, 4))}
    with without_workarounds("_patch_lstm_kept_whole_with_symbolic_length", "_patch_type_promotion_keeps_lstm_whole"):
        unpatched = OnnxExporter().run(model, inputs, OnnxConfig(dynamic=True))
    assert _token_axis(unpatched) == 4
    exporter = OnnxExporter()
    result = exporter.run(model, inputs, OnnxConfig(dynamic=True))
    program = result.program
    assert not isinstance(_token_axis(result), int)
    assert "LSTM" in {node.op_type for node in program.model.graph}
    runner = exporter.load_runner(exporter.save(program, tmp_path))
    longer = {"encoder": torch.randn(3, 7, 8), "tokens": torch.randint(0, 10, (3, 9))}
    for sizes in (inputs, longer):
        [got] = runner(sizes)
        with torch.no_grad():
            want = model(**sizes)
        assert tuple(got.shape) == tuple(want.shape)
        assert (torch.as_tensor(got) - want).abs().max() < 1e-5
    assert "lstm.input" not in str(torch._decomp.meta_table.keys())  # the routing entry is removed


def test_squeeze_of_wide_axis_as_a_model_output(tmp_path: Path) -> None:
    """A static export of the joint: the squeeze of the 4-token axis becomes an alias that keeps the
    node's name (erased, torch.onnx failed with ``KeyError: 'squeeze'``), and onnxruntime matches eager."""
    model = _Joint().eval()
    inputs = {"encoder": torch.randn(2, 5, 8), "tokens": torch.randint(0, 10, (2, 4))}
    exporter = OnnxExporter()
    result = exporter.run(model, inputs, OnnxConfig(dynamic=False))
    program = result.program
    assert result.fx_fixes_applied >= 1
    [got] = exporter.load_runner(exporter.save(program, tmp_path))(inputs)
    with torch.no_grad():
        want = model(**inputs)
    assert tuple(got.shape) == (2, 5, 4, 8)
    assert (torch.as_tensor(got) - want).abs().max() < 1e-5


def test_patch_cummax_by_triangle(tmp_path: Path) -> None:
    from hf_exporters.workarounds.onnx.torch_patches import _patch_cummax_by_triangle, _patch_cummin_by_triangle

    class PreviousSpecial(torch.nn.Module):
        def forward(self, positions: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            values, indices = torch.cummax(positions, dim=1)
            return values, indices, x.cummax(0).values, torch.cummin(positions.flip(1), dim=1).indices

    positions = torch.tensor([[0, 3, 3, 1, 5, 5, 2], [4, 0, 4, 0, 1, 6, 6]])
    x = torch.tensor([[0.5, 2.0], [0.5, 1.0], [3.0, 1.0], [-1.0, 1.0]])
    for op, patched in ((torch.cummax, _patch_cummax_by_triangle(torch.cummax)), (torch.cummin, _patch_cummin_by_triangle(torch.cummin))):
        for tensor, dim in ((positions, 1), (positions, -1), (x, 0), (x, 1)):
            want, got = op(tensor, dim), patched(tensor, dim)
            assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)  # ties: last index
    _, diff = _onnx_parity(PreviousSpecial(), {"positions": positions, "x": x}, tmp_path)
    assert diff == 0.0


def test_varlen_vision_attention_runs_in_onnxruntime(tmp_path: Path) -> None:
    """Two images packed into one sequence: the block-diagonal attention patch (dynamo stage) gives
    an ONNX graph whose numbers match the per-image eager loop in onnxruntime."""
    from test_dynamo_exporter import _qwen2_vl_vision_tower

    tower, inputs = _qwen2_vl_vision_tower()
    exporter = OnnxExporter()
    program = exporter.export(tower, inputs)
    (report,) = check_parity(tower, exporter.load_runner(exporter.save(program, tmp_path)), [inputs], atol=exporter.default_atol)
    assert report.ok and report.max_abs_diff < 1e-4


@pytest.mark.canary
def test_sym_numel_is_refused_without_the_translation() -> None:
    model = build("Qwen3VLVisionModel")
    with without_workarounds("_aten_sym_numel"):
        with pytest.raises(ExportStageError, match="No ONNX function found for <OpOverload\\(op='aten.sym_numel'"):
            OnnxExporter().export(model, example_inputs(model))


def test_sym_numel_translation_is_the_product_of_the_shape() -> None:
    """torchlib has no translation of ``aten.sym_numel`` (the canary tier's
    test_sym_numel_is_refused_without_the_translation); ours is registered for it and gives the
    element count as a 0-d INT64: an empty axis gives 0, a 0-d tensor 1."""
    from hf_exporters.workarounds.onnx.translations import _aten_sym_numel

    assert registry.onnx_translation_table()[torch.ops.aten.sym_numel.default] is _aten_sym_numel
    for shape, count in (((2, 3, 4), 24), ((5,), 5), ((3, 0, 2), 0), ((), 1)):
        got = _aten_sym_numel(np.zeros(shape, dtype=np.float32)).value  # onnxscript's eager evaluation
        assert got.shape == () and got.dtype == np.int64 and int(got) == count, shape


@pytest.mark.canary
def test_sym_numel_translation(tmp_path: Path) -> None:
    """The Qwen3-VL vision tower reshapes tensors whose length comes from ``repeat_interleave`` by
    grid sizes (position-embedding interpolation); the program keeps ``aten.sym_numel`` in its
    runtime asserts, which only our translation lowers (without it, the canary tier's
    test_sym_numel_is_refused_without_the_translation; the translation alone:
    test_sym_numel_translation_is_the_product_of_the_shape)."""
    model = build("Qwen3VLVisionModel")
    inputs = example_inputs(model)
    exporter = OnnxExporter()
    program = exporter.export(model, inputs)
    (report,) = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs], atol=exporter.default_atol)
    assert report.ok and report.max_abs_diff < 1e-4


def test_fix_ir_unregistered_constants(tmp_path: Path) -> None:
    """A Clip whose bounds the optimizer created but never registered: onnxruntime refuses the model
    until the fix registers them (a graph) or turns them into Constant nodes (a function)."""
    import onnxruntime as ort

    from hf_exporters.workarounds.onnx.ir_fixes import _fix_ir_unregistered_constants

    def clip_graph() -> tuple[ir.Graph, ir.Node]:
        x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([3]))
        low = ir.Value(name="x_min", const_value=ir.tensor(np.array(-1.0, dtype=np.float32), name="x_min"))
        taken = ir.Value(name="x_min", const_value=ir.tensor(np.array(0.0, dtype=np.float32), name="x_min"))
        high = ir.Value(name="x_max_1", const_value=ir.tensor(np.array(2.0, dtype=np.float32), name="x_max_1"))
        clip = ir.node("Clip", [x, low, high])
        clip.outputs[0].name, clip.outputs[0].type, clip.outputs[0].shape = "y", ir.TensorType(ir.DataType.FLOAT), ir.Shape([3])
        graph = ir.Graph([x], clip.outputs, nodes=[clip], initializers=[taken], opset_imports={"": 18})
        return graph, clip

    graph, clip = clip_graph()
    path = tmp_path / "clip.onnx"
    ir.save(ir.Model(graph, ir_version=10), path)
    with pytest.raises(Exception, match=r"Node input 'x_max_1' is not a graph input, initializer, or output of a previous node"):
        ort.InferenceSession(str(path))
    assert _fix_ir_unregistered_constants(graph) == 2
    assert _fix_ir_unregistered_constants(graph) == 0
    assert sorted(graph.initializers) == ["x_max_1", "x_min", "x_min_1"] and clip.inputs[1].name == "x_min_1"
    ir.save(ir.Model(graph, ir_version=10), path)
    (y,) = ort.InferenceSession(str(path)).run(None, {"x": np.array([-5.0, 0.5, 5.0], dtype=np.float32)})
    assert y.tolist() == [-1.0, 0.5, 2.0]
    # in a function the bounds become Constant nodes
    graph, clip = clip_graph()
    function = ir.Function("test", "clip_fn", graph=graph, attributes=[])
    assert _fix_ir_unregistered_constants(function) == 2
    assert [n.op_type for n in function] == ["Constant", "Constant", "Clip"]


class _Erfinv(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.erfinv(x)


def test_erfinv_translation(tmp_path: Path) -> None:
    """ONNX has no inverse error function: the translation's polynomial matches torch in float32,
    with torch's infinities at ±1 and NaN outside [-1, 1]."""
    model = _Erfinv()
    inputs = {"x": torch.cat([torch.linspace(-0.999999, 0.999999, 2001), torch.tensor([-1.0, 1.0, 0.0, 1.5, 0.9999999])])}
    with without_workarounds("_aten_erf_inv"):
        with pytest.raises(ExportStageError, match="No ONNX function found for <OpOverload\\(op='prims.erf_inv'"):
            OnnxExporter().export(model, inputs)
    exporter = OnnxExporter()
    run = exporter.load_runner(exporter.save(exporter.export(model, inputs), tmp_path))
    got, want = torch.as_tensor(run(inputs)[0]), torch.erfinv(inputs["x"])
    finite = torch.isfinite(want)
    assert float(((got - want).abs() / want.abs().clamp_min(1e-6))[finite].max()) < 1e-6
    assert got[-5:-3].tolist() == [float("-inf"), float("inf")] and got[-2].isnan()


class _CountPerExpert(torch.nn.Module):
    """One expert: transformers' grouped_mm experts count tokens with histc(min=0, max=0)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.histc(ids.float(), bins=1, min=0, max=0) * 2 + torch.histc(ids.float(), bins=3, min=0, max=2)


def test_patch_histc_equal_bounds(tmp_path: Path) -> None:
    from hf_exporters.workarounds.onnx.torch_patches import _patch_histc_equal_bounds

    ours = _patch_histc_equal_bounds(torch.histc)
    data = torch.tensor([0.0, 0.0, 1.5, 2.0, 3.0])
    for bins, low, high in ((1, 0, 0), (3, 2, 2), (1, 3, 3), (4, 0, 3)):  # equal bounds: the data's range
        assert torch.equal(ours(data, bins=bins, min=low, max=high), torch.histc(data, bins=bins, min=low, max=high))
    model, inputs = _CountPerExpert(), {"ids": torch.tensor([0, 0, 2, 1, 2, 0])}
    with without_workarounds("_patch_histc_equal_bounds"):
        with pytest.raises(ExportStageError, match=r"aten_histc with min == max \(0.0\) is not supported"):
            OnnxExporter().export(model, inputs)
    exporter = OnnxExporter()
    run = exporter.load_runner(exporter.save(exporter.export(model, inputs), tmp_path))
    (report,) = check_parity(model, run, [inputs], atol=0)
    assert report.ok and torch.as_tensor(run(inputs)[0]).tolist() == [15.0, 13.0, 14.0]  # 6 * 2 + [3, 1, 2]


class _RepeatPerFrame(torch.nn.Module):
    """InstructBLIP-Video's pattern: each row repeated once per video frame, the count a size of another input."""

    def __init__(self, dim: int | None, count: int | None = None) -> None:
        super().__init__()
        self.dim, self.count = dim, count

    def forward(self, x: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(self.count or frames.shape[1], dim=self.dim) * 2


@pytest.mark.parametrize("dim, shape, count", [(0, (2, 3), None), (1, (2, 3, 4), None), (-1, (2, 3, 4), None), (None, (2, 3), None), (1, (2, 3), 3)])
def test_repeat_interleave_by_a_symbolic_count(tmp_path: Path, dim: int | None, shape: tuple[int, ...], count: int | None) -> None:
    """``repeat_interleave`` by a count read from another input's dynamic size (and by a fixed int):
    onnxruntime matches eager on sizes other than the traced ones. torchlib's own translation puts the
    count on the wrong axis: with batch == count the rows are neither repeated nor interleaved."""
    from hf_exporters.pipeline import make_config

    model = _RepeatPerFrame(dim, count)
    inputs = {"x": torch.randn(*shape), "frames": torch.zeros(2, 2)}
    others = [{"x": torch.randn(b, *shape[1:]), "frames": torch.zeros(2, f)} for b, f in ((2, 2), (3, 2), (2, 5))]
    if count is None:
        exporter = OnnxExporter()
        with without_workarounds("_aten_repeat_interleave_symbolic_repeats"):
            program = exporter.export(model, inputs, make_config(exporter, True, None))
        run = exporter.load_runner(exporter.save(program, tmp_path / "torchlib"))
        if dim == 0:  # batch == count: rows come back unrepeated
            assert tuple(run(others[0])[0].shape) == (2, 3) and tuple(model(**others[0]).shape) == (4, 3)
        with pytest.raises(Exception, match="running Expand node.*invalid expand shape"):
            run(others[1 if dim == 0 else 0])
    exporter = OnnxExporter()
    program = exporter.export(model, inputs, make_config(exporter, True, None))
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path / "ours")), others, atol=1e-6)
    assert [r.ok for r in reports] == [True] * 3 and max(r.max_abs_diff for r in reports) == 0.0


class _RemainderByWindow(torch.nn.Module):
    """Each position's place in a window whose size is read from the data (a SymInt scalar), or a fixed int."""

    def __init__(self, fixed: int | float | None = None) -> None:
        super().__init__()
        self.fixed = fixed

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        window = self.fixed if self.fixed is not None else lengths.max().item()
        if self.fixed is None:
            torch._check(window > 0)
        return x % window


@pytest.mark.parametrize(
    "dtype, fixed", [(torch.int64, None), (torch.int64, 3), (torch.int64, -3), (torch.float32, 2.5), (torch.float32, None)]
)
def test_remainder_by_a_symbolic_scalar(tmp_path: Path, dtype: torch.dtype, fixed: float | None) -> None:
    """``x % n`` with ``n`` read from the data: torchlib refuses the symbolic scalar; our translation gives
    eager's values (negative numbers included: the sign follows the divisor) for other data."""
    model = _RemainderByWindow(fixed)
    x = (torch.arange(-7, 9) * (1 if dtype == torch.int64 else 0.3)).to(dtype)  # floats not exact in binary
    inputs = {"x": x, "lengths": torch.tensor([3, 5, 4])}
    if fixed is None and dtype == torch.int64:
        with without_workarounds("_aten_remainder_symbolic_scalar"):
            with pytest.raises(ExportStageError, match="int\\(\\) argument must be a string, a bytes-like object or a real number, not 'SymbolicTensor'"):
                OnnxExporter().export(model, inputs)
    exporter = OnnxExporter()
    run = exporter.load_runner(exporter.save(exporter.export(model, inputs), tmp_path))
    for lengths in ([3, 5, 4], [2, 7, 1], [4, 4, 4]):
        other = {"x": x, "lengths": torch.tensor(lengths)}
        got = torch.as_tensor(run(other)[0])
        assert got.dtype == dtype and torch.equal(got, model(**other)), (lengths, got)


class _SmallEpsilons(torch.nn.Module):
    """An RMS norm with eps 1e-8 and a normalisation with eps 1e-15, beside an exact ``+ 0`` and ``* 1``."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8)
        shares = x.abs() / (x.abs().sum(-1, keepdim=True) + 1e-15)
        return normed, shares, (x + 0.0) * 1.0


def test_optimizer_keeps_small_epsilons_and_drops_exact_no_ops(tmp_path: Path) -> None:
    """onnxscript's no-op rules match ``x + 0`` with abs_tol 1e-8, so ``+ 1e-8`` and ``+ 1e-15`` were
    removed: an RMS norm of small activations lost its epsilon and an all-zero row divided 0 by 0.
    With exact constants the epsilons stay, eager's numbers come back, and exact no-ops still go."""
    x = torch.randn(2, 4, 16) * 1e-4
    x[0, 0] = 0.0  # an all-zero row: eager gives 0 / 1e-15 = 0 and rsqrt(1e-8) * 0 = 0
    inputs = {"x": x}

    def exported(workaround: str | None) -> tuple[Any, Any]:
        exporter = OnnxExporter()
        if workaround is None:
            program = exporter.export(_SmallEpsilons().eval(), inputs)
        else:
            with without_workarounds(workaround):
                program = exporter.export(_SmallEpsilons().eval(), inputs)
        directory = tmp_path / (workaround or "fixed")
        return program, exporter.load_runner(exporter.save(program, directory))

    model = _SmallEpsilons().eval()
    _, broken = exported("_patch_no_op_rules_exact_constants")
    with pytest.raises(ParityError, match=re.escape("0: NaN/inf where eager is finite; 1: NaN/inf where eager is finite")):
        check_parity(model, broken, [inputs], atol=1e-4)

    program, runner = exported(None)
    (report,) = check_parity(model, runner, [inputs], atol=1e-4)
    assert report.ok and report.max_abs_diff < 1e-5
    ops = [node.op_type for node in program.model.graph]
    assert ops.count("Add") == 2  # the two epsilons; the exact + 0 is gone
    assert ops.count("Mul") == 1  # x * rsqrt(...); the exact * 1 is gone


class _MimiConvStack(torch.nn.Module):
    """Two of Mimi's padded Conv1d layers (strided, causal, then not) as the tiny Mimi of tests/configs/MimiModel.json has them."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import MimiConfig
        from transformers.models.mimi.modeling_mimi import MimiConv1d

        config = MimiConfig(use_causal_conv=True)
        self.strided = MimiConv1d(config, 4, 8, kernel_size=8, stride=4)
        self.plain = MimiConv1d(config, 8, 8, kernel_size=3)
        self.plain.causal = False

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.plain(self.strided(audio))


class _CeilDividesLength(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = -((3 - x.shape[-1]) // 2)  # ceil((length - 3) / 2), a negative floor division
        return x[..., :frames] * 2


def test_floor_division_of_sizes_rounds_down_for_negative_values(tmp_path: Path) -> None:
    """torchlib translates ``operator.floordiv`` of sizes to ONNX Div, which truncates: exported at
    length 8, the program keeps 1 column at length 6 where eager keeps 2. The translation rounds down."""
    inputs = {"x": torch.randn(2, 8)}
    others = [{"x": torch.randn(3, 6)}, {"x": torch.randn(2, 11)}]
    with without_workarounds("_aten_sym_floordiv"):
        exporter = OnnxExporter()
        runner_ = exporter.load_runner(exporter.save(exporter.export(_CeilDividesLength(), inputs, OnnxConfig(dynamic=True)), tmp_path / "torchlib"))
        with pytest.raises(ParityError, match=re.escape("output : artifact shape (3, 1) != eager shape (3, 2)")):
            check_parity(_CeilDividesLength(), runner_, others, atol=1e-6)
    exporter = OnnxExporter()
    runner_ = exporter.load_runner(exporter.save(exporter.export(_CeilDividesLength(), inputs, OnnxConfig(dynamic=True)), tmp_path / "ours"))
    reports = check_parity(_CeilDividesLength(), runner_, [inputs, *others], atol=1e-6)
    assert [r.ok for r in reports] == [True] * 3


def test_int_conv_padding_gives_the_frame_count_of_every_length(tmp_path: Path) -> None:
    """Mimi's padded convolutions, with the padding patch, divide sizes without a negative floor
    division. Exported for one length, the program matches eager on others, frame count included."""
    torch.manual_seed(0)
    model = _MimiConvStack().eval()
    inputs = {"audio": torch.randn(2, 4, 24)}
    exporter = OnnxExporter()
    runner_ = exporter.load_runner(exporter.save(exporter.export(model, inputs, OnnxConfig(dynamic=True)), tmp_path))
    others = [{"audio": torch.randn(3, 4, n)} for n in (5, 8, 37)]
    reports = check_parity(model, runner_, [inputs, *others], atol=1e-5)
    assert [r.ok for r in reports] == [True] * 4
    assert [model(**x).shape[-1] for x in others] == [2, 2, 10]


def _halves_and_a_long_chain(length: int) -> ir.Model:
    """X (2, 8) cut into halves by two Slices (what ``SlicesSplit`` looks for), and a chain of ``length``
    Sin nodes."""
    import onnx

    chain = "\n".join(f"    n{i + 1} = Sin(n{i})" for i in range(length))
    text = f"""<ir_version: 10, opset_import: ["" : 18]>
agraph (float[2, 8] X) => (float[2, 4] A, float[2, 4] B, float[2, 8] Y) {{
    zero = Constant<value = int64[1] {{0}}>()
    half = Constant<value = int64[1] {{4}}>()
    full = Constant<value = int64[1] {{8}}>()
    last = Constant<value = int64[1] {{-1}}>()
    A = Slice(X, zero, half, last)
    B = Slice(X, half, full, last)
    n0 = Identity(X)
{chain}
    Y = Identity(n{length})
}}"""
    return ir.serde.deserialize_model(onnx.parser.parse_model(text))


def test_multi_output_rewrite_does_not_walk_the_graph_per_node(monkeypatch):
    """``_patch_multi_output_match_checks_the_first_node_first``: ``SlicesSplit`` (two Slices -> one Split) indexed the whole graph at every node it was tried
    on; with the patch only the Slice nodes pay that walk, and the optimized graph is the same."""
    import onnxscript.optimizer

    walks = []
    graph_iter = ir.Graph.__iter__
    monkeypatch.setattr(ir.Graph, "__iter__", lambda self: walks.append(1) or graph_iter(self))

    def optimize(patched: bool) -> tuple[int, list[str]]:
        model = _halves_and_a_long_chain(400)
        walks.clear()
        if patched:
            with registry.apply_patches("onnx", select=lambda p: p.startswith("onnxscript.rewriter._matcher")):
                onnxscript.optimizer.optimize_ir(model)
        else:
            onnxscript.optimizer.optimize_ir(model)
        return len(walks), [node.op_type for node in model.graph]

    plain_walks, plain_ops = optimize(patched=False)
    patched_walks, patched_ops = optimize(patched=True)
    assert patched_ops == plain_ops and plain_ops.count("Sin") == 400
    assert plain_walks > 400 > 40 > patched_walks  # one walk per node tried before, a handful now


def test_selective_scan_exports_as_an_onnx_scan_with_a_dynamic_length(tmp_path: Path) -> None:
    """Mamba's selective scan, a scan op after the Dynamo patch, becomes an ONNX ``Scan`` whose length
    follows the input: onnxruntime matches eager at the export length and at a longer one."""
    model = build("FalconMambaModel")
    inputs = example_inputs(model)
    exporter = OnnxExporter()
    result = exporter.run(model, inputs, OnnxConfig(dynamic=True))
    program = result.program
    assert result.static_axes == []
    assert sum(node.op_type == "Scan" for node in program.model.graph.all_nodes()) == model.config.num_hidden_layers
    other = resized_inputs(result.exported_program, inputs)
    assert other["input_ids"].shape[1] > inputs["input_ids"].shape[1]
    reports = check_parity(model, exporter.load_runner(exporter.save(program, tmp_path)), [inputs, other], atol=exporter.default_atol)
    assert [r.ok for r in reports] == [True, True]
    assert max(r.max_abs_diff for r in reports) < 1e-5


class _ThreeStreams(torch.nn.Module):
    """ProphetNet's pattern: one sequence holding three streams, cut with ``chunk`` along a dynamic axis."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        main, first, second = x.chunk(3, dim=1)
        return main * 2 + first - second


def test_split_by_a_size_known_at_run_time_survives_constant_folding(tmp_path: Path) -> None:
    """``chunk`` along a dynamic axis splits by a size computed in the graph (``SplitToSequence`` with a
    0-d split); onnxscript's folding of it fails the whole optimize step without the patch. With it the
    node stays, and onnxruntime matches eager at two lengths."""
    inputs = {"x": torch.randn(2, 12, 4)}
    with without_workarounds("_patch_split_to_sequence_folding_skips_a_runtime_split"):
        with pytest.raises(ExportStageError, match=r"lowering \(torch.onnx.export\) failed: PassError"):
            OnnxExporter().export(_ThreeStreams(), inputs, OnnxConfig(dynamic=True))
    exporter = OnnxExporter()
    program = exporter.export(_ThreeStreams(), inputs, OnnxConfig(dynamic=True))
    assert [n.op_type for n in program.model.graph.all_nodes()].count("SplitToSequence") == 1
    static = OnnxExporter().export(_ThreeStreams(), inputs, OnnxConfig(dynamic=False))
    assert "SplitToSequence" not in [n.op_type for n in static.model.graph.all_nodes()]  # a known split still folds
    runner = exporter.load_runner(exporter.save(program, tmp_path))
    reports = check_parity(_ThreeStreams(), runner, [inputs, {"x": torch.randn(3, 21, 4)}], atol=1e-6)
    assert [r.ok for r in reports] == [True, True]
    assert max(r.max_abs_diff for r in reports) == 0.0


class _ReturnsItsSides(torch.nn.Module):
    """A model that returns the sides of its feature map next to it, as MaskFormer's Swin backbone does."""

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        pooled = torch.nn.functional.avg_pool2d(x, 2)
        return {"pooled": pooled, "sides": (pooled.shape[-2], pooled.shape[-1]), "total": pooled.sum(-1), "stride": 2}


def test_size_outputs_are_not_onnx_outputs(tmp_path: Path) -> None:
    """``_patch_output_node_constants``: sizes a model returns are Python ints in eager and constants in a static export; a dynamic export
    leaves them out of the ONNX outputs too, next to a size that stays constant, so both exports have
    eager's tensor outputs, in order."""
    inputs = {"x": torch.randn(2, 3, 8, 10)}
    for dynamic in (False, True):
        exporter = OnnxExporter()
        result = exporter.run(_ReturnsItsSides(), inputs, OnnxConfig(dynamic=dynamic))
        program = result.program
        kinds = [type(s.arg).__name__ for s in result.exported_program.graph_signature.output_specs]
        sides = "SymIntArgument" if dynamic else "ConstantArgument"
        assert kinds == ["TensorArgument", sides, sides, "TensorArgument", "ConstantArgument"]
        assert [o.name for o in program.model.graph.outputs] == ["pooled", "total"]
        runner = exporter.load_runner(exporter.save(program, tmp_path / str(dynamic)))
        others = [{"x": torch.randn(3, 3, 12, 6)}] if dynamic else []
        reports = check_parity(_ReturnsItsSides(), runner, [inputs, *others], atol=1e-6)
        assert all(r.ok and r.max_abs_diff < 1e-6 for r in reports) and len(reports) == 1 + dynamic


def test_int64_hash_arithmetic_is_exact_in_onnxruntime(tmp_path) -> None:
    """A rolling polynomial hash (BLT: ``sum(token * prime ** i)`` in int64) wraps around in torch;
    onnxruntime's ``Pow`` and int64 ``ReduceSum`` go through float64 and saturate. With the exact
    translations the hashes are equal, bit for bit, at the export length and a longer one."""

    class Hash(torch.nn.Module):
        def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
            prime = torch.tensor(1000000007, dtype=torch.int64)
            powers = prime ** torch.arange(tokens.shape[-1])
            return (tokens * powers).sum(-1), 31 ** tokens, tokens.sum(dim=(0, 1), keepdim=True), tokens**9 + tokens.shape[1] ** 2

    tokens = torch.randint(0, 260, (2, 5, 6))
    longer = torch.randint(0, 260, (3, 8, 6))
    expected = Hash()(tokens)
    assert expected[0].abs().max() > 2**62  # the hash does wrap around

    with without_workarounds("_aten_pow_integer_exact", "_aten_pow_scalar_integer_exact", "_aten_sum_int64_exact"):
        exporter = OnnxExporter()
        program = exporter.export(Hash(), {"tokens": tokens}, OnnxConfig(dynamic=False))
        got = exporter.load_runner(exporter.save(program, tmp_path / "plain"))({"tokens": tokens})
        assert not torch.equal(torch.as_tensor(got[0]), expected[0])

    exporter = OnnxExporter()
    program = exporter.export(Hash(), {"tokens": tokens}, OnnxConfig(dynamic=True))
    runner = exporter.load_runner(exporter.save(program, tmp_path / "exact"))
    for inputs in (tokens, longer):
        got = runner({"tokens": inputs})
        assert [torch.equal(torch.as_tensor(g), e) for g, e in zip(got, Hash()(inputs))] == [True] * 4


@pytest.mark.parametrize("batch_first", [False, True])
def test_lstm_size_rule_matches_the_kernel_shapes_and_strides(batch_first: bool) -> None:
    """The size-only rule for the kept ``aten.lstm.input`` gives the outputs torch's own kernel gives
    (bidirectional, two layers): shapes and strides, the batch-first output a transpose."""
    from hf_exporters.workarounds.onnx.torch_patches import _lstm_meta

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 3, num_layers=2, batch_first=batch_first, bidirectional=True)
    x = torch.randn(2, 5, 4) if batch_first else torch.randn(5, 2, 4)
    h0, c0 = torch.zeros(4, 2, 3), torch.zeros(4, 2, 3)
    args = (x, (h0, c0), list(lstm._flat_weights), True, 2, 0.0, False, True, batch_first)
    kernel = torch.ops.aten.lstm.input(*args)
    rule = _lstm_meta(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args[:1]], (h0.to("meta"), c0.to("meta")), *args[2:])
    assert [(tuple(t.shape), t.stride()) for t in rule] == [(tuple(t.shape), t.stride()) for t in kernel]
    assert tuple(rule[0].shape) == ((2, 5, 6) if batch_first else (5, 2, 6))
    assert all(t.device.type == "meta" for t in rule)
