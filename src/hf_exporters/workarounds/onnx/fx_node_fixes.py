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
