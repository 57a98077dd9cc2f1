"""XNNPACK's channels-last layout: operators that must see their input in the model's own (NCHW) layout.

XNNPACK runs convolutions and pooling in NHWC. Its ``ChannelsLastTaggedReshapePass`` converts a 4-D tensor to
NHWC before the operators it lists as needing it, back to NCHW before those it lists as needing that, and lets
every other operator run on whichever layout its input has. An operator that reads an axis by number is only
right in the layout that number refers to, and an operator listed as needing NHWC can only be given a 4-D input.
"""

from __future__ import annotations

from typing import Any

from ...registry import register_patch


@register_patch(
    "executorch.xnnpack",
    "executorch.backends.xnnpack._passes.channels_last_tagged_reshape_pass.ChannelsLastTaggedReshapePass.memory_sensitive_ops_nchw",
    stage="Stage 3: ExecuTorch patches",
)
def _patch_xnnpack_softmax_in_model_layout(original: Any) -> Any:
    """XNNPACK's layout pass gives ``softmax`` and ``log_softmax`` their input in NCHW, the layout whose axes the
    ``dim`` argument numbers.

    Pattern: ``softmax(conv(x), dim=-1)`` over a 4-D tensor (MobileViTV2's linear self-attention: the context
    scores are a softmax over the patches of a 1x1 convolution's output). The layout pass does not list softmax,
    so it runs on the convolution's NHWC output, and XNNPACK's softmax normalises the last axis of that tensor:
    the channels instead of the width. The ``.pte`` returned other values than eager (MobileViTV2Model's last
    hidden state off by 2.46; a 1x1 convolution then ``softmax(dim=-1)`` by 0.99), silently. With softmax listed
    among the operators that need NCHW, the pass converts its input back first; the values match eager.
    Models: MobileViTV2Model (and its task heads), any convolution followed by a softmax over a spatial axis.
    Upstream: executorch backends/xnnpack/_passes/channels_last_tagged_reshape_pass.py (``memory_sensitive_ops_nchw``
        lacks ``_softmax``/``_log_softmax``, which ``operators/op_softmax.py`` lowers with the NCHW ``dim``); no
        report found
    Remove when: the layout pass treats softmax as layout-sensitive, or XNNPACK's softmax maps ``dim`` to NHWC.
    """
    from executorch.exir.dialects._ops import ops as exir_ops

    return {*original, exir_ops.edge.aten._softmax.default, exir_ops.edge.aten._log_softmax.default}


@register_patch(
    "executorch.xnnpack",
    "executorch.backends.xnnpack.partition.config.node_configs.PreluConfig.check_constraints",
    stage="Stage 3: ExecuTorch patches",
)
def _patch_xnnpack_prelu_on_4d_inputs(original: Any) -> Any:
    """XNNPACK claims ``prelu`` only over a 4-D input; any other is decomposed by the lowering (a select between the
    input and its product with the slope), whose operators XNNPACK or the portable kernels run.

    Pattern: ``nn.PReLU`` applied to a sequence, ``prelu(linear(x))`` over (batch, tokens, features): DAB-DETR's
    encoder feed-forward (``activation_function="prelu"``). The layout pass lists ``prelu`` among the operators that
    need NHWC and stops on its 3-D input: "AssertionError: Attempting to convert non-NHWC compatible node to NHWC"
    (raised from ``ChannelsLastTaggedReshapePass``), so the whole lowering failed.
    Models: DabDetrModel (executorch static in the sweep).
    Upstream: executorch backends/xnnpack/partition/config/node_configs.py (``PreluConfig`` does not check the
        input's rank, which ``_passes/channels_last_tagged_reshape_pass.py`` requires); no report found
    Remove when: XNNPACK's partitioner refuses a ``prelu`` it cannot lay out in NHWC, or lowers one of any rank.
    """

    def check_constraints(self: Any, node: Any, ep: Any) -> bool:
        value = node.all_input_nodes[0].meta.get("val") if node.all_input_nodes else None
        if getattr(value, "dim", None) is not None and value.dim() != 4:
            return False
        return original(self, node, ep)

    return check_constraints
