"""OnnxExporter Stage 3: FX node fixes (``register_fx_node_fix("onnx")``).

Each fix is offered every ``call_function`` node of the traced graph (and again of the decomposed
graph, see Stage 2); it returns True when it replaced or erased the node.
"""

from __future__ import annotations

import torch

from ... import registry

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
    Models: SwinModel (window attention), and any model reshaping a transposed SDPA output.
    Remove when: pytorch/pytorch#141107 is fixed in the torch version in use.
    Upstream: pytorch/pytorch#141107
    """
    if node.target not in _VIEWS:
        return False
    node.target = aten.reshape.default
    return True


_ASSERTS = (aten._assert_async.msg, aten._assert_async.default, aten._assert_scalar.default)


def _checks_tensor_data(node: torch.fx.Node, depth: int = 8) -> bool:
    """Whether ``node``'s condition is computed from ``aten._is_all_true`` (a check on tensor data)."""
    frontier, seen = [node], set()
    for _ in range(depth):
        nxt = []
        for current in frontier:
            for arg in current.all_input_nodes:
                if arg in seen:
                    continue
                seen.add(arg)
                if arg.target is aten._is_all_true.default:
                    return True
                nxt.append(arg)
        frontier = nxt
    return False


@registry.register_fx_node_fix("executorch")
@registry.register_fx_node_fix("onnx")
def _fix_drop_tensor_data_checks(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Erase run-time checks on tensor data (asserts fed by ``aten._is_all_true``); dead-code
    elimination then drops ``_is_all_true`` and the ``item`` read from it.

    Pattern: ``torch._check(tensor_condition)`` / transformers' ``torch_compilable_check`` on a tensor,
    e.g. the placeholder check of vision-language models (``n_image_tokens * hidden == features.numel()``
    in ``get_placeholder_mask``). The trace keeps it as ``_is_all_true(cond).item()`` and
    ``_assert_scalar`` nodes on that value: torch.onnx has no translation for ``aten._is_all_true``
    ("No ONNX function found") and ExecuTorch's verifier refuses it ("not in Core ATen opset"). The
    check only guards inputs eager would refuse; the graph's values are the same without it (the
    ExportedProgram of the dynamo backend keeps it).
    Models: LlavaForConditionalGeneration and the multimodal models using ``get_placeholder_mask``.
    Upstream: no report found (none filed from here yet); the gaps are torch.onnx 2.13's torchlib, which has no
    translation of aten._is_all_true, and executorch/exir/verification/verifier.py, which refuses it as non-core ATen
    Remove when: torch.onnx translates ``aten._is_all_true`` and ExecuTorch accepts or strips it.
    """
    if node.target not in _ASSERTS or not _checks_tensor_data(node):
        return False
    gm.graph.erase_node(node)
    return True
