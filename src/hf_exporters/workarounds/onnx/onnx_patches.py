"""OnnxExporter Stage 2: ONNX patches (``register_patch("onnx", "torch.onnx._internal....")``).

These hook torch.onnx internals; the exporter checks before applying them that torch is a version
they were written for and that every hooked attribute still exists, and fails with
``Stage 2: ONNX patches`` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import registry


@registry.register_patch("onnx", "torch.onnx._internal.exporter._fx_passes.decompose_with_registry")
def _patch_decompose_with_registry(original: Callable[..., Any]) -> Callable[..., Any]:
    """Re-run the ONNX FX node fixes on the graph ``run_decompositions`` returns.

    Pattern: ``torch.onnx`` decomposes the ExportedProgram (``ExportedProgram.run_decompositions``
    with its ONNX-friendly table) after the exporter's Stage 3 fixes ran; the decomposition brings
    back nodes those fixes remove (``aten.alias``, in-place views, dead comparisons) or introduces new
    ones, which then reach the lowering unrepaired.
    Models: every model whose graph the FX node fixes touch (e.g. SwinModel, GPT2Model, BertModel).
    Remove when: torch.onnx offers a post-decomposition pass hook, or the FX node fixes are all gone.
    Upstream: https://github.com/pytorch/pytorch/blob/v2.13.0/torch/onnx/_internal/exporter/_core.py
        (_prepare_exported_program_for_export offers no hook between decomposition and lowering)
    """

    def decompose_with_registry(exported_program: Any, onnx_registry: Any) -> Any:
        from ...exporters.onnx import record_decomposition_fixes

        decomposed = original(exported_program, onnx_registry)
        record_decomposition_fixes(registry.apply_fx_node_fixes("onnx", decomposed.graph_module))
        return decomposed

    return decompose_with_registry


@registry.register_patch("onnx", "torch.onnx._internal.exporter._core._handle_output_node")
def _patch_output_node_constants(original: Callable[..., Any]) -> Callable[..., Any]:
    """Leave Python numbers in the program's outputs out of the ONNX graph outputs, as ``None`` is.

    Pattern: a forward that returns sizes next to tensors (MaskFormerSwin's
    ``hidden_states_spatial_dimensions``, a tuple of ints per stage). torch.export keeps them as
    constant outputs of the program; torch.onnx's ``_handle_output_node`` skips ``None`` but reads
    ``.name`` of every other output and fails with "'int' object has no attribute 'name'". An ONNX
    graph output must be a tensor; the numbers are fixed by the trace, so the exported graph keeps the
    tensor outputs only, and :func:`hf_exporters.shapes.output_names` names those alone (the same
    leaves :func:`hf_exporters.shapes.tensor_leaves` gives of the eager output).
    Models: MaskFormerSwinModel (onnx in the sweep) and other backbones that return feature-map sizes.
    Upstream: torch/onnx/_internal/exporter/_core.py ``_handle_output_node`` in torch 2.13 (no report found)
    Remove when: torch.onnx skips or materialises constant outputs.
    """

    def handle_output_node(node: Any, node_name_to_values: Any, graph_like: Any) -> Any:
        import torch

        outputs, args = node.args[0], node.args
        if not (isinstance(outputs, (tuple, list)) and any(o is not None and not isinstance(o, torch.fx.Node) for o in outputs)):
            return original(node, node_name_to_values, graph_like=graph_like)
        node.args = (type(outputs)(o for o in outputs if o is None or isinstance(o, torch.fx.Node)), *args[1:])
        try:
            return original(node, node_name_to_values, graph_like=graph_like)
        finally:
            node.args = args  # the program's output node keeps matching its output specs

    return handle_output_node
