"""OnnxExporter Stage 5: ONNX IR fixes (``register_onnx_ir_fix``), run on the main graph and every
function of the finished ``onnx_ir`` model. Each returns the number of nodes it changed."""

from __future__ import annotations

from typing import Any

import numpy as np
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


@registry.register_onnx_ir_fix
def _fix_ir_dead_softmax_nan_guard(graph_like: ir.Graph | ir.Function) -> int:
    """Drop ``Where(IsNaN(p), 0, p)`` after ``p = Softmax(scores + mask)`` when the mask is finite.

    Pattern: torchlib lowers ``scaled_dot_product_attention`` with a boolean mask (opsets below 23)
    as ``Softmax(QK^T + Where(mask, 0, dtype.min))`` followed by ``Where(IsNaN(p), 0, p)``, a guard
    meant for rows whose every key is masked. The fill is the dtype's finite minimum, not ``-inf``,
    so such a row has a finite maximum and its softmax is never NaN: the guard changes nothing (a
    fully masked row comes out as the mean of the values either way) and costs an elementwise pass
    over every (batch, head, query, key) weight in every layer (21.6 ms a run of all-MiniLM-L6-v2
    at batch 8, sequence 128, on 2 CPU cores). The guard is dropped only when the added mask is a
    ``Where`` whose two branches are finite constants (or a finite constant itself); a NaN the
    scores themselves carry (an overflow in the model) then reaches the output as in eager.
    Models: every encoder exported at opsets 18-22 with SDPA attention and a padding mask (BertModel,
    all-MiniLM-L6-v2, RobertaModel, ...).
    Upstream: microsoft/onnxscript function_libs/torch_lib/ops/nn.py
        ``_aten_scaled_dot_product_attention_bool_mask_onnx`` (guard written for an ``-inf`` fill,
        pytorch/pytorch#103749; no report of it being dead)
    Remove when: torchlib emits the guard only for a non-finite fill, or opsets below 23 are no longer exported.
    """
    top = graph_like if isinstance(graph_like, ir.Graph) else graph_like.graph
    changed = 0
    for node in list(ir.traversal.RecursiveGraphIterator(top)):
        if node.op_type != "Where" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 3:
            continue
        condition, fill, probabilities = node.inputs
        guard = condition.producer() if condition is not None else None
        if guard is None or guard.op_type != "IsNaN" or guard.inputs[0] is not probabilities:
            continue
        if not _is_constant_satisfying(fill, lambda t: not t.any()):
            continue
        softmax = probabilities.producer() if probabilities is not None else None
        if softmax is None or softmax.op_type != "Softmax" or softmax.domain not in ("", "ai.onnx"):
            continue
        add = softmax.inputs[0].producer() if softmax.inputs[0] is not None else None
        if add is None or add.op_type != "Add" or not any(_is_finite_mask(v) for v in add.inputs):
            continue
        output = node.outputs[0]
        if output.is_graph_output():
            continue
        output.replace_all_uses_with(probabilities)
        node.graph.remove(node, safe=True)
        if not condition.uses():
            guard.graph.remove(guard, safe=True)
        changed += 1
    return changed


def _is_constant_satisfying(value: ir.Value | None, accept: Any) -> bool:
    """Whether ``value`` is a constant whose array satisfies ``accept``."""
    if value is None:
        return False
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return False
    return bool(accept(tensor.numpy()))


def _is_finite_mask(value: ir.Value | None) -> bool:
    """Whether ``value`` is finite everywhere by construction: a finite constant, or ``Where(c, a, b)``
    with finite constants ``a`` and ``b``."""
    finite = lambda array: bool(np.isfinite(array).all())  # noqa: E731
    if value is None:
        return False
    if _is_constant_satisfying(value, finite):
        return True
    producer = value.producer()
    return (
        producer is not None
        and producer.op_type == "Where"
        and producer.domain in ("", "ai.onnx")
        and all(_is_constant_satisfying(branch, finite) for branch in producer.inputs[1:])
    )
