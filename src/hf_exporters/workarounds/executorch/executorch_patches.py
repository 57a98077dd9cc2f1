"""ExecutorchExporter Stage 3: ExecuTorch patches (``register_patch("executorch...", "executorch.<path>")``).

Active during ``to_edge_transform_and_lower`` and ``to_executorch``: ExecuTorch internals that break
on valid dynamic-shape graphs.
"""

from __future__ import annotations

from typing import Any

import torch

from ...registry import register_patch
from ...shapes import is_symbolic


def _symbolic_dims(node: torch.fx.Node) -> int:
    """How many axes of ``node``'s output have a symbolic size (a size the trace pinned counts as static)."""
    value = node.meta.get("val")
    shape = getattr(value, "shape", ())
    return sum(is_symbolic(size) for size in shape)


@register_patch("executorch.xnnpack", "executorch.backends.xnnpack.partition.config.gemm_configs.ConvolutionConfig.check_constraints")
def _patch_xnnpack_conv1d_one_dynamic_axis(original: Any) -> Any:
    """XNNPACK's partitioner claims a 1-D convolution only when its input has at most one symbolic
    axis; one with more (dynamic batch and length) runs on the portable kernel.

    Pattern: a ``Conv1d`` over (batch, channels, length) with batch and length dynamic (the raw-audio
    feature encoders of wav2vec2-style models, convolutional position embeddings). XNNPACK lowers a
    1-D convolution as a 2-D one between an ``unsqueeze`` and a ``squeeze`` (its Conv1dUnsqueezePass),
    and serialises those as static reshapes, which take one dynamic axis: the lowering stopped on
    "XNNPACK reshape only supports 1 dynamic dimension". 2-D convolutions are unaffected.
    Models: UniSpeechSatModel with dynamic shapes; the wav2vec2-style raw-audio encoders share its
    convolutional feature encoder.
    Upstream: executorch backends/xnnpack/partition/config/gemm_configs.py (``ConvolutionConfig``
        does not check what ``_passes/conv1d_unsqueeze_pass.py`` and ``operators/op_squeeze.py`` need)
    Remove when: the XNNPACK convolution config refuses such 1-D convolutions, or XNNPACK's
        reshape takes more than one dynamic axis.
    """

    def check_constraints(self: Any, node: torch.fx.Node, ep: Any) -> bool:
        stride = node.args[3] if len(node.args) > 3 else ()
        if len(stride) == 1 and _symbolic_dims(node.args[0]) > 1:
            return False
        return original(self, node, ep)

    return check_constraints


@register_patch(
    "executorch.xnnpack",
    "executorch.backends.xnnpack.partition.config.generic_node_configs.UnsqueezeCopyConfig.check_constraints",
)
def _patch_xnnpack_unsqueeze_one_dynamic_axis(original: Any) -> Any:
    """XNNPACK's partitioner claims an ``unsqueeze_copy`` only when its output has at most one symbolic
    axis; one with more runs on the portable kernel.

    Pattern: a trailing ``unsqueeze`` of a (batch, length, ...) tensor with both axes dynamic
    (``attn_output * gate.unsqueeze(-1).sigmoid()``, masks widened for broadcasting). The partitioner's
    check looks at the axis only, so XNNPACK claims the node, and serialisation then refuses it: XNNPACK
    lowers it as a static reshape, which takes one dynamic axis ("XNNPACK reshape only supports 1
    dynamic dimension"). The view-copy config already refuses such reshapes; this gives unsqueeze the
    same rule.
    Models: Step3p7Model with dynamic shapes (its gated attention output).
    Upstream: executorch backends/xnnpack/partition/config/generic_node_configs.py
        (``UnsqueezeCopyConfig.check_constraints`` does not mirror the serializer's dynamic-axis check
        in ``operators/op_squeeze.py``)
    Remove when: the XNNPACK unsqueeze config refuses outputs with more than one symbolic axis.
    """

    def check_constraints(self: Any, node: torch.fx.Node, ep: Any) -> bool:
        if _symbolic_dims(node) > 1:
            return False
        return original(self, node, ep)

    return check_constraints


@register_patch("executorch", "executorch.exir.verification.verifier._EXECUTORCH_SYM_OPS")
def _patch_edge_verifier_python_sym_ops(original: Any) -> Any:
    """The edge-dialect verifier accepts the Python symbolic-size functions (``torch.sym_min``,
    ``torch.sym_max``, ``torch.sym_ite``, ...) that ``to_executorch`` maps to ExecuTorch's prim ops.

    Pattern: ``min(a, b)`` or ``max(a, b)`` over sizes read from data (unbacked SymInts) is recorded
    as a ``torch.sym_min``/``torch.sym_max`` node. ``to_edge`` verifies the edge program before
    ``to_executorch`` replaces those nodes by ``executorch_prim::sym_min.Scalar`` and its kin
    (``exir/passes/executorch_prim_ops_registry.py``, which the runtime implements), and its verifier
    lets through only builtins and those prim ops, not the Python functions: the lowering stopped on a
    bare ``AssertionError`` (``assert op.__name__ in ("alloc",)``). The verifier's set of symbolic ops
    gains the Python functions that have such a mapping, nothing else.
    Models: Glm5NextModel, Glm5NextTextModel (which then stop on sizes read from data in the
    lowering's dim-order pass: "Could not guard on data-dependent expression 16*u22 < 16").
    Upstream: executorch exir/verification/verifier.py (``check_valid_edge_op`` refuses the Python sym
        functions that exir/passes/executorch_prim_ops_registry.py maps)
    Remove when: the edge verifier accepts ``torch.sym_min``/``torch.sym_max`` (or to_edge maps them first).
    """
    from executorch.exir.passes.executorch_prim_ops_registry import _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS

    python_functions = {op for op in _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS if getattr(op, "__module__", "").startswith("torch")}
    return set(original) | python_functions
