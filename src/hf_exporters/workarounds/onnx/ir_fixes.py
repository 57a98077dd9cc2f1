"""OnnxExporter Stage 5: ONNX IR fixes (``register_onnx_ir_fix``), run on the main graph and every
function of the finished ``onnx_ir`` model. Each returns the number of nodes it changed."""

from __future__ import annotations

import onnx_ir as ir

from ... import registry


@registry.register_onnx_ir_fix
def _fix_ir_topk_sorted(graph_like: ir.Graph | ir.Function) -> int:
    """Set ``sorted=1`` on every ``TopK`` node.

    Pattern: ``torch.topk(..., sorted=False)`` lowers to ``TopK(sorted=0)``, whose output order
    onnxruntime leaves unspecified (it differs between its CPU kernels), while eager CPU returns the
    values in descending order; any consumer that depends on the order (a router taking the first k,
    a gather by position) then differs from eager.
    Models: MoE routers and detection heads calling topk(sorted=False) (e.g. DeepseekV3ForCausalLM
    group-limited routing).
    Remove when: torch.onnx lowers topk(sorted=False) with sorted=1, or onnxruntime documents a descending order for sorted=0.
    Upstream: https://onnx.ai/onnx/operators/onnx__TopK.html (sorted=0 leaves the order undefined)
    """
    changed = 0
    for node in ir.traversal.RecursiveGraphIterator(graph_like if isinstance(graph_like, ir.Graph) else graph_like.graph):
        if node.op_type == "TopK" and node.domain in ("", "ai.onnx"):
            attribute = node.attributes.get("sorted")
            if attribute is not None and attribute.as_int() == 0:
                node.attributes["sorted"] = ir.AttrInt64("sorted", 1)
                changed += 1
    return changed
