"""ExecutorchExporter Stage 5: FX node fixes (``register_fx_node_fix("executorch...")``).

Rewrites of single nodes of the traced graph into ops ExecuTorch can lower and run: a ``max.dim``
XNNPACK would mislower, int32 gather/scatter indices, ``nonzero``'s column-major output, an ``empty`` of
symbolic size the lowering would specialise, and the run-time checks on tensor data the ONNX exporter erases
too (:mod:`.._data_checks`).
"""

from __future__ import annotations

import contextlib
import operator

import torch

from ...registry import register_fx_node_fix
from .._data_checks import _fix_drop_tensor_data_checks
from .xnnpack_partitions import attention_is_rewritten


def _repeated_heads(node: object) -> tuple[torch.fx.Node, int] | None:
    """``(source, repeats)`` when ``node`` is ``source.repeat_interleave(repeats, dim=1)`` of a 4-D tensor."""
    if not isinstance(node, torch.fx.Node) or node.target is not torch.ops.aten.repeat_interleave.self_int:
        return None
    source, repeats = node.args[0], node.args[1]
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() != 4 or dim is None or dim % 4 != 1 or not isinstance(repeats, int):
        return None
    return source, repeats


@register_fx_node_fix("executorch.xnnpack")
def _fix_attention_on_repeated_heads_as_grouped(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Give ``scaled_dot_product_attention`` over key/value heads repeated with ``repeat_interleave`` the
    unrepeated key and value and ``enable_gqa=True``, where the XNNPACK attention decomposition takes it.

    Pattern: grouped-query attention written as ``repeat_kv`` (``key.repeat_interleave(n, dim=1)``, traced
    so from transformers' ``repeat_kv``) before SDPA. The repeat decomposes into ``unsqueeze``, ``expand``
    and ``view``; XNNPACK has no ``expand_copy``, so every attention layer ended an XNNPACK partition with a
    copy of its keys and values between the partitions. With ``enable_gqa`` the XNNPACK attention
    decomposition (``attention_for_xnnpack``) multiplies each key/value head with its group of query
    heads in one ``bmm``, without repeating them. Only calls that decomposition rewrites (static float32,
    boolean or no mask) are changed; the values are the same.
    Models: LlamaForCausalLM and other grouped-query decoders (Mistral, Qwen2, Gemma, ...) with
        ``num_key_value_heads < num_attention_heads``, static shapes.
    Upstream: pytorch/executorch backends/xnnpack/partition/config/generic_node_configs.py (no
        ``expand_copy`` config); torch/_decomp ``_scaled_dot_product_attention_math`` repeats heads with
        ``repeat_interleave`` for ``enable_gqa`` too
    Remove when: XNNPACK claims ``expand_copy`` or lowers grouped-query SDPA itself.
    """
    if node.target is not torch.ops.aten.scaled_dot_product_attention.default or node.kwargs.get("enable_gqa"):
        return False
    if len(node.args) < 3:
        return False
    key, value = _repeated_heads(node.args[1]), _repeated_heads(node.args[2])
    if key is None or value is None or key[1] != value[1] or key[1] < 2:
        return False
    mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    dropout = node.args[4] if len(node.args) > 4 else node.kwargs.get("dropout_p", 0.0)
    causal = node.args[5] if len(node.args) > 5 else node.kwargs.get("is_causal", False)
    values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in (node.args[0], key[0], value[0], mask)]
    if not all(isinstance(v, torch.Tensor) for v in values[:3]) or (mask is not None and not isinstance(values[3], torch.Tensor)):
        return False
    if not attention_is_rewritten(*values, dropout, causal, True):
        return False
    node.args = (node.args[0], key[0], value[0], *node.args[3:])
    node.kwargs = {**node.kwargs, "enable_gqa": True}
    return True


@register_fx_node_fix("executorch.xnnpack")
def _fix_max_dim_for_xnnpack(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Give XNNPACK only the ``max.dim`` calls its lowering can take.

    Pattern: ``x.max(dim=-1, keepdim=True).values`` over a 4-D tensor (attention with sinks: the row
    maximum subtracted before the softmax). XNNPACK's partitioner claims every 4-D ``max.dim`` whose
    indices are unused, but its lowering turns it into ``amax`` and accepts only ``keepdim=True`` over
    axis 2 or 3 written as a positive number, so the lowering stops with "amax.default only supports
    dim == 2 or dim == 3"; written with a positive axis 3 it lowers, and returns wrong values (max abs
    diff 3.2 on OpenAI Privacy Filter's sink attention, as upstream's exporter gets too). Every such
    call becomes ``aten.amax``, which XNNPACK does not claim and the portable kernels run with eager's
    values.
    Models: OpenAIPrivacyFilterModel, HYV4Model (executorch in the sweep).
    Upstream: pytorch/executorch backends/xnnpack/partition/config/node_configs.py (``MaxDimConfig``
        checks rank, dtype and users but not the axis or keepdim); operators/op_max_dim.py
    Remove when: ``MaxDimConfig`` refuses what ``op_max_dim`` cannot lower.
    """
    if node.target is not torch.ops.aten.max.dim:
        return False
    source, dim = node.args[0], node.args[1]
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() != 4 or not isinstance(dim, int):
        return False
    if any(user.target is not operator.getitem or (user.args[1] != 0 and user.users) for user in node.users):
        return False  # the indices are used: XNNPACK leaves the call alone
    for user in [u for u in node.users if u.args[1] != 0]:
        graph_module.graph.erase_node(user)  # an unused indices output, which the lowering drops too
    axis = dim % 4
    with graph_module.graph.inserting_before(node):
        amax = graph_module.graph.call_function(torch.ops.aten.amax.default, (source, [axis], bool(keepdim)))
    amax.meta = {**node.meta, "val": node.meta["val"][0] if "val" in node.meta else None}
    for user in list(node.users):
        user.replace_all_uses_with(amax)
        graph_module.graph.erase_node(user)
    graph_module.graph.erase_node(node)
    return True


#: ops whose third argument is an index tensor that ExecuTorch's kernels take as int64 only
#: (in-place forms too: the traced program keeps ``scatter_add_`` on a tensor the model made itself)
_LONG_INDEX_OPS = (
    torch.ops.aten.scatter_add.default,
    torch.ops.aten.scatter_add_.default,
    torch.ops.aten.scatter.src,
    torch.ops.aten.scatter_.src,
    torch.ops.aten.scatter.value,
    torch.ops.aten.scatter_.value,
    torch.ops.aten.scatter_reduce.two,
    torch.ops.aten.scatter_reduce_.two,
    torch.ops.aten.gather.default,
    torch.ops.aten.index_select.default,
)


@register_fx_node_fix("executorch")
def _fix_int32_gather_scatter_index(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Cast an int32 index of ``scatter``/``scatter_add``/``gather``/``index_select`` to int64.

    Pattern: indices computed as int32 (top-k positions stored compactly, ``.int()`` before a
    scatter) feed a gather or scatter. torch accepts int32 indices; ExecuTorch's edge verifier checks
    each op's dtypes against its kernels', which take int64 indices only, and stopped the lowering
    with "These operators are taking Tensor inputs with mismatched dtypes: ... aten.scatter_add.default
    ... 'index': torch.int32". A ``_to_copy`` to int64 before the op gives the kernels what they take;
    the values are the same.
    Models: Glm5NextModel, Glm5NextTextModel (the sparse attention's top-k mask; they then stop on
    sizes read from data in the lowering's dim-order pass).
    Upstream: executorch exir/verification/verifier.py with kernels/portable/functions.yaml (int64
        index only for gather/scatter/index_select)
    Remove when: ExecuTorch's gather/scatter kernels take int32 indices.
    """
    if node.target not in _LONG_INDEX_OPS or len(node.args) < 3 or not isinstance(node.args[2], torch.fx.Node):
        return False
    index = node.args[2]
    value = index.meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dtype != torch.int32:
        return False
    with graph_module.graph.inserting_before(node):
        wide = graph_module.graph.call_function(torch.ops.aten._to_copy.default, (index,), {"dtype": torch.int64})
    wide.meta = {**index.meta, "val": value.to(torch.int64)}
    node.args = (*node.args[:2], wide, *node.args[3:])
    return True


_SQUEEZES = (torch.ops.aten.squeeze.dim, torch.ops.aten.squeeze.dims, torch.ops.aten.unsqueeze.default)


@register_fx_node_fix("executorch")
def _fix_squeeze_of_nonzero_made_contiguous(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Give ``squeeze``/``unsqueeze`` of ``nonzero``'s output a contiguous copy.

    Pattern: ``torch.nonzero(mask).squeeze(-1)`` (positions of valid frames in an audio encoder).
    torch's ``nonzero`` returns its (count, dims) result column-major, strides (1, count), and
    ExecuTorch carries that layout as the tensor's dim order (1, 0); the squeezed (count,) output has
    dim order (0,), and the portable ``squeeze_copy`` kernel refuses inputs and outputs of different
    dim orders at run time ("2 input tensors have different dim orders; [op_squeeze_copy.cpp:70]
    Check failed (tensors_have_same_dim_order(in, out))"). A ``clone`` into the contiguous layout
    between the two gives the kernel matching dim orders; the values are the same.
    Models: Qwen3ASREncoder (executorch in the sweep).
    Upstream: executorch kernels/portable/cpu/op_squeeze_copy.cpp (same-dim-order check) with
        aten ``nonzero`` (column-major output); no report found
    Remove when: ExecuTorch's squeeze kernels accept a column-major input or ``nonzero`` is lowered
        with a contiguous output.
    """
    if node.target not in _SQUEEZES or not isinstance(node.args[0], torch.fx.Node):
        return False
    source = node.args[0]
    if source.target is not torch.ops.aten.nonzero.default:
        return False
    value = source.meta.get("val")
    with graph_module.graph.inserting_before(node):
        copy = graph_module.graph.call_function(torch.ops.aten.clone.default, (source,), {"memory_format": torch.contiguous_format})
    if isinstance(value, torch.Tensor):
        fake_mode = getattr(value, "fake_mode", None)
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            value = value.clone(memory_format=torch.contiguous_format)  # the same (symbolic) sizes, row-major
    # the source's meta without its unbacked-symbol bindings: nonzero binds its count, the copy binds none
    copy.meta = {**{k: v for k, v in source.meta.items() if k != "unbacked_bindings"}, "val": value}
    node.args = (copy, *node.args[1:])
    return True


@register_fx_node_fix("executorch")
def _fix_empty_of_symbolic_size_as_full(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Replace ``empty(size)``, ``x.new_empty(size)`` or ``empty_like(x)`` of symbolic size by ``full(size, 0)``
    (``full_like(x, 0)``, contiguous).

    Pattern: a buffer allocated then filled slice by slice, ``key = x.new_empty(*x.shape[:-1], d)`` then
    ``key[..., :a].copy_(k_nope); key[..., a:].copy_(k_rot)`` (the multi-head latent attention of
    BailingHybrid's ``expand_kv``; ``new_empty``, ``torch.empty`` and ``empty_like`` are written so in
    hundreds of transformers modules), traced with a dynamic batch or length. ExecuTorch's
    ``MemoryFormatOpsPass`` rewrites ``aten.empty.memory_format`` into ``dim_order_ops._empty_dim_order``,
    whose schema takes ``int[] size``: re-running it turns each symbolic size into an int, which guards the
    dimension to its example value. The lowering then returns a program specialised to the example sizes,
    with no error: a decode step exported for any batch and cache length refuses every other size at run
    time. ``full`` takes ``SymInt[]`` and is not rewritten; its zeros are overwritten like ``empty``'s
    contents, at the cost of one fill of the buffer. ``empty_like`` of a dynamic tensor stops the lowering
    instead (its decomposition ``empty_permuted`` is not core ATen); a contiguous ``full_like`` lowers.
    Models: the multi-head latent attention decoders, DeepseekV2ForCausalLM, Glm4MoeLiteForCausalLM,
        LongcatFlashForCausalLM, BailingHybridForCausalLM (generation, executorch in the sweep: each decode step
        came out for batch 2 and cache length 8 and refused the next step, "Attempted to resize a bounded
        tensor"; the first three now generate eager's tokens).
    Upstream: pytorch/executorch exir/passes/memory_format_ops_pass.py and the ``_empty_dim_order`` schema
        (``int[] size`` where ``aten::empty`` has ``SymInt[]``); no report found
    Remove when: ``_empty_dim_order`` takes ``SymInt[] size``.
    """
    value = node.meta.get("val")
    like = node.target is torch.ops.aten.empty_like.default
    if like:
        if not (isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape)):
            return False
    elif node.target in (torch.ops.aten.empty.memory_format, torch.ops.aten.new_empty.default) and node.args:
        size = node.args[0] if node.target is torch.ops.aten.empty.memory_format else (node.args[1] if len(node.args) > 1 else None)
        if not isinstance(size, (list, tuple)) or not any(isinstance(d, torch.fx.Node) for d in size):
            return False
    else:
        return False
    kwargs = {k: v for k, v in node.kwargs.items() if k in ("dtype", "layout", "device", "pin_memory") and v is not None}
    if isinstance(value, torch.Tensor):  # new_empty's and empty_like's dtype and device are their tensor's unless given
        kwargs.setdefault("dtype", value.dtype)
        kwargs.setdefault("device", value.device)
    with graph_module.graph.inserting_before(node):
        if like:  # contiguous: a permuted layout lowers to empty_permuted
            full = graph_module.graph.call_function(
                torch.ops.aten.full_like.default, (node.args[0], 0), {**kwargs, "memory_format": torch.contiguous_format}
            )
        else:
            full = graph_module.graph.call_function(torch.ops.aten.full.default, (list(size), 0), kwargs)
    full.meta = dict(node.meta)
    node.replace_all_uses_with(full)
    graph_module.graph.erase_node(node)
    return True


#: defined in :mod:`.._data_checks` (the ONNX exporter registers it too); registered after the fixes
#: above, as before: the first fix that consumes a node wins
register_fx_node_fix("executorch")(_fix_drop_tensor_data_checks)
