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


@registry.register_onnx_ir_fix
def _fix_ir_unregistered_constants(graph_like: ir.Graph | ir.Function) -> int:
    """Give a home to constant node inputs that no node produces and no initializer holds.

    Pattern: the onnxscript optimizer's Relu/Clip fusion (``_fuse_relus_clips``) builds the fused
    ``Clip``'s bounds with ``op.initializer(..., name=f"{x}_min")``; when that name is taken (two
    fusions on the same input), the value is renamed ``{x}_min_1`` and never registered, so
    onnxruntime refuses the model: "Node input 'mul_8_min_1' is not a graph input, initializer, or
    output of a previous node". Such a value still carries its tensor (``const_value``); in a graph
    it is registered as an initializer of the (sub)graph holding its user, renamed if another value of
    the model has its name; in a function (which has no initializers) it becomes the output of a
    ``Constant`` node placed before each user.
    Models: Gemma4AudioModel (onnx static in the sweep).
    Upstream: microsoft/onnxscript rewriter/rules/common/_fuse_relus_clips.py (``op.initializer`` with
        a fixed name; no report found)
    Remove when: the optimizer registers every initializer it creates.
    """
    top = graph_like if isinstance(graph_like, ir.Graph) else graph_like.graph
    taken = {v.name for n in ir.traversal.RecursiveGraphIterator(top) for v in (*n.inputs, *n.outputs) if v is not None}
    taken |= {v.name for v in top.inputs} | set(top.initializers)
    changed = 0
    for node in list(ir.traversal.RecursiveGraphIterator(top)):
        for index, value in enumerate(node.inputs):
            if value is None or value.const_value is None or value.producer() is not None:
                continue
            if value.is_graph_input() or value.is_initializer():
                continue
            graph = node.graph
            if isinstance(graph_like, ir.Graph) and graph is not None:
                if any(v is value for v in graph.initializers.values()):
                    continue
                base, suffix = value.name or "constant", 0
                while value.name is None or (value.name in taken and not _only_user_is_stray(top, value)):
                    suffix += 1
                    value.name = f"{base}_{suffix}"
                taken.add(value.name)
                graph.register_initializer(value)
            else:
                constant = ir.node("Constant", [], attributes={"value": value.const_value})
                node.graph.insert_before(node, constant)
                node.replace_input_with(index, constant.outputs[0])
            changed += 1
    return changed


def _only_user_is_stray(graph: ir.Graph, value: ir.Value) -> bool:
    """Whether every value named like ``value`` in ``graph`` (nested graphs included) is ``value``."""
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for other in (*node.inputs, *node.outputs):
            if other is not None and other is not value and other.name == value.name:
                return False
    return all(v is value for v in (*graph.inputs, *graph.initializers.values()) if v.name == value.name)
