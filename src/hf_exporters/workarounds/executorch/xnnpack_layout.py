"""XNNPACK's channels-last layout: operators that must see their input in the model's own (NCHW) layout.

XNNPACK runs convolutions and pooling in NHWC. Its ``ChannelsLastTaggedReshapePass`` converts a 4-D tensor to
NHWC before the operators it lists as needing it, back to NCHW before those it lists as needing that, and lets
every other operator run on whichever layout its input has. An operator that reads an axis by number is only
right in the layout that number refers to.
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
