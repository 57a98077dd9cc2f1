"""Lowering steps skipped where they find nothing to do (workarounds/executorch/lowering_speed.py).

The smallest models that show each: a 1-D convolution, ReLU and projection (XNNPACK's pass pipeline runs
the convolution and activation passes, skips the others), and the same export counted for its
decompositions. The ``.pte`` is the same program with and without the patches.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.runtime", reason="XNNPACK lowering needs the executorch extra")

from hf_exporters import ExecutorchConfig, ExecutorchExporter, ExportStageError  # noqa: E402
from hf_exporters.runtime.et_runner import ExecutorchRunner  # noqa: E402
from hf_exporters.workarounds.executorch import lowering_speed  # noqa: E402
from workaround_helpers import without_workarounds  # noqa: E402

PASSES = "_patch_xnnpack_passes_skip_absent_operators"
DECOMPOSITION = "_patch_no_third_decomposition_when_nothing_is_left"


class ConvBlock(torch.nn.Module):
    """(B, 4, 16) -> Conv1d -> ReLU -> mean over length -> Linear -> (B, 8)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(4, 6, 3, padding=1)
        self.proj = torch.nn.Linear(6, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.conv(x)).transpose(1, 2)).tanh()


def _inputs() -> dict[str, torch.Tensor]:
    return {"x": torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(1))}


def _export_counting(monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, list[str], int]:
    """The ``.pte`` buffer, the XNNPACK passes that ran, and the number of ``run_decompositions`` calls."""
    from executorch.backends.xnnpack import _passes

    ran: list[str] = []
    decompositions = [0]
    transform = _passes._transform
    decompose = torch.export.ExportedProgram.run_decompositions

    def counting_transform(ep, *passes, **kwargs):
        ran.extend(type(p).__name__ for p in passes)
        return transform(ep, *passes, **kwargs)

    def counting_decompose(self, *args, **kwargs):
        decompositions[0] += 1
        return decompose(self, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(_passes, "_transform", counting_transform)  # the Stage 3 patch wraps this one
        patched.setattr(torch.export.ExportedProgram, "run_decompositions", counting_decompose)
        manager = ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig())
        buffer = manager.buffer
    return buffer, ran, decompositions[0]


def _check_parity(buffer: bytes) -> None:
    model = ConvBlock().eval()
    with torch.no_grad():
        want = model(**_inputs())
    got = ExecutorchRunner(buffer)(_inputs())[0]
    assert float(want.abs().max()) > 0.1  # the output carries signal
    assert float((got - want).abs().max()) < 1e-5


def test_xnnpack_passes_run_only_where_their_operators_are(monkeypatch):
    buffer, ran, _ = _export_counting(monkeypatch)
    with without_workarounds(PASSES):
        plain, ran_all, _ = _export_counting(monkeypatch)
    assert ran_all == list(lowering_speed.KNOWN_XNNPACK_PASSES)  # one partition, every pass
    # the convolution and activation-fusion passes still run; batch norm, PReLU, SDPA, ``mm`` to linear
    # (the partitioner keeps ``linear`` whole), ... do not
    assert {"Conv1dUnsqueezePass", "FuseActivationPass", "ConstPropPass"} <= set(ran)
    skipped = {"FuseBatchNormPass", "DecomposeBatchNorm", "PReLUReshapePass", "ConvertToSDPAPass", "ConvertToLinearPass"}
    assert not skipped & set(ran)
    assert len(ran) < len(ran_all)
    assert buffer == plain  # the same program
    _check_parity(buffer)


def test_third_decomposition_skipped_when_nothing_is_left(monkeypatch):
    buffer, _, calls = _export_counting(monkeypatch)
    with without_workarounds(DECOMPOSITION):
        plain, _, calls_all = _export_counting(monkeypatch)
    assert (calls, calls_all) == (2, 3)
    assert buffer == plain
    _check_parity(buffer)


def test_other_executorch_version_fails_naming_the_stage(monkeypatch):
    monkeypatch.setattr(lowering_speed, "_executorch_version", lambda: "9.0.0")
    with pytest.raises(ExportStageError, match="Stage 3: ExecuTorch patches.*written for executorch 1.4"):
        ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig())


def test_changed_xnnpack_pipeline_fails_naming_the_stage(monkeypatch):
    monkeypatch.setattr(lowering_speed, "KNOWN_XNNPACK_PASSES", lowering_speed.KNOWN_XNNPACK_PASSES[:-1])
    with pytest.raises(ExportStageError, match="Stage 3: ExecuTorch patches.*pass pipeline"):
        ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig())
