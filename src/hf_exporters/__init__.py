"""hf-exporters: export Hugging Face transformers models to torch.export, ONNX and ExecuTorch."""

from __future__ import annotations

from . import workarounds as _workarounds  # noqa: F401  (registers the built-in workarounds)
from .config import DynamoConfig, ExecutorchConfig, OnnxConfig
from .errors import ExportStageError, HfExportersError, MissingDependencyError, ParityError
from .exporters.dynamo import DynamoExporter, load_exported_program
from .exporters.result import ExportResult
from .registry import (
    apply_fx_node_fixes,
    apply_fx_program_fixes,
    apply_patches,
    register_fx_node_fix,
    register_fx_program_fix,
    register_patch,
)

__version__ = "0.1.0"

_LAZY = {
    "OnnxExporter": ("hf_exporters.exporters.onnx", "OnnxExporter"),
    "ExecutorchExporter": ("hf_exporters.exporters.executorch", "ExecutorchExporter"),
}


def __getattr__(name: str):
    # The ONNX and ExecuTorch exporters import their optional libraries; load them on first use so
    # `import hf_exporters` works with only the base install.
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'hf_exporters' has no attribute {name!r}")

__all__ = [
    "DynamoConfig",
    "DynamoExporter",
    "ExecutorchConfig",
    "ExecutorchExporter",
    "ExportResult",
    "ExportStageError",
    "HfExportersError",
    "MissingDependencyError",
    "OnnxConfig",
    "OnnxExporter",
    "ParityError",
    "apply_fx_node_fixes",
    "load_exported_program",
    "apply_fx_program_fixes",
    "apply_patches",
    "register_fx_node_fix",
    "register_fx_program_fix",
    "register_patch",
]
