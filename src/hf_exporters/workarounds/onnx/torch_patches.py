"""OnnxExporter Stage 1: torch patches (``register_patch("onnx", "torch....")``), active for the trace
and the lowering."""

from __future__ import annotations

from typing import Any

from ...registry import register_patch


def _running_extreme(original: Any, largest: bool) -> Any:
    import torch

    def running(input: Any, dim: int) -> Any:  # noqa: A002 - torch's name
        length = input.shape[dim] if input.dim() else None
        if not isinstance(length, int) or isinstance(length, torch.SymInt) or input.dtype == torch.bool:
            return original(input, dim)
        x = input.movedim(dim, -1)
        position = torch.arange(length, device=x.device)
        earlier = position[None, :] <= position[:, None]  # [i, j]: j <= i
        grid = x.unsqueeze(-2).expand(*x.shape[:-1], length, length)  # [..., i, j] = x[..., j]
        info = torch.finfo(x.dtype) if x.is_floating_point() else torch.iinfo(x.dtype)
        neutral = torch.full((), info.min if largest else info.max, dtype=x.dtype)
        masked = torch.where(earlier, grid, neutral)
        values = masked.amax(-1) if largest else masked.amin(-1)
        attained = earlier & (grid == values.unsqueeze(-1))
        indices = torch.where(attained, position, torch.full((), -1, dtype=position.dtype)).amax(-1)
        result = (values.movedim(-1, dim), indices.movedim(-1, dim))
        return torch.return_types.cummax(result) if largest else torch.return_types.cummin(result)

    return running


@register_patch("onnx", "torch.cummax", "torch.Tensor.cummax")
def _patch_cummax_by_triangle(original: Any) -> Any:
    """Trace ``cummax`` over an axis of static length n as a masked max over an (n, n) lower triangle.

    Pattern: ``prev_special = torch.cummax(special_token_positions, dim=1)[0]`` (the last special token
    at or before each text position, in Grounding DINO's text-token masks). torchlib has no translation
    of ``aten.cummax`` ("No ONNX function found for aten.cummax.default") and ONNX has no running-max
    operator. Position i takes the max of the values at positions j <= i; its index is the last such
    j holding that max, as torch returns for equal values. The cost is n² elements per row, so only an
    axis whose length the trace fixed is rewritten; NaN ordering is not reproduced.
    Models: GroundingDinoModel, MMGroundingDinoModel (onnx in the sweep).
    Upstream: onnxscript function_libs/torch_lib/ops/core.py in onnxscript 0.7.2 (``aten_cummax`` raises
        NotImplementedError; no report found)
    Remove when: torchlib translates ``aten.cummax`` (e.g. with a Scan loop).
    """
    return _running_extreme(original, largest=True)


@register_patch("onnx", "torch.cummin", "torch.Tensor.cummin")
def _patch_cummin_by_triangle(original: Any) -> Any:
    """Trace ``cummin`` over an axis of static length n as a masked min over an (n, n) lower triangle.

    Pattern: ``torch.flip(torch.cummin(torch.flip(next_special, dims=[1]), dim=1)[0], dims=[1])`` (the next
    special token at or after each text position, Grounding DINO's text-token masks); torchlib has no ``aten.cummin`` translation
    ("No ONNX function found for aten.cummin.default"). Same construction and limits as
    :func:`_patch_cummax_by_triangle`, with min.
    Models: GroundingDinoModel, MMGroundingDinoModel (onnx in the sweep).
    Upstream: onnxscript function_libs/torch_lib/ops/core.py in onnxscript 0.7.2 (``aten_cummin`` raises
        NotImplementedError; no report found)
    Remove when: torchlib translates ``aten.cummin``.
    """
    return _running_extreme(original, largest=False)


@register_patch("onnx", "torch.histc", "torch.Tensor.histc")
def _patch_histc_equal_bounds(original: Any) -> Any:
    """``torch.histc`` with one bin and ``min == max``, in torch's meaning, which torchlib refuses.

    Pattern: transformers' ``grouped_mm`` experts count tokens per expert with
    ``torch.histc(ids, bins=num_experts, min=0, max=num_experts - 1)``; a model with one expert
    (HunYuan-MoE-V1's default config) asks for one bin with ``min == max == 0``, and torchlib raises
    "aten_histc with min == max (0.0) is not supported in this export path". torch reads equal
    bounds as the data's own range (widened by 1 on each side when the data hold one value), so a
    single bin counts every element (torch refuses data with NaN there). Several bins over the
    data's range still go to ``torch.histc``.
    Models: HunYuanMoEV1Model (onnx static in the sweep).
    Upstream: microsoft/onnxscript torchlib ``aten_histc`` (refuses min == max in onnxscript 0.7.2);
        torch semantics in aten/src/ATen/native/SummaryOps.cpp (``histc``)
    Remove when: torchlib translates histc with equal bounds.
    """
    import torch

    def histc(input: Any, bins: int = 100, min: float = 0, max: float = 0, *, out: Any = None) -> Any:  # noqa: A002 - torch's names
        if out is not None or bins != 1 or isinstance(min, torch.Tensor) or isinstance(max, torch.Tensor) or min != max:
            return original(input, bins=bins, min=min, max=max, out=out)
        return (~torch.isnan(input)).sum().to(input.dtype).reshape(1)

    return histc
