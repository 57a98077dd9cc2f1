"""torch's own Python code that does not run on a trace's fake tensors: model patches (DynamoExporter
Stage 2, applied for every backend).

Pattern: a forward calls torch code that checks or swaps tensors in Python (``Module.to`` swapping
fake parameters for their casts, ``torch.distributions`` validating its parameters with a branch on
their values); the patches skip the part that changes nothing for the traced values.
"""

from __future__ import annotations

from typing import Any

import torch

from ...registry import register_patch


@register_patch("dynamo", "torch.nn.Module.to")
def _patch_module_to_noop(original: Any) -> Any:
    """Return the module itself from ``Module.to(...)`` when no parameter or buffer would change.

    Pattern: a forward that casts a submodule on every call (``self.classifier =
    self.classifier.to(self.dtype)`` in SwitchTransformers' router). While tracing, the parameters are
    fake tensors and ``Module._apply`` tries to swap each one for its cast copy, which fails with
    "_apply(): Couldn't swap Linear.weight" even when the dtype and device are already the requested
    ones. When every floating-point parameter and buffer already has the requested dtype and every
    tensor the requested device, ``to`` changes nothing in eager, so returning the module is the same
    module; any real cast or move still goes to ``Module.to``.
    Models: SwitchTransformersModel, SwitchTransformersForConditionalGeneration.
    Upstream: pytorch/pytorch ``torch/nn/modules/module.py`` ``_apply`` with ``swap_tensors`` on fake
        parameters (no report found); model-side, casting a submodule inside forward
    Remove when: transformers casts the router once at init, or ``_apply`` skips unchanged tensors.
    """

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        device, dtype, _non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if memory_format is not None:
            return original(self, *args, **kwargs)
        for tensor in (*self.parameters(), *self.buffers()):
            if device is not None and tensor.device != device:
                return original(self, *args, **kwargs)
            if dtype is not None and (tensor.is_floating_point() or tensor.is_complex()) and tensor.dtype != dtype:
                return original(self, *args, **kwargs)
        return self

    return to


@register_patch("dynamo", "torch.distributions.distribution.Distribution._validate_args")
def _patch_distributions_skip_argument_validation(_original: Any) -> bool:
    """``torch.distributions`` without argument validation while the model is traced.

    Pattern: a model builds a distribution in its forward (BLT's entropy patcher:
    ``Categorical(logits=logits).entropy()``); with validation on (the default, ``__debug__``) the
    constructor checks its parameters against their constraints and branches on the result, a data
    value (``GuardOnDataDependentSymNode: Eq(u0, 1)`` in ``torch._is_all_true``). The class default
    is False for the duration of the export, as ``Distribution.set_default_validate_args(False)``
    would set it; a distribution built with ``validate_args=True`` still validates. The exported
    program computes the same values; it does not raise on invalid parameters as eager would.
    Models: BltModel and BltForCausalLM (the entropy patcher); any forward that builds a
    ``torch.distributions`` object.
    Upstream: pytorch/pytorch torch/distributions/distribution.py (``Distribution.__init__`` checks
        ``torch._is_all_true(valid)`` in Python); no report found
    Remove when: distribution validation traces as a runtime assertion (``torch._check``) instead
        of a Python branch.
    """
    return False
