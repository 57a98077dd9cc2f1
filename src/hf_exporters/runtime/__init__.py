"""Run exported artifacts in their real runtime and compare them with eager PyTorch."""

from .compare import LeafDiff, ParityReport, check_parity, compare_leaves, eager_outputs, resized_inputs
from .torch_runner import ExportedProgramRunner

__all__ = [
    "ExportedProgramRunner",
    "LeafDiff",
    "ParityReport",
    "check_parity",
    "compare_leaves",
    "eager_outputs",
    "resized_inputs",
]
