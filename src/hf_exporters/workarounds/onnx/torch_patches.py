"""torch ops and torch internals the ONNX lowering cannot take as they are: patches of OnnxExporter's
Stage 1 (Torch patches), active for the trace and the lowering.

Pattern: ops torchlib has no translation for (``cummax``/``cummin``) or refuses in one case
(``histc`` with equal bounds), ``aten.lstm`` whose kept composite op gets a fake rule that loops over
time, and the trace's floor-division patch, kept for the lowering's decompositions.
"""

from __future__ import annotations

from typing import Any

from ...registry import register_patch
from ..dynamo.symbolic_shapes import _patch_floordiv_cancels_without_simplify

#: the trace's floor-division patch (pattern and models in its docstring, in
#: :mod:`..dynamo.symbolic_shapes`), installed for the ONNX lowering's decompositions too
register_patch("onnx", "torch.utils._sympy.functions.sympy", stage="Stage 1: Torch patches")(_patch_floordiv_cancels_without_simplify)


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


@register_patch("onnx", "torch.cummax", "torch.Tensor.cummax", stage="Stage 1: Torch patches")
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


@register_patch("onnx", "torch.cummin", "torch.Tensor.cummin", stage="Stage 1: Torch patches")
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


@register_patch("onnx", "torch.histc", "torch.Tensor.histc", stage="Stage 1: Torch patches")
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


def _lstm_meta(input: Any, hx: Any, params: Any, *args: Any) -> Any:  # noqa: A002, ARG001 - torch's names
    """Outputs of ``aten.lstm.input`` shaped from the input's sizes alone (no loop over time), as new
    empty tensors of the input's kind (meta or fake).

    ``input`` (T, B, features) or, ``batch_first`` (the last positional argument), (B, T, features);
    ``hx`` = (h0, c0), h0 (layers x directions, B, hidden or proj_size) and c0 (layers x directions,
    B, hidden); output (T, B, directions x h0's last size), or its (B, T, ...) transpose with
    ``batch_first`` (the strides torch's own kernel gives), then h_n and c_n shaped as h0 and c0.
    """
    bidirectional, batch_first = bool(args[-2]), bool(args[-1])
    h0, c0 = hx
    width = (2 if bidirectional else 1) * h0.shape[2]
    if batch_first:
        output = input.new_empty((input.shape[1], input.shape[0], width)).transpose(0, 1)
    else:
        output = input.new_empty((input.shape[0], input.shape[1], width))
    return output, h0.new_empty(h0.shape), c0.new_empty(c0.shape)


def _lstm_shapes(fake_mode: Any, func: Any, *args: Any) -> Any:  # noqa: ARG001 - a fake rule's signature
    """The fake-tensor rule form of :func:`_lstm_meta`."""
    with fake_mode:
        return _lstm_meta(*args)


@register_patch("onnx", "torch.export.exported_program._override_composite_implicit_decomp", stage="Stage 1: Torch patches")
def _patch_lstm_kept_whole_with_symbolic_length(original: Any) -> Any:
    """Give ``aten.lstm.input`` a fake rule that reads sizes, while ``run_decompositions`` keeps it whole.

    Pattern: torch.onnx keeps ``aten.lstm.input`` undecomposed (torchlib lowers it to ONNX's ``LSTM``
    operator, which takes any sequence length), but ``ExportedProgram.run_decompositions`` computes a
    kept composite op's fake outputs with the op's own decomposition, a Python loop over the time
    steps, and that loop fixes the sequence length: the ONNX graph's token input ends with a fixed
    length (``decoder_input_ids[axis 1] = 4`` for an RNN-T prediction network) and every
    shape-dependent node is built for it. While torch registers its fake rule for the kept op, this
    patch puts one in its place that computes the outputs' shapes from the input's
    (:func:`_lstm_shapes`). The ``LSTM`` operator and its arithmetic are torchlib's, unchanged.
    Models: ParakeetForRNNT, ParakeetForTDT, NemotronAsrStreamingForRNNT, Nemotron3_5AsrForRNNT
        (onnx dynamic in the sweep), and any ``nn.LSTM`` exported to ONNX with a dynamic length.
    Upstream: pytorch/pytorch torch/export/exported_program.py (``_override_composite_implicit_decomp``
        registers ``_force_dispatch_to_orig_cia_callable`` as the kept op's fake rule) and
        torch/_decomp/decompositions.py (``one_layer_lstm`` loops in Python); no report found
    Remove when: torch gives ``aten.lstm.input`` a size-only fake rule, or the kept op's fake outputs
        come from a while_loop decomposition.
    """
    import contextlib

    import torch
    from torch._subclasses import fake_impls

    from torch._decomp import meta_table

    @contextlib.contextmanager
    def override(cia_ops_to_callable: Any) -> Any:
        op = torch.ops.aten.lstm.input
        with original(cia_ops_to_callable):
            if op not in cia_ops_to_callable or op in meta_table:
                yield
                return
            # fake tensors try the Python decomposition table before the fake rules unless the op has a
            # Python meta entry: the entry routes the op to the rule and is removed on exit
            fake_impls.op_implementations_dict[op] = _lstm_shapes  # dropped with torch's own rule on exit
            meta_table[op] = _lstm_meta
            try:
                yield
            finally:
                meta_table.pop(op, None)

    return override
