"""A graph fix both the ONNX and the ExecuTorch exporter register: run-time checks on tensor data
(``torch._check`` on a tensor, transformers' ``torch_compilable_check``) erased from the traced graph.

Defined here once, unregistered; :mod:`.onnx.fx_node_fixes` registers it for ``"onnx"`` (Stage 3:
FX node fixes) and :mod:`.executorch.fx_node_fixes` for ``"executorch"`` (Stage 5: FX node fixes).
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


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
