"""``_fix_drop_tensor_data_checks`` (workarounds/_data_checks.py) on the smallest graph that holds a check
on tensor data: ``torch._check_tensor_all`` traces to ``_is_all_true(cond).item()`` and three
``_assert_scalar`` nodes, the shape of transformers' ``torch_compilable_check`` in
``get_placeholder_mask``."""

from __future__ import annotations

import pytest
import torch

from hf_exporters import ExecutorchExporter, ExportStageError, OnnxExporter
from hf_exporters.runtime import check_parity
from workaround_helpers import without_workarounds

pytest.importorskip("onnxruntime", reason="the ONNX half runs the program in onnxruntime")
pytest.importorskip("executorch", reason="the ExecuTorch half runs the program in executorch.runtime")

FIX = "_fix_drop_tensor_data_checks"


class _ChecksItsIds(torch.nn.Module):
    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        torch._check_tensor_all(ids >= 0, lambda: "negative ids")
        return x * 2 + ids.unsqueeze(-1).float()


INPUTS = {"x": torch.randn(2, 3, generator=torch.Generator().manual_seed(0)), "ids": torch.tensor([1, 2])}
REFUSALS = {
    OnnxExporter: r"No ONNX function found for <OpOverload\(op='aten._is_all_true'",
    ExecutorchExporter: r"SpecViolationError: Operator torch._ops.aten._is_all_true.default is not in Core ATen opset",
}


@pytest.mark.parametrize("exporter_class", [OnnxExporter, ExecutorchExporter], ids=["onnx", "executorch"])
def test_checks_on_tensor_data_are_dropped(exporter_class, tmp_path):
    with without_workarounds(FIX):
        with pytest.raises(ExportStageError, match=REFUSALS[exporter_class]):
            exporter_class().export(_ChecksItsIds(), INPUTS)
    exporter = exporter_class()
    result = exporter.run(_ChecksItsIds(), INPUTS)
    assert FIX in [w.name for w in result.workarounds_fired]
    (report,) = check_parity(_ChecksItsIds(), exporter.load_runner(exporter.save(result.program, tmp_path)), [INPUTS], atol=1e-6)
    assert report.ok and report.max_abs_diff == 0.0
