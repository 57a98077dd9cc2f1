"""OnnxExporter workarounds. Importing this package registers them.

Each workaround declares its stage where it is registered; the modules:

- ``torch_patches``: Stage 1, torch ops swapped for the trace and the lowering (and the trace's
  floor-division patch, registered for the lowering's decompositions too).
- ``onnx_patches``: Stage 2, torch.onnx and onnxscript internals (the FX node fixes re-run after
  decomposition, the optimizer's rules and folding).
- ``fx_node_fixes``: Stage 3, FX node rewrites.
- ``translations``: Stage 4, aten op -> onnxscript function.
- ``ir_fixes``: Stage 5, rewrites of the finished ONNX model.

The modules that build onnxscript functions or onnx_ir rewrites import those libraries; they are
loaded only when onnxscript is installed, so ``import hf_exporters`` works with the base install.
"""

from __future__ import annotations

import importlib.util

from . import fx_node_fixes as _fx_node_fixes  # noqa: F401
from . import onnx_patches as _onnx_patches  # noqa: F401
from . import torch_patches as _torch_patches  # noqa: F401

if importlib.util.find_spec("onnxscript") is not None and importlib.util.find_spec("onnx_ir") is not None:
    from . import ir_fixes as _ir_fixes  # noqa: F401
    from . import translations as _translations  # noqa: F401
