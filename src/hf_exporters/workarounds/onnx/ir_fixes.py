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


def _literal_zero_reshape(node: ir.Node) -> bool:
    """Whether every 0 in ``node``'s constant target shape can only mean a size-0 axis."""
    if len(node.inputs) < 2 or node.inputs[1] is None or node.inputs[1].const_value is None:
        return False
    shape = [int(v) for v in node.inputs[1].const_value.numpy().reshape(-1)]
    if 0 not in shape or -1 in shape:  # allowzero=1 forbids a 0 next to a -1
        return False
    source = node.inputs[0].shape if node.inputs[0] is not None else None
    for position, size in enumerate(shape):
        if size != 0:
            continue
        if source is None:
            return False
        if position < len(source) and source[position] != 0:  # "copy axis i" could be meant
            return False
    return True


@registry.register_onnx_ir_fix
def _fix_ir_reshape_to_empty_axis(graph_like: ir.Graph | ir.Function) -> int:
    """Set ``allowzero=1`` on a ``Reshape`` whose constant target shape holds a size-0 axis.

    Pattern: a projection split into parts one of which is empty (GLM-5 Next's ``qk_rope_head_dim =
    0``: ``q.split([nope, rope])`` then ``rope.view(b, s, h, 0)``). In torch a 0 in a view shape is
    a size-0 axis; torch.onnx emits ``Reshape`` with the default ``allowzero=0``, where 0 means "copy
    this axis from the input", and onnxruntime refuses the model when the input has no such axis
    ("Op (Reshape) [ShapeInferenceError] Invalid position of 0"). The fix only touches a Reshape whose
    every 0 is past the input's rank or faces an input axis that is itself 0, where both readings
    agree, and whose shape has no -1.
    Models: Glm5NextModel, Glm5NextTextModel (onnx in the sweep).
    Upstream: torch/onnx/_internal/exporter/_torchlib (aten_reshape lowers without allowzero in torch
        2.13; no report found); https://onnx.ai/onnx/operators/onnx__Reshape.html (allowzero)
    Remove when: torch.onnx lowers view/reshape with ``allowzero=1``.
    """
    changed = 0
    for node in ir.traversal.RecursiveGraphIterator(graph_like if isinstance(graph_like, ir.Graph) else graph_like.graph):
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx"):
            continue
        attribute = node.attributes.get("allowzero")
        if attribute is not None and attribute.as_int() == 1:
            continue
        if _literal_zero_reshape(node):
            node.attributes["allowzero"] = ir.AttrInt64("allowzero", 1)
            changed += 1
    return changed
