"""OnnxExporter Stage 3: FX node fixes (``register_fx_node_fix("onnx")``).

Each fix is offered every ``call_function`` node of the traced graph (and again of the decomposed
graph, see Stage 2); it returns True when it replaced or erased the node.
"""

from __future__ import annotations

from typing import Any

import torch

from ... import registry
from .._data_checks import _fix_drop_tensor_data_checks

aten = torch.ops.aten

_VIEWS = (aten.view.default, aten._unsafe_view.default)


@registry.register_fx_node_fix("onnx")
def _fix_view_as_reshape(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replace ``aten.view`` / ``aten._unsafe_view`` with ``aten.reshape``.

    Pattern: a ``view`` of a transposed attention output (``sdpa(...).transpose(1, 2).reshape(b, n, -1)``).
    The trace and the decomposition see the SDPA output in the memory layout of its CPU kernel, where
    the transposed tensor is contiguous, so ``reshape`` becomes ``view``; torch.onnx's type-promotion
    pass re-runs the graph with fake tensors whose SDPA output is contiguous, and the ``view`` then
    fails with "Cannot view a tensor with shape ... and strides ...". ONNX has no strides: view and
    reshape both lower to ``Reshape``, and reshape never fails on a layout.
    A view to a size-0 axis is kept: onnxscript's ``aten_view`` emits ``Reshape(allowzero=1)`` and its
    ``aten_reshape`` a plain ``Reshape``, where onnxruntime reads the 0 as "copy this axis" ("Op (Reshape)
    [ShapeInferenceError] Invalid position of 0", Glm5NextModel with ``qk_rope_head_dim = 0``).
    Models: SwinModel (window attention), and any model reshaping a transposed SDPA output.
    Remove when: pytorch/pytorch#141107 is fixed in the torch version in use.
    Upstream: pytorch/pytorch#141107
    """
    if node.target not in _VIEWS or _is_complex(node.args[0]):  # complex views keep torchlib's complex ``view``
        return False
    if any(size == 0 for size in node.args[1] if isinstance(size, int)):
        # a size-0 axis (``rope.view(b, s, h, 0)`` when a head split leaves an empty part): torchlib lowers
        # ``view`` with allowzero=1 but ``reshape`` without it, where 0 would mean "copy this axis"
        return False
    node.target = aten.reshape.default
    return True


def _val(arg: object) -> torch.Tensor | None:
    """The example tensor the trace recorded for ``arg`` (None for a constant or a non-tensor)."""
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _is_complex(arg: object) -> bool:
    val = _val(arg)
    return val is not None and val.is_complex()


_PROVENANCE = ("stack_trace", "nn_module_stack", "source_fn_stack")


def _insert(graph: torch.fx.Graph, target: object, args: tuple, kwargs: dict | None, val: object, like: torch.fx.Node) -> torch.fx.Node:
    """A new ``call_function`` node (at the graph's insert point) with its example value and the
    source provenance of the node ``like`` it replaces."""
    new = graph.call_function(target, args, kwargs or {})
    new.meta["val"] = val
    new.meta.update({key: like.meta[key] for key in _PROVENANCE if key in like.meta})
    return new


#: shape ops torchlib translates for real tensors only, with how their arguments follow the (…, 2) real view
_COMPLEX_SHAPE_OPS = {
    aten.unsqueeze.default: "new axis",
    aten.select.int: "axis",
    aten.expand.default: "sizes",
    aten.reshape.default: "sizes",
}


@registry.register_fx_node_fix("onnx")
def _fix_complex_shape_ops(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Run ``unsqueeze``/``select``/``expand``/``reshape`` of a complex tensor on its real view.

    Pattern: rotary embeddings computed in complex numbers (``torch.polar`` frequencies,
    ``view_as_complex(q.reshape(..., -1, 2)) * freqs.unsqueeze(1)``). torch.onnx carries a complex
    tensor of shape S as a real tensor of shape (*S, 2) and needs a translation marked complex for every
    op that touches one; torchlib has them for ``view``, ``permute``, ``mul``, ``cat`` and others but
    not these four, so the lowering fails with "No ONNX function found for aten.unsqueeze.default ...
    No decompositions registered for the complex-valued input". The fix rewrites the node as
    ``view_as_complex(op(view_as_real(x), ...))`` with the axis counted from the front (so the
    trailing real/imaginary axis stays last) or the sizes extended by 2: the same values, through
    ops torchlib translates.
    Models: DeepseekV2Model, Llama4TextModel, Llama4ForConditionalGeneration (onnx in the sweep).
    Upstream: onnxscript torch_lib ops/core.py in onnxscript 0.7.2 registers ``complex=True``
        translations for view/permute/slice/squeeze.dim but none for unsqueeze, select, expand or reshape
        (no report found)
    Remove when: torchlib registers complex translations of these ops.
    """
    if node.target not in _COMPLEX_SHAPE_OPS or not _is_complex(node.args[0]):
        return False
    source, rest = node.args[0], list(node.args[1:])
    rank = _val(source).dim()
    kind = _COMPLEX_SHAPE_OPS[node.target]
    if kind == "new axis":
        rest[0] = rest[0] if rest[0] >= 0 else rest[0] + rank + 1
    elif kind == "axis":
        rest[0] = rest[0] if rest[0] >= 0 else rest[0] + rank
    else:
        rest[0] = [*rest[0], 2]
    graph = gm.graph
    example = torch.fx.node.map_arg(rest, lambda arg: arg.meta["val"])  # sym_size nodes -> SymInts
    with graph.inserting_before(node):
        real = _insert(graph, aten.view_as_real.default, (source,), None, torch.view_as_real(_val(source)), node)
        moved_val = node.target(real.meta["val"], *example, **node.kwargs)
        moved = _insert(graph, node.target, (real, *rest), dict(node.kwargs), moved_val, node)
        back = _insert(graph, aten.view_as_complex.default, (moved,), None, torch.view_as_complex(moved_val), node)
    node.replace_all_uses_with(back)
    graph.erase_node(node)
    return True


@registry.register_fx_node_fix("onnx")
def _fix_rsub_scalar(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Rewrite ``aten.rsub.Scalar(x, s, alpha)`` (``s - alpha * x``) as ``add(mul(x, -alpha), s)``.

    Pattern: ``1.0 - attention_mask`` (a mask inverted before it is scaled). torch.export records
    ``aten.rsub.Scalar``; the decomposition torch.onnx runs turns it into ``aten.sub.Tensor(1.0, x)``
    (``torch._refs.rsub`` calls ``torch.sub(b, a)`` with the number first), which no ``aten.sub``
    overload accepts: "Cannot find a compatible OpOverload for aten.sub with the provided arguments
    ... Expected a value of type 'Tensor' for argument 'self' but instead found type 'float'".
    The tensor is first cast to rsub's result dtype (so an unsigned or narrow integer ``x`` cannot wrap
    in ``x * -alpha``); ``mul`` then ``add`` with the Python number then give rsub's values.
    Models: XLNetModel, ProphetNetModel (onnx in the sweep).
    Upstream: torch/_refs/__init__.py ``rsub`` in torch 2.13 (no report found)
    Remove when: the rsub decomposition emits a valid overload for a number operand.
    """
    if node.target is not aten.rsub.Scalar:
        return False
    source, number = node.args[0], node.args[1]
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
    source_val = _val(source)
    if source_val is None or not all(isinstance(v, (int, float)) for v in (number, alpha)):
        return False  # a symbolic number: left to the lowering
    dtype = torch.result_type(source_val, number)
    graph = gm.graph
    with graph.inserting_before(node):
        if source_val.dtype != dtype:  # promote first, as rsub does: an unsigned x must not wrap in x * -alpha
            source_val = source_val.to(dtype)
            source = _insert(graph, aten._to_copy.default, (source,), {"dtype": dtype}, source_val, node)
        scaled = _insert(graph, aten.mul.Tensor, (source, -alpha), None, source_val * -alpha, node)
        result = _insert(graph, aten.add.Tensor, (scaled, number), None, scaled.meta["val"] + number, node)
    node.replace_all_uses_with(result)
    graph.erase_node(node)
    return True


def _sdpa_heads(node: torch.fx.Node) -> tuple[object, object, object] | None:
    vals = [_val(a) for a in node.args[:3]]
    if len(vals) < 3 or any(v is None or v.dim() != 4 for v in vals):
        return None
    return vals[0].shape[1], vals[1].shape[1], vals[2].shape[1]


@registry.register_fx_node_fix("onnx")
def _fix_sdpa_broadcast_kv_heads(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Mark ``scaled_dot_product_attention`` with one key/value head as grouped-query attention.

    Pattern: multi-query attention that relies on SDPA broadcasting: query (B, H, L, E) against key and
    value (B, 1, S, E), without ``enable_gqa`` (Falcon's ``multi_query``). Eager broadcasts the head axis;
    torch.onnx's opset-23 translation (``Attention``) requires equal head counts unless ``enable_gqa``
    is set and fails with "SDPA (MHA) requires q_num_heads = kv_num_heads". With one key/value head,
    grouped-query attention (each query head reads key/value head ``h // H``) is that broadcast, so
    setting ``enable_gqa=True`` keeps the values and lets ``Attention`` take H query heads and 1
    key/value head.
    Models: FalconModel (onnx in the sweep) and other multi-query models calling SDPA directly.
    Upstream: torch/onnx/_internal/exporter/_torchlib/ops/nn.py ``aten_scaled_dot_product_attention_23``
        in torch 2.13 (no report found)
    Remove when: the opset-23 SDPA translation broadcasts a single key/value head.
    """
    if node.target is not aten.scaled_dot_product_attention.default or node.kwargs.get("enable_gqa"):
        return False
    if len(node.args) > 7 and node.args[7]:
        return False
    heads = _sdpa_heads(node)
    if heads is None or not all(isinstance(h, int) for h in heads):
        return False
    query_heads, key_heads, value_heads = heads
    if not (key_heads == value_heads == 1 < query_heads):
        return False
    if len(node.args) > 7:
        node.args = (*node.args[:7], True, *node.args[8:])
    else:
        node.kwargs = {**node.kwargs, "enable_gqa": True}
    return True


@registry.register_fx_node_fix("onnx")
def _fix_sdpa_mask_over_query_rows(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Expand an ``attn_mask`` of one query row, (..., 1, S), to the query's length, (..., L, S).

    Pattern: ``scaled_dot_product_attention(q, k, v, attn_mask=mask)`` with the padding mask of older BERT-style
    code, (B, 1, 1, S), that SDPA broadcasts over the L query rows. torch.onnx's opset-23 translation emits
    ``Attention`` with the mask as given, and onnxruntime's CPU ``Attention`` kernel requires the mask's
    second-to-last axis to equal the query length, failing at run time with "inconsistent q_sequence_length
    (between attn_mask and Q)". An ``expand`` to (..., L, S) is the broadcast SDPA does; the values are the same.
    Models: LayoutLMModel, LEDModel, LongformerModel (onnx in the sweep, opset 25; upstream exports opset 18).
    Upstream: onnxruntime core/providers/cpu/llm/attention_helper.h ``ComputeOutputShapeForAttention`` (no
        broadcast of the mask's query axis, which the ONNX ``Attention`` spec allows); no report found
    Remove when: onnxruntime's CPU ``Attention`` broadcasts the mask over query rows.
    """
    if node.target is not aten.scaled_dot_product_attention.default:
        return False
    in_args = len(node.args) > 3
    mask = node.args[3] if in_args else node.kwargs.get("attn_mask")
    query, mask_val = _val(node.args[0]), _val(mask)
    if query is None or mask_val is None or mask_val.dim() < 2 or query.dim() < 2:
        return False
    rows = query.shape[-2]
    if not (isinstance(mask_val.shape[-2], int) and mask_val.shape[-2] == 1) or (isinstance(rows, int) and rows == 1):
        return False
    graph = gm.graph
    with graph.inserting_before(node):
        if isinstance(rows, int):
            length: object = rows
        else:
            length = _insert(graph, aten.sym_size.int, (node.args[0], query.dim() - 2), None, rows, node)
        sizes = [-1] * (mask_val.dim() - 2) + [length, -1]
        value = mask_val.expand(*mask_val.shape[:-2], rows, mask_val.shape[-1])
        expanded = _insert(graph, aten.expand.default, (mask, sizes), None, value, node)
    if in_args:
        node.args = (*node.args[:3], expanded, *node.args[4:])
    else:
        node.kwargs = {**node.kwargs, "attn_mask": expanded}
    return True


@registry.register_fx_node_fix("onnx")
def _fix_sdpa_key_heads_to_query_heads(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Reshape a key or value whose heads axis the trace left symbolic to the query's static head count, in an SDPA
    without ``enable_gqa`` (where the two counts are equal whenever the model runs).

    Pattern: cross-attention that splits the encoder's states into heads with ``view(batch, -1, heads, head_dim)``
    where ``batch`` is the decoder's batch: with dynamic shapes the encoder's and the decoder's batch are two
    symbols the trace never ties, and the key's heads axis is traced as ``(4 * s6) // s11`` (equal to 4 at run time,
    as eager requires). torch.onnx's opset-23 translation refuses the SDPA: "SDPA (MHA) requires q_num_heads =
    kv_num_heads". A ``reshape`` to (batch, query heads, length, head_dim) names the count the model computes with.
    Models: CohereAsrModel, CanaryModel (onnx dynamic in the sweep).
    Upstream: torch onnx/_internal/exporter/_torchlib/ops/nn.py ``aten_scaled_dot_product_attention_23`` (compares
        the head axes' symbols, not their values); no report found
    Remove when: the translation accepts a symbolic key heads axis (or emits ``Attention`` with the count it
        reads at run time).
    """
    if node.target is not aten.scaled_dot_product_attention.default or node.kwargs.get("enable_gqa", False):
        return False
    query = _val(node.args[0])
    if query is None or query.dim() != 4 or not isinstance(query.shape[1], int):
        return False
    heads = query.shape[1]
    graph = gm.graph
    replaced = list(node.args)
    for position in (1, 2):
        tensor = _val(node.args[position])
        if tensor is None or tensor.dim() != 4 or isinstance(tensor.shape[1], int):
            continue
        with graph.inserting_before(node):
            sizes = [
                size if isinstance(size, int) else _insert(graph, aten.sym_size.int, (node.args[position], axis), None, size, node)
                for axis, size in ((0, tensor.shape[0]), (2, tensor.shape[2]), (3, tensor.shape[3]))
            ]
            value = tensor.new_empty((tensor.shape[0], heads, tensor.shape[2], tensor.shape[3]))
            replaced[position] = _insert(graph, aten.reshape.default, (node.args[position], [sizes[0], heads, sizes[1], sizes[2]]), None, value, node)
    if replaced == list(node.args):
        return False
    node.args = tuple(replaced)
    return True


def _known_not_one(size: Any) -> bool:
    """Whether an axis size is known not to be 1: a static size, or a symbolic one whose range excludes 1."""
    if isinstance(size, int):
        return size != 1
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(size != 1))


@registry.register_fx_node_fix("onnx")
def _fix_squeeze_of_wide_axis(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Drop the axes of ``squeeze(dim)`` whose size is known and not 1 (torch leaves them as they are).

    Pattern: ``joint(encoder[:, :, None, :], decoder[:, None, :, :]).squeeze(2)`` in RNN-T/TDT joint
    networks, where axis 2 is 1 only for a single decoder step: torch's ``squeeze(dim)`` is a no-op on
    an axis of another size, but torch.onnx lowers it to ``Squeeze(axes=[2])`` and onnxruntime refuses
    the model ("Op (Squeeze) [ShapeInferenceError] Dimension of input 2 must be 1 instead of 4"). The
    fix removes such axes from the node (the node becomes an ``alias``, ONNX ``Identity``, when none
    is left) when the traced output kept every axis (torch found none of them to be 1), or else axes whose
    static size is not 1 or whose symbolic range excludes 1; other symbolic axes are left to the lowering.
    Models: ParakeetForRNNT, ParakeetForTDT, NemotronAsrStreamingForRNNT (onnx in the sweep).
    Upstream: onnxscript function_libs/torch_lib/ops/core.py ``aten_squeeze_dim`` in onnxscript 0.7.2 (no report found)
    Remove when: torch.onnx lowers ``squeeze`` of a non-1 static axis to Identity.
    """
    if node.target not in (aten.squeeze.dim, aten.squeeze.dims):
        return False
    source = node.args[0]
    val = _val(source)
    if val is None or val.dim() == 0:
        return False
    dims = [node.args[1]] if node.target is aten.squeeze.dim else list(node.args[1])
    rank = val.dim()
    out = node.meta.get("val")
    if isinstance(out, torch.Tensor) and out.dim() == rank:
        # the trace kept every axis: torch decided none of them was 1 (also when the axis is symbolic
        # and its range, under size-oblivious tracing, still admits 1)
        wide = dims
    else:
        wide = [d for d in dims if _known_not_one(val.shape[d % rank])]
    if not wide:
        return False
    kept = [d for d in dims if d not in wide]
    if not kept:
        # an alias rather than an erased node: the node keeps its name, which the program's output
        # signature may hold (a squeeze that is a model output; torch.onnx looks outputs up by name)
        node.target, node.args, node.kwargs = aten.alias.default, (source,), {}
    elif node.target is aten.squeeze.dims:
        node.args = (source, kept)
    return True


#: defined in :mod:`.._data_checks` (the ExecuTorch exporter registers it too); registered after the
#: fixes above, as before: the first fix that consumes a node wins
registry.register_fx_node_fix("onnx")(_fix_drop_tensor_data_checks)
