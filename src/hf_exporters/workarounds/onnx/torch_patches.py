"""OnnxExporter Stage 1: torch patches (``register_patch("onnx", "torch....")``), active for the trace
and the lowering."""

from __future__ import annotations
