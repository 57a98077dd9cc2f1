"""hf-exporters: export Hugging Face transformers models to torch.export, ONNX and ExecuTorch."""

from __future__ import annotations

from . import workarounds as _workarounds  # noqa: F401  (registers the built-in workarounds)
from .config import DynamoConfig, ExecutorchConfig, OnnxConfig
from .errors import ExportStageError, HfExportersError, MissingDependencyError, ParityError
from .exporters.dynamo import DynamoExporter
from .registry import (
    apply_fx_node_fixes,
    apply_fx_program_fixes,
    apply_patches,
    register_fx_node_fix,
    register_fx_program_fix,
    register_patch,
)

__version__ = "0.1.0"

__all__ = [
    "DynamoConfig",
    "DynamoExporter",
    "ExecutorchConfig",
    "ExportStageError",
    "HfExportersError",
    "MissingDependencyError",
    "OnnxConfig",
    "ParityError",
    "apply_fx_node_fixes",
    "apply_fx_program_fixes",
    "apply_patches",
    "register_fx_node_fix",
    "register_fx_program_fix",
    "register_patch",
]
