"""Mixture-of-experts layers ExecuTorch cannot run: patches of ExecutorchExporter's Stage 2 (Torch
patches), active during the trace.

Pattern: transformers' experts implementations for layers decorated with
``@use_experts_implementation``: ``grouped_mm`` calls a custom op with no ExecuTorch kernel and
counts tokens with a non-core op, ``eager`` loops over the experts picked with ``nonzero()``. The
patch runs them as ``batched_mm``. The experts loops every backend meets are in
:mod:`..dynamo.moe`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...registry import register_patch

#: experts implementations whose trace ExecuTorch cannot run, each replaced by ``batched_mm``
_EXPERTS_REPLACED = ("eager", "grouped_mm")


@register_patch("executorch", "transformers.integrations.moe.ExpertsInterface._global_mapping", stage="Stage 2: Torch patches")
def _patch_experts_batched_mm(original: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """Run mixture-of-experts layers with the ``batched_mm`` experts implementation.

    Pattern: the default ``grouped_mm`` experts forward sorts tokens by expert, counts them with
    ``histc`` (not core ATen: "aten.histc.default is not in Core ATen opset") and multiplies through
    ``torch.ops.transformers.grouped_mm_fallback`` on CPU, a custom op with no ExecuTorch kernel
    ("Missing out variants: {'transformers::grouped_mm_fallback'}" in ``to_executorch``); the ``eager`` one loops over the experts picked with ``nonzero()``
    (data-dependent shapes). ``batched_mm`` gathers each selected expert's weights and runs one
    ``bmm``: the same numbers, static shapes, core ATen ops only.
    Models: MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM and the
    other models whose experts class uses ``@use_experts_implementation``.
    Upstream: model-side (transformers#38518: an export-friendly experts implementation chosen for
    torch.export; grouped_mm_fallback needs an out variant to run in ExecuTorch)
    Remove when: transformers picks an export-friendly experts implementation under torch.export, or
    ExecuTorch runs ``torch.nn.functional.grouped_mm``.
    """
    batched = original["batched_mm"]
    return {**original, **dict.fromkeys(_EXPERTS_REPLACED, batched)}
