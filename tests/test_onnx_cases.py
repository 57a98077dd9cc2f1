"""The public-report cases of ../shared/cases/cases.yaml that list the onnx backend.

Each case (built in ``case_models``: tiny config, trigger fields kept) is exported ONCE with
:class:`OnnxExporter`, saved, and every ``run_with`` input runs in onnxruntime (CPU), each output
compared with eager PyTorch (atol 1e-3, every element, NaN where eager has none is a failure).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from case_models import CASES as ALL_CASES
from case_models import h5_bert_masked_row, h6_swin, unexpected_static

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("onnxruntime", reason="the ONNX tests need the onnx extra")
pytest.importorskip("onnxscript", reason="the ONNX tests need the onnx extra")

from hf_exporters import OnnxConfig  # noqa: E402
from hf_exporters.exporters.onnx import OnnxExporter  # noqa: E402
from hf_exporters.runtime import check_parity  # noqa: E402
from hf_exporters.known_issues import skip_reason  # noqa: E402
from hf_exporters.shapes import tensor_leaves  # noqa: E402

ATOL = 1e-3
CASES = {k: ALL_CASES[k] for k in ("H1", "H2", "H3", "H5", "H6", "H7", "H8", "H11", "H15")}

#: cases that cannot pass yet: their reason is the EXPORT_SKIPS entry (the model-side change needed)
XFAIL: dict[str, str] = {"H11": skip_reason("Qwen2VLForConditionalGeneration", "onnx", False)}


def _params() -> list[Any]:
    return [
        pytest.param(cid, marks=pytest.mark.xfail(strict=True, reason=XFAIL[cid])) if cid in XFAIL else cid
        for cid in CASES
    ]


@pytest.mark.parametrize("case_id", _params())
def test_case_onnx_parity(case_id: str, tmp_path: Any) -> None:
    model, input_sets, dynamic = CASES[case_id]()
    exporter = OnnxExporter()
    result = exporter.run(model, input_sets[0], OnnxConfig(dynamic=dynamic))
    program = result.program
    path = exporter.save(program, tmp_path)
    run = exporter.load_runner(path)

    # the ONNX graph inputs are exactly the user's tensor inputs: no buffer or constant leaks in (H8)
    assert run.input_names == [name for name, _ in tensor_leaves(input_sets[0])]
    if dynamic:
        # one export serves every size: no axis was specialised (H7)
        assert unexpected_static(result.static_axes, case_id) == []

    reports = check_parity(model, run, input_sets, atol=ATOL)
    assert len(reports) == len(input_sets)
    # graph outputs carry the model's output names (an updated cache gets the prefix "present.")
    assert [n.removeprefix("present.") for n in run.output_names] == [leaf.name for leaf in reports[0].leaves]
    for report in reports:
        assert report.ok, report.describe_failure()
        assert report.max_abs_diff <= ATOL
        assert not any(leaf.nonfinite for leaf in report.leaves)
    sizes = [r.input_shapes for r in reports]
    if dynamic and len(input_sets) > 1:  # the later inputs really had other sizes
        assert len({str(s) for s in sizes}) > 1


def test_h5_no_nan_in_fully_masked_row(tmp_path: Any) -> None:
    """The padding row that masks every key comes out finite, as in eager (onnxscript#2561)."""
    model, (inputs,), _ = h5_bert_masked_row()
    exporter = OnnxExporter()
    path = exporter.save(exporter.export(model, inputs, OnnxConfig()), tmp_path)
    hidden = exporter.load_runner(path)(inputs)[0]
    with torch.no_grad():
        eager = model(**inputs).last_hidden_state
    assert torch.isfinite(eager[1]).all()
    assert bool(torch.isfinite(torch.as_tensor(hidden[1])).all())
    assert float((torch.as_tensor(hidden[1]) - eager[1]).abs().max()) <= ATOL


def test_h6_swin_needs_view_as_reshape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the FX node fix (re-run after decomposition by the Stage 2 hook), torch.onnx's
    type-promotion pass fails on Swin's window attention view (pytorch/pytorch#141107)."""
    from hf_exporters import registry
    from hf_exporters.errors import ExportStageError

    monkeypatch.setattr(registry, "_REGISTRY", [w for w in registry._REGISTRY if w.name != "_fix_view_as_reshape"])
    model, (inputs,), _ = h6_swin()
    with pytest.raises(ExportStageError) as info:
        OnnxExporter().export(model, inputs, OnnxConfig())
    assert info.value.stage == "lowering (torch.onnx.export)"
    assert "Cannot view a tensor with shape torch.Size([16, 4, 2, 8])" in str(info.value)
