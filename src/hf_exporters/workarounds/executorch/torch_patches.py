"""torch ops the ExecuTorch backends reject: patches of ExecutorchExporter's Stage 2 (Torch patches),
active during the torch.export trace.

Pattern: an op that is not core ATen, has no portable kernel, or whose lowering specialises a
dynamic axis (``split_with_sizes_copy``, ``sort``, ``bucketize``, ``embedding_bag``,
``scatter_reduce``, ``erfinv``, ``repeat_interleave.Tensor``, 3-D convolutions, antialiased resizing
to sizes from data, ``cummax``/``cummin``), rewritten into core ATen ops that give the same values.
Model code ExecuTorch rejects is in :mod:`.complex_numbers` and :mod:`.moe`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...registry import register_patch
from .._packing import slice_index


def _static_size(tensor: Any, dim: int) -> int | None:

    size = tensor.shape[dim]
    return size if isinstance(size, int) and not isinstance(size, torch.SymInt) else None


def _narrowed(tensor: Any, dim: int, sizes: list[int]) -> tuple[Any, ...]:
    pieces, start = [], 0
    for size in sizes:
        pieces.append(tensor.narrow(dim, start, size))
        start += size
    return tuple(pieces)


@register_patch("executorch", "torch.Tensor.chunk", "torch.chunk", stage="Stage 2: Torch patches")
def _patch_chunk_as_narrow(original: Callable[..., Any]) -> Callable[..., Any]:
    """Trace ``chunk`` along a static axis as ``narrow`` views instead of ``split_with_sizes``.

    Pattern: ``gate, up = x.chunk(2, dim=-1)`` on a tensor whose other axes are dynamic lowers to
    ``split_with_sizes_copy``; ExecuTorch's edge verifier (``EdgeOpArgValidator``) re-runs that op and
    its list output specialises the dynamic batch to the trace hint (``set_replacement s0 = 1``), so
    the ``.pte`` refuses every other batch size ("Attempted to resize a static tensor" in
    ``aten::arange.start_out``). Views (``slice_copy``) keep the batch symbolic. Axes of dynamic size
    keep the original ``chunk``.
    Models: Phi3ForCausalLM (Phi3MLP), GPT-NeoX / Falcon style fused projections, every gated MLP
    that chunks a fused gate_up projection.
    Upstream: pytorch/executorch exir/verification/arg_validator.py (list-returning copy ops guard on
    symbolic sizes during verification)
    Remove when: to_edge verification keeps dynamic sizes of split_with_sizes_copy outputs symbolic.
    """

    def chunk(tensor: Any, chunks: int, dim: int = 0) -> tuple[Any, ...]:
        size = _static_size(tensor, dim)
        if size is None or chunks <= 0:
            return original(tensor, chunks, dim)
        step = -(-size // chunks)
        sizes = [min(step, size - start) for start in range(0, size, step)] if size else [0]
        return _narrowed(tensor, dim, sizes)

    return chunk


@register_patch("executorch", "torch.Tensor.split", "torch.split", stage="Stage 2: Torch patches")
def _patch_split_as_narrow(original: Callable[..., Any]) -> Callable[..., Any]:
    """Trace ``split`` along a static axis as ``narrow`` views instead of ``split_with_sizes``.

    Pattern: ``q, k, v = qkv.split(hidden, dim=-1)`` (an int or a list of sizes) on a tensor with
    dynamic batch or sequence lowers to ``split_with_sizes_copy``/``split_copy``, whose verification
    in ExecuTorch specialises the dynamic axes to the trace hint (see ``_patch_chunk_as_narrow``).
    Models: GPT2Model (c_attn split), BloomModel, Qwen2-VL vision blocks, any fused QKV projection.
    Upstream: pytorch/executorch exir/verification/arg_validator.py (list-returning copy ops guard on
    symbolic sizes during verification)
    Remove when: to_edge verification keeps dynamic sizes of split_copy outputs symbolic.
    """

    def split(tensor: Any, split_size_or_sections: Any, dim: int = 0) -> tuple[Any, ...]:
        size = _static_size(tensor, dim)
        if size is None:
            return original(tensor, split_size_or_sections, dim)
        if isinstance(split_size_or_sections, int) and split_size_or_sections > 0:
            step = split_size_or_sections
            sizes = [min(step, size - start) for start in range(0, size, step)] if size else [0]
        elif isinstance(split_size_or_sections, (list, tuple)) and all(isinstance(s, int) for s in split_size_or_sections):
            sizes = list(split_size_or_sections)
        else:
            return original(tensor, split_size_or_sections, dim)
        if sum(sizes) != size:  # let torch raise its own error
            return original(tensor, split_size_or_sections, dim)
        return _narrowed(tensor, dim, sizes)

    return split


@register_patch("executorch", "torch.argsort", "torch.Tensor.argsort", stage="Stage 2: Torch patches")
def _patch_argsort_as_topk(original: Callable[..., Any]) -> Callable[..., Any]:
    """Trace an unstable ``argsort`` as ``topk`` over the whole axis.

    Pattern: random patch masking in masked-image models (``ids_shuffle = torch.argsort(noise, dim=1)``,
    ``ids_restore = torch.argsort(ids_shuffle, dim=1)``). The program keeps ``aten.sort``, whose out
    variant ``aten::sort.values`` has no kernel in ExecuTorch's portable library, so the ``.pte``
    fails to load ("Failed to load method forward, error: 0x14", OperatorMissing).
    ``topk(x, k=x.shape[dim], largest=descending, sorted=True).indices`` orders the axis the same
    way through ``aten::topk.values``, which the portable library has. Equal keys are the one
    difference: their order is unspecified for ``stable=False`` in both ops and may differ from eager's
    (noise and permutation indices, the pattern here, have none), while ``stable=True`` and bool keys
    (``topk`` refuses bool) are left to the original, which then fails to load as before.
    Models: ViTMAEModel (executorch in the sweep) and other models shuffling patches by argsort.
    Upstream: pytorch/executorch kernels/portable (no ``sort`` kernel in executorch 1.4.1; no report found)
    Remove when: ExecuTorch's portable library registers ``aten::sort.values``.
    """

    def argsort(input: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> Any:  # noqa: A002 - torch's name

        if stable or input.dim() == 0 or input.dtype == torch.bool:
            return original(input, dim=dim, descending=descending, stable=stable)
        return torch.topk(input, input.shape[dim], dim=dim, largest=descending, sorted=True).indices

    return argsort


@register_patch("executorch", "torch.bucketize", stage="Stage 2: Torch patches")
def _patch_bucketize_by_comparison(original: Any) -> Any:
    """``torch.bucketize(x, boundaries)`` as a count of the boundaries below each value.

    Pattern: position ids from fractional patch coordinates, ``torch.bucketize(coords, boundaries,
    right=True)`` (Idefics3 / SmolVLM vision embeddings). ``aten.bucketize.Tensor`` is not in the core
    ATen opset ("SpecViolationError: Operator torch._ops.aten.bucketize.Tensor is not in Core ATen
    opset") and the portable kernel library has no ``bucketize`` kernel either. For 1-D boundaries
    the bucket index is the number of boundaries strictly below the value (``right=False``) or at or
    below it (``right=True``): a broadcast comparison and a sum, ``x.numel() * len(boundaries)``
    comparisons; NaN counts every boundary as below it, as torch's search does. Other calls (scalar
    input, N-D boundaries, ``out=``) go to ``torch.bucketize``.
    Models: Idefics3VisionTransformer, Idefics3Model, SmolVLMModel (executorch in the sweep).
    Upstream: executorch kernels/portable (no bucketize kernel in executorch 1.4.1); the op is not
        core ATen (pytorch/pytorch torch/_decomp has no decomposition)
    Remove when: ExecuTorch's portable library registers ``aten::bucketize.Tensor_out``.
    """

    def bucketize(input: Any, boundaries: Any, *, out_int32: bool = False, right: bool = False, out: Any = None) -> Any:
        if out is not None or not isinstance(input, torch.Tensor) or not isinstance(boundaries, torch.Tensor) or boundaries.dim() != 1:
            return original(input, boundaries, out_int32=out_int32, right=right, out=out)
        # "not above" rather than "below", so NaN lands after every boundary, as torch's search puts it
        below = ~(boundaries > input[..., None]) if right else ~(boundaries >= input[..., None])
        return below.sum(dim=-1, dtype=torch.int32 if out_int32 else torch.int64)

    return bucketize


@register_patch("executorch", "torch.nn.functional.embedding_bag", stage="Stage 2: Torch patches")
def _patch_embedding_bag_as_gather_and_reduce(original: Any) -> Any:
    """``F.embedding_bag`` over fixed-size bags as a row gather and a reduction.

    Pattern: a learned position grid resampled per patch as a weighted sum of table rows,
    ``F.embedding_bag(indices, table, per_sample_weights=weights, mode="sum")`` with ``indices`` and
    ``weights`` (patches, taps) (Kimi-K2.5's vision embeddings). The program keeps
    ``aten._embedding_bag``, for which ExecuTorch's kernel library has no kernel (loading fails with
    "the program calls operators this ExecuTorch runtime has no kernel for: aten::_embedding_bag.out").
    For 2-D ``input`` (bags, n), no offsets, no ``max_norm`` and no ``padding_idx``, the result is
    ``weight[input]`` (bags, n, dim), times ``per_sample_weights[..., None]`` when given, reduced over
    the bag by sum, mean or max: (bags, dim), as torch computes it. Other calls (1-D input with
    offsets, empty bags, norms, padding) go to ``F.embedding_bag``.
    Models: Kimi_K25VisionModel (executorch in the sweep).
    Upstream: executorch kernels/portable (no embedding_bag kernel in executorch 1.4.1); no report found
    Remove when: ExecuTorch's portable library registers ``aten::_embedding_bag.out``.
    """

    def embedding_bag(input: Any, weight: Any, offsets: Any = None, max_norm: Any = None, norm_type: float = 2, scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False, per_sample_weights: Any = None, include_last_offset: bool = False, padding_idx: Any = None) -> Any:  # noqa: A002 - torch's names
        plain = (
            isinstance(input, torch.Tensor) and input.dim() == 2 and offsets is None and max_norm is None and padding_idx is None
            and mode in ("sum", "mean", "max") and (per_sample_weights is None or mode == "sum")
            and not (isinstance(input.shape[1], int) and input.shape[1] == 0)
        )
        if not plain:
            return original(input, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset, padding_idx)
        rows = weight[input]  # (bags, n, dim)
        if per_sample_weights is not None:
            rows = rows * per_sample_weights.to(rows.dtype)[..., None]
        if mode == "sum":
            return rows.sum(dim=1)
        return rows.mean(dim=1) if mode == "mean" else rows.amax(dim=1)

    return embedding_bag


@register_patch("executorch", "torch.Tensor.scatter_reduce", "torch.scatter_reduce", stage="Stage 2: Torch patches")
def _patch_scatter_reduce_1d_by_scatter_add(original: Any) -> Any:
    """1-D ``scatter_reduce`` (sum, mean, amax, amin) from ``scatter_add`` and a dense comparison.

    Pattern: segment reductions, ``torch.zeros(segments).scatter_reduce(0, index, values, reduce="mean",
    include_self=False)`` (TAPAS's cell and column averages). ExecuTorch's kernel library has no
    ``scatter_reduce`` kernel: loading fails with "the program calls operators this ExecuTorch runtime has
    no kernel for: aten::scatter_reduce.two_out". For a 1-D ``self`` (segments,) and 1-D ``index`` and
    ``src`` (n,) along dim 0, ``sum`` and ``mean`` are ``scatter_add`` of the values and of ones (the
    contribution counts), ``amax``/``amin`` the max/min over a (segments, n) mask of ``index == segment``;
    ``self`` takes part as torch's ``include_self`` says, and a segment nothing points to keeps its
    value when ``include_self=False``. Other calls (N-D, ``prod``, ``out=``) go to torch's op.
    Models: TapasModel (executorch in the sweep).
    Upstream: executorch kernels/portable (no scatter_reduce kernel in executorch 1.4.1); no report found
    Remove when: ExecuTorch's portable library registers ``aten::scatter_reduce.two_out``.
    """

    def scatter_reduce(input: Any, dim: int, index: Any, src: Any, reduce: str, *, include_self: bool = True, out: Any = None) -> Any:  # noqa: A002 - torch's names
        plain = (
            out is None and isinstance(input, torch.Tensor) and isinstance(index, torch.Tensor) and isinstance(src, torch.Tensor)
            and input.dim() == index.dim() == src.dim() == 1 and dim in (0, -1) and reduce in ("sum", "mean", "amax", "amin")
            and input.dtype.is_floating_point and src.dtype == input.dtype
        )
        if not plain:  # the Tensor method takes no out=
            extra = {} if out is None else {"out": out}
            return original(input, dim, index, src, reduce, include_self=include_self, **extra)
        src = src[: index.shape[0]]
        # counted in integers (a bf16 count is inexact past 256), as torch counts
        count = torch.zeros(input.shape, dtype=torch.long, device=input.device).scatter_add(0, index, torch.ones_like(index))
        touched = count > 0
        if reduce in ("sum", "mean"):
            # added onto self in torch's order (the same rounding as torch's op)
            total = (input if include_self else torch.zeros_like(input)).scatter_add(0, index, src)
            if include_self:
                count = count + 1
            result = total / count.clamp(min=1) if reduce == "mean" else total
        else:
            segments = torch.arange(input.shape[0], device=input.device)
            hit = index[None, :] == segments[:, None]  # (segments, n)
            fill = torch.tensor(float("-inf") if reduce == "amax" else float("inf"), dtype=input.dtype, device=input.device)
            # one column of the fill value: an empty index still reduces over something
            spread = torch.cat([torch.where(hit, src[None, :], fill), fill.expand(input.shape[0], 1)], dim=1)
            result = spread.amax(dim=1) if reduce == "amax" else spread.amin(dim=1)
            if include_self:
                result = torch.maximum(result, input) if reduce == "amax" else torch.minimum(result, input)
        return torch.where(touched, result, input)

    return scatter_reduce


@register_patch("executorch", "torch.erfinv", "torch.Tensor.erfinv", "torch.special.erfinv", stage="Stage 2: Torch patches")
def _patch_erfinv_by_polynomial(_original: Any) -> Any:
    """``torch.erfinv`` as Giles' single-precision polynomials in elementwise ops.

    Pattern: a normal quantile ``Normal(0, 1).icdf(p)``, which calls ``torch.erfinv`` (Gemma 3n's
    activation sparsity computes its cut-off from the target sparsity in forward). ``aten.erfinv`` is
    not in the core ATen opset ("SpecViolationError: Operator torch._ops.aten.erfinv.default is not
    in Core ATen opset") and the portable library has no kernel for it. The polynomials
    (:mod:`hf_exporters.workarounds._erfinv`, shared with the ONNX translation) are float32-grade,
    relative error about 4e-7; ±1 give ±inf and |x| > 1 NaN.
    Models: Gemma3nTextModel, Gemma3nForCausalLM (executorch in the sweep).
    Upstream: executorch kernels/portable (no erfinv kernel in executorch 1.4.1); pytorch/pytorch
        (``aten.erfinv`` has no core-ATen decomposition)
    Remove when: ExecuTorch registers an ``erfinv`` kernel or torch decomposes it.
    """
    from .._erfinv import erfinv_torch

    def erfinv(input: Any, *, out: Any = None) -> Any:  # noqa: A002 - torch's name
        if out is not None:
            return _original(input, out=out)
        return erfinv_torch(input)

    return erfinv


@register_patch("executorch", "torch.repeat_interleave", "torch.Tensor.repeat_interleave", stage="Stage 2: Torch patches")
def _patch_repeat_interleave_by_counts(original: Any) -> Any:
    """``repeat_interleave`` by a 1-D tensor of counts as a gather of the slices each position falls in.

    Pattern: packed vision towers expand per-image sizes to per-frame ones,
    ``torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0])`` (transformers'
    ``get_vision_cu_seqlens``). The program keeps ``aten.repeat_interleave.Tensor``, which is not in
    the core ATen opset ("SpecViolationError: Operator torch._ops.aten.repeat_interleave.Tensor is not
    in Core ATen opset") and has no portable kernel. With counts ``r`` (n,), output position ``p`` takes
    slice ``i``, the number of cumulative counts ``cumsum(r)`` at or below ``p``: a broadcast
    comparison and a sum over ``total x n`` pairs, then ``index_select`` along ``dim`` (of the flattened
    input when ``dim`` is None). ``total`` is ``output_size`` when given, else ``r.sum()`` read from the
    data (an unbacked size). A single count (one element or 0-d) applies to every slice, as in torch;
    an int count goes to the original.
    Models: Glm4vVisionModel, Glm4vMoeVisionModel, GlmOcrVisionModel, Glm5NextVisionModel,
    HunYuanVLVisionTransformer, Inkling2VisionModel, Qwen2_5_VisionTransformerPretrainedModel
    (executorch in the sweep).
    Upstream: executorch kernels/portable (no ``repeat_interleave.Tensor`` kernel in executorch 1.4.1);
        pytorch/pytorch (the op has no core ATen decomposition; no report found)
    Remove when: the op decomposes to core ATen or ExecuTorch registers a kernel for it.
    """

    def repeat_interleave(input: Any, repeats: Any = None, dim: Any = None, *, output_size: Any = None) -> Any:  # noqa: A002 - torch's name
        counts = input if repeats is None else repeats
        if not isinstance(counts, torch.Tensor) or counts.dim() > 1 or (repeats is None and counts.dim() != 1):
            if repeats is None:
                return original(input, output_size=output_size)
            return original(input, repeats, dim, output_size=output_size)
        if repeats is not None:
            if dim is None:
                input, dim = input.reshape(-1), 0  # noqa: A001
            counts = counts.reshape(-1).expand(input.shape[dim])  # one count for every slice broadcasts
        total = output_size if output_size is not None else counts.sum().item()
        torch._check(total >= 0)
        slice_of = slice_index(torch.cumsum(counts, 0), total)
        if repeats is None:
            return slice_of.to(counts.dtype)
        return input.index_select(dim, slice_of)

    return repeat_interleave


def _all_equal(value: Any, expected: int, rank: int = 3) -> bool:
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * rank
    return len(values) == rank and all(v == expected for v in values)


@register_patch("executorch", "torch.nn.functional.conv3d", stage="Stage 2: Torch patches")
def _patch_conv3d_patchify_as_conv2d(original: Any) -> Any:
    """A 3-D convolution whose stride equals its kernel (a patch embedding) as a 2-D one over slices.

    Pattern: video-capable vision towers embed each ``(t, p, p)`` patch of every frame with
    ``nn.Conv3d(channels, dim, kernel_size=(t, p, p), stride=(t, p, p))``. XNNPACK does not take 3-D
    convolutions and the portable kernel takes only 3-D or 4-D inputs, so the program lowered and then
    failed in the runtime: "Check failed (in.dim() == 3 || in.dim() == 4): Expect input tensor to be
    3-D or 4-D, but got, 5." (error 0x12 in ``aten::convolution.out``). Without overlap, each output
    temporal slice of ``kt`` frames is independent: the input (N, C, T, H, W) is cropped to whole slices
    and reshaped to (N * T/kt, C * kt, H, W), a 2-D convolution with the weight viewed as
    (dim, C * kt, kh, kw) and stride (kh, kw) embeds it (tensors of at most 6 axes, which XNNPACK
    takes), and the result is permuted back to (N, dim, T/kt, H/kh, W/kw). The same numbers up to the
    order of the sums. Other convolutions (padding, dilation, groups, overlap) go to the original.
    Models: Qwen2-VL, Qwen2.5-VL, Qwen3-VL(-MoE), Qwen3.5 and GLM-4V-style vision towers (executorch).
    Upstream: executorch kernels/portable/cpu/op_convolution.cpp (no 3-D convolution) and
        backends/xnnpack (no 3-D convolution config); no report found
    Remove when: ExecuTorch runs 3-D convolutions (portable kernel or XNNPACK).
    """

    def conv3d(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Any:  # noqa: A002 - torch's name
        kernel = tuple(weight.shape[2:])
        strides = tuple(stride) if isinstance(stride, (tuple, list)) else (stride,) * 3
        if (
            input.dim() != 5
            or groups != 1
            or strides != kernel
            or isinstance(padding, str) and (padding != "valid")
            or not isinstance(padding, str) and not _all_equal(padding, 0)
            or not _all_equal(dilation, 1)
        ):
            return original(input, weight, bias, stride, padding, dilation, groups)
        kt, kh, kw = kernel
        n, c, ot = input.shape[0], input.shape[1], input.shape[2] // kt
        frames = input[:, :, : ot * kt].reshape(n, c, ot, kt, input.shape[3], input.shape[4]).permute(0, 2, 1, 3, 4, 5)
        frames = frames.reshape(n * ot, c * kt, input.shape[3], input.shape[4])
        out = torch.nn.functional.conv2d(frames, weight.reshape(weight.shape[0], c * kt, kh, kw), bias, (kh, kw))
        return out.reshape(n, ot, *out.shape[1:]).permute(0, 2, 1, 3, 4).contiguous()

    return conv3d


def _antialiased_bilinear_weights(out_size: Any, in_size: int, like: torch.Tensor) -> torch.Tensor:
    """(out_size, in_size) weights of torch's antialiased bilinear resampling along one axis
    (``align_corners=False``): output ``i`` centred at ``(i + 0.5) * scale`` in input pixels,
    ``scale = in_size / out_size``, takes input ``j`` with the triangle filter
    ``max(0, 1 - |j + 0.5 - centre| / max(scale, 1))``, each row normalised to sum 1. The scale is a
    tensor, so an ``out_size`` read from data stays symbolic."""
    out = torch.arange(out_size, dtype=torch.float64, device=like.device)
    scale = in_size / torch.ones_like(out).sum()
    width = torch.clamp(scale, min=1.0)
    centre = (out + 0.5) * scale
    taps = torch.arange(in_size, dtype=torch.float64, device=like.device)
    weights = torch.clamp(1 - ((taps[None, :] + 0.5 - centre[:, None]) / width).abs(), min=0)
    return (weights / weights.sum(-1, keepdim=True)).to(like.dtype)


@register_patch("executorch", "torch.nn.functional.interpolate", stage="Stage 2: Torch patches")
def _patch_antialiased_bilinear_to_sizes_from_data(original: Any) -> Any:
    """Antialiased bilinear resizing to a size read from data, as two matmuls with resampling weights.

    Pattern: SigLIP 2 resizes its position-embedding grid to each image's patch grid,
    ``F.interpolate(pos, size=(h, w), mode="bilinear", antialias=True)`` with ``h, w`` from
    ``spatial_shapes.tolist()``. ExecuTorch's ``_upsample_bilinear2d_aa.out`` kernel checks the planned
    output against the requested size instead of resizing it, so the program failed in the runtime:
    "[op_upsample_bilinear2d_aa.cpp:246] Check failed (out.size(2) == output_size[0])" (error 0x12).
    Resampling is linear along each axis: with ``W_h`` (h, H) and ``W_w`` (w, W) from
    :func:`_antialiased_bilinear_weights`, the output of a (N, C, H, W) input is ``W_h @ x @ W_w^T``,
    (N, C, h, w), equal to torch's kernel up to rounding (torch's CPU kernel differs when the output
    width is 1 and the height grows: it repeats one row). Only 4-D inputs with ``mode="bilinear"``,
    ``antialias=True``, ``align_corners`` False and a ``size`` holding a size read from data take this
    path; every other call goes to the original (sizes known at export run the kernel as before).
    Models: Siglip2VisionModel, Siglip2Model (executorch).
    Upstream: executorch kernels/portable/cpu/op_upsample_bilinear2d_aa.cpp (no resize of a
        dynamically sized output; no report found)
    Remove when: the kernel resizes its output to ``output_size``.
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    def interpolate(input: Any, size: Any = None, scale_factor: Any = None, mode: str = "nearest", align_corners: Any = None, recompute_scale_factor: Any = None, antialias: bool = False) -> Any:  # noqa: A002 - torch's name
        sizes = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        from_data = any(isinstance(s, torch.SymInt) and free_unbacked_symbols(s) for s in sizes)
        if not (from_data and antialias and mode == "bilinear" and not align_corners and input.dim() == 4 and scale_factor is None):
            return original(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
        rows = _antialiased_bilinear_weights(sizes[0], input.shape[2], input)
        cols = _antialiased_bilinear_weights(sizes[1], input.shape[3], input)
        return torch.matmul(torch.matmul(rows, input), cols.t())

    return interpolate


def _running_extreme(values: torch.Tensor, dim: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Running maximum (``largest``) or minimum of an integer tensor along ``dim`` from core ATen ops.

    Shapes: ``values`` (..., n, ...) with ``n`` along ``dim``; returns (values, indices) of its shape,
    ``indices`` int64. Position ``i`` compares every ``j <= i`` through an (..., n, n) broadcast (memory
    grows with ``n**2``), takes the extreme with ``amax``/``amin``, and the last ``j <= i`` holding it
    as the index, which is the tie rule of torch's CPU ``cummax``/``cummin`` (``cummax([1, 1])`` ->
    indices ``[0, 1]``).
    """
    x = values.movedim(dim, -1)
    n = x.shape[-1]
    position = torch.arange(n, device=x.device)
    seen = position[None, :] <= position[:, None]  # (n, n): [i, j] = j <= i
    pairs = x.unsqueeze(-2).expand(*x.shape[:-1], n, n)  # [..., i, j] = x[..., j]
    info = torch.iinfo(x.dtype)
    fill = info.min if largest else info.max
    masked = pairs.masked_fill(~seen, fill)
    extreme = masked.amax(-1) if largest else masked.amin(-1)
    holds = (pairs == extreme.unsqueeze(-1)) & seen
    index = torch.where(holds, position, -1).amax(-1)
    return extreme.movedim(-1, dim), index.movedim(-1, dim)


def _keeps_torch_running_extreme(input: torch.Tensor, dim: int, kwargs: dict[str, Any]) -> bool:
    """Whether a ``cummax``/``cummin`` call goes to torch's own op: ``out=``, a floating, complex or
    boolean input (NaN handling stays torch's), a 0-d input, or an axis of size 0 (nothing to compare;
    a dynamic axis is assumed non-empty)."""
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    if kwargs or input.dtype.is_floating_point or input.dtype.is_complex or input.dtype == torch.bool or input.dim() == 0:
        return True
    return guard_or_false(input.shape[dim] == 0)


def _running_extreme_op(original: Any, largest: bool) -> Any:
    """``cummax`` (``largest``) or ``cummin`` computed by :func:`_running_extreme`, torch's own
    ``original`` for the calls :func:`_keeps_torch_running_extreme` names."""
    result_type = torch.return_types.cummax if largest else torch.return_types.cummin

    def running_extreme(input: torch.Tensor, dim: int, **kwargs: Any) -> Any:
        if _keeps_torch_running_extreme(input, dim, kwargs):
            return original(input, dim, **kwargs)
        return result_type(_running_extreme(input, dim, largest))

    running_extreme.__name__ = running_extreme.__qualname__ = "cummax" if largest else "cummin"
    return running_extreme


@register_patch("executorch", "torch.cummax", "torch.Tensor.cummax", stage="Stage 2: Torch patches")
def _patch_cummax_of_integers_as_core_ops(original: Any) -> Any:
    """``cummax`` of an integer tensor from broadcast comparisons and ``amax`` (:func:`_running_extreme`).

    Pattern: text-token bookkeeping takes a running maximum of positions: the previous special
    token of each token (Grounding DINO, MM Grounding DINO ``generate_masks_with_special_tokens_and_transfer_map``),
    the last ``<im_start>`` (Qwen3-Omni-MoE), the last end-of-sequence (Qwen4Exp), a group start
    (ESMFold2). ``aten.cummax`` is not in the core ATen opset ("SpecViolationError: Operator
    torch._ops.aten.cummax.default is not in Core ATen opset") and has no ExecuTorch kernel. Same
    values and indices as torch; the calls :func:`_keeps_torch_running_extreme` names go to the
    original.
    Models: MMGroundingDinoModel (executorch in the sweep).
    Upstream: pytorch/pytorch core ATen opset (``cummax``/``cummin`` have no decomposition into core
        ops); executorch kernels/portable (no ``cummax`` kernel in executorch 1.4.1)
    Remove when: torch decomposes ``cummax`` into core ATen ops, or ExecuTorch adds a kernel.
    """

    return _running_extreme_op(original, largest=True)


@register_patch("executorch", "torch.cummin", "torch.Tensor.cummin", stage="Stage 2: Torch patches")
def _patch_cummin_of_integers_as_core_ops(original: Any) -> Any:
    """``cummin`` of an integer tensor from broadcast comparisons and ``amin`` (:func:`_running_extreme`).

    Pattern: the running minimum that pairs with :func:`_patch_cummax_of_integers_as_core_ops`: the
    next special token of each token, a flipped ``cummin`` (Grounding DINO, MM Grounding DINO).
    ``aten.cummin`` is not core ATen either. Same values and indices as torch; the calls
    :func:`_keeps_torch_running_extreme` names go to the original.
    Models: MMGroundingDinoModel (executorch in the sweep).
    Upstream: pytorch/pytorch core ATen opset (``cummin`` has no decomposition into core ops);
        executorch kernels/portable (no ``cummin`` kernel in executorch 1.4.1)
    Remove when: torch decomposes ``cummin`` into core ATen ops, or ExecuTorch adds a kernel.
    """

    return _running_extreme_op(original, largest=False)


