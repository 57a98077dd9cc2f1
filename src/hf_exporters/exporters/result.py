"""ExportResult: what one export produced and what happened on the way.

Every exporter's ``run(model, inputs, config)`` returns one; ``export()`` returns its ``program``.
The result, not the exporter, holds the facts an export derives (the dynamic shapes used, the axes
that ended static, the capture strategy, the workarounds that fired, stage times), so one exporter
can run many exports, and a reader (the pipeline, generation, the sweep) takes them from the export
it asked for.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..registry import Workaround
from ..shapes import ConstrainedAxis, StaticAxis


@dataclasses.dataclass
class ExportResult:
    """One export's artifact and facts.

    Attributes:
        program: the native artifact: a ``torch.export.ExportedProgram`` (dynamo), a
            ``torch.onnx.ONNXProgram`` (onnx) or an ``ExecutorchProgramManager`` (executorch).
        exported_program: the ``torch.export.ExportedProgram`` of the trace every backend starts from
            (for ONNX and ExecuTorch, as their FX fixes left it before lowering).
        dynamic_shapes: the ``dynamic_shapes`` passed to ``torch.export.export`` (``Dim.AUTO`` on every
            axis with ``dynamic=True``), or None for a static export.
        static_axes: every axis asked to be dynamic that ended static (``input[axis k] = size``), fixed
            in the placeholder or pinned by an input guard (then with the guard and its source line).
        constrained_axes: every axis asked to be dynamic that stayed symbolic but refuses size 1.
        capture_strategy: the name of the capture strategy that traced the program
            (:mod:`hf_exporters.exporters.capture`: ``"size-oblivious trace"`` or ``"plain trace"``).
        capture_errors: ``(strategy name, exception)`` of each strategy that failed before it, in order.
        size_oblivious: whether the trace ran under size-oblivious reasoning (a lowering that re-traces
            the program reasons the same way).
        workarounds_fired: the registered workarounds that acted during this export, in the order they
            first acted (see :func:`hf_exporters.registry.recording_fired`).
        stage_seconds: wall seconds per stage block, in the order they ran: the exporter's own
            ``Stage N: Title`` blocks, ``trace (torch.export.export)``, the lowering and serialisation
            where the backend has them; the ONNX and ExecuTorch exporters list the dynamo stages of their
            trace as ``dynamo: Stage N: Title``.
        partitions: ExecuTorch only: method name -> the number of delegated partitions (delegate call
            nodes) in its lowered program; None for other backends.
        optimized: ONNX only: whether the onnxscript optimizer ran; None for other backends.
        fx_fixes_applied: ONNX only: nodes the FX node fixes rewrote (traced and decomposed graphs).
        ir_fixes_applied: ONNX only: nodes the ONNX IR fixes changed.
    """

    program: Any
    exported_program: Any
    dynamic_shapes: Any = None
    static_axes: list[StaticAxis] = dataclasses.field(default_factory=list)
    constrained_axes: list[ConstrainedAxis] = dataclasses.field(default_factory=list)
    capture_strategy: str = ""
    capture_errors: list[tuple[str, BaseException]] = dataclasses.field(default_factory=list)
    size_oblivious: bool = False
    workarounds_fired: list[Workaround] = dataclasses.field(default_factory=list)
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    partitions: dict[str, int] | None = None
    optimized: bool | None = None
    fx_fixes_applied: int = 0
    ir_fixes_applied: int = 0

    def manifest_entries(self) -> dict[str, Any]:
        """The result's entries of ``export.json``: ``stage_seconds`` (seconds, rounded to 1 ms),
        ``capture_strategy``, ``workarounds_fired`` (``{name, kind, stage, target}`` each) and, for
        ExecuTorch, ``partitions``."""
        entries: dict[str, Any] = {
            "stage_seconds": {title: round(value, 3) for title, value in self.stage_seconds.items()},
            "capture_strategy": self.capture_strategy,
            "workarounds_fired": [
                {"name": w.name, "kind": w.kind, "stage": w.stage, "target": w.target} for w in self.workarounds_fired
            ],
        }
        if self.partitions is not None:
            entries["partitions"] = dict(self.partitions)
        return entries


def trace_stage_seconds(traced: ExportResult) -> dict[str, float]:
    """The stage times of a dynamo trace run inside another exporter's export: its ``Stage N`` blocks
    as ``dynamo: Stage N: Title``, the trace under its own title."""
    return {(f"dynamo: {title}" if title.startswith("Stage ") else title): value for title, value in traced.stage_seconds.items()}


__all__ = ["ExportResult", "trace_stage_seconds"]
