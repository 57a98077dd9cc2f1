"""Normalisations in float16 and bfloat16: ExecutorchExporter Stage 2 (Torch patches).

Pattern: ``nn.LayerNorm`` / ``nn.GroupNorm`` (``F.layer_norm``, ``F.group_norm``) on a float16 or bfloat16
tensor, as in every model exported with ``--dtype float16``. ExecuTorch 1.4's portable and optimized
``native_layer_norm`` / ``native_group_norm`` kernels accumulate the mean and the sum of squares in the
tensor's own dtype, where ATen accumulates in float32: over 384 features the result drifts (4.9 off on
unit-variance inputs through XNNPACK's fallback, 11 on portable kernels) and an embedding layer's larger
values overflow float16 to inf, so every output of all-MiniLM-L6-v2 in float16 was NaN. Traced here as a
float32 normalisation between two casts (what ATen computes), the program carries ``_to_copy`` ops around
each norm and keeps its values.
"""

from __future__ import annotations

from typing import Any

import torch

from ...registry import register_patch

#: the dtypes whose normalisations ExecuTorch 1.4 accumulates in too little precision
_REDUCED = (torch.float16, torch.bfloat16)


@register_patch("executorch", "torch.nn.functional.layer_norm", "torch.nn.functional.group_norm", stage="Stage 2: Torch patches")
def _patch_norms_in_float32(original: Any) -> Any:
    """Compute a float16 or bfloat16 layer or group normalisation in float32 and cast the result back.

    Pattern: ``F.layer_norm`` or ``F.group_norm`` of a float16 or bfloat16 tensor.
    Shapes: unchanged (``input`` (N, ..., C) -> same shape and dtype).
    Models: every model exported in float16 or bfloat16 that normalises with LayerNorm or GroupNorm
        (BertModel / all-MiniLM-L6-v2: all outputs NaN without it; tests/test_precision.py).
    Upstream: pytorch/executorch#16727 ("Use fp32 accumulation in portable/optimized norms", merged
        2026-01-21, after executorch 1.4.1).
    Remove when: the pinned executorch ships that change (tests/test_precision.py's float16 norm test
        then passes without this patch).
    """

    def norm_in_float32(input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not isinstance(input, torch.Tensor) or input.dtype not in _REDUCED:
            return original(input, *args, **kwargs)
        widened = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        named = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in kwargs.items()}
        return original(input.float(), *widened, **named).to(input.dtype)

    return norm_in_float32
