"""Export configurations, one per exporter; each extends the one before it."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class DynamoConfig:
    """Options of :class:`~hf_exporters.DynamoExporter` (``torch.export``).

    Attributes:
        dynamic: export with symbolic shapes. With no ``dynamic_shapes``, every axis of every tensor
            input (cache tensors included) is marked ``Dim.AUTO``; axes that end static are reported.
        dynamic_shapes: an explicit ``dynamic_shapes`` argument for ``torch.export.export``, keyed by
            input name; takes precedence over ``dynamic``.
        strict: trace with TorchDynamo (``strict=True``) instead of the default non-strict Python trace.
        prefer_deferred_runtime_asserts_over_guards: turn guards that cannot be decided at trace time
            into runtime asserts in the graph instead of failing the export.
        on_static_axis: what a dynamic export does when an axis asked to be dynamic ends static (its
            placeholder fixed, or an input guard pinning it to the example's size): ``"warn"`` logs it
            and records it in ``export.json`` (``static_axes``); ``"error"`` fails the export
            (ExportStageError at "Stage 4: Dynamic shapes").
    """

    dynamic: bool = False
    dynamic_shapes: dict[str, Any] | None = None
    strict: bool = False
    prefer_deferred_runtime_asserts_over_guards: bool = False
    on_static_axis: str = "warn"

    def __post_init__(self) -> None:
        if self.on_static_axis not in ("warn", "error"):
            raise ValueError(f"on_static_axis must be 'warn' or 'error', not {self.on_static_axis!r}")


@dataclasses.dataclass
class OnnxConfig(DynamoConfig):
    """Options of :class:`~hf_exporters.OnnxExporter` (``torch.onnx`` + onnxscript).

    Attributes:
        opset_version: ONNX opset of the default domain; None takes the level's default
            (``hf_exporters.exporters.onnx_optimize.default_opset``: 23, the fastest in onnxruntime
            1.32 CPU with eager's result on fully masked rows; 22 at ``optimize="ort-cpu"``).
        external_data: store weights next to the ``.onnx`` file (required past the 2 GB protobuf limit).
        optimize: the optimisation level: ``"none"``; ``"default"`` (or True), the onnxscript optimizer
            (constant folding, dead code, function inlining); ``"ort-cpu"``, that and onnxscript's
            onnxruntime fusions (attention, skip layer norm, bias GELU, rotary embeddings) into
            onnxruntime's ``com.microsoft`` ops. False is ``"none"``. The optimizer is turned off
            automatically for the model classes in ``ONNX_DISABLE_OPTIMIZE``.
        output_path: when set, the ONNX model is saved there after export.
        quantize: ``"int8-dynamic"`` or ``"int8-static"`` (onnxruntime's quantizer, after the
            fusions; ``hf_exporters.exporters.onnx_quantize``), None for float.
        calibration_inputs: the input sets ``int8-static`` calibrates on and ``int8-dynamic`` finds the
            activations with outliers on (their ``MatMul`` stays float); None: the export's example inputs.
    """

    opset_version: int | None = None
    external_data: bool = True
    optimize: bool | str = True
    output_path: str | None = None
    quantize: str | None = None
    calibration_inputs: list[dict[str, Any]] | None = None


@dataclasses.dataclass
class ExecutorchConfig(DynamoConfig):
    """Options of :class:`~hf_exporters.ExecutorchExporter`.

    Attributes:
        backend: the ExecuTorch backend preparer to use: ``"xnnpack"`` (CPU float32, XNNPACK delegate),
            ``"portable"`` (no delegate, portable kernels) or ``"cuda"`` (CUDA bfloat16, CUDA delegate).
        max_seq_len: upper bound of every dynamic axis (sequence, cache, batch): ExecuTorch plans memory
            for the largest size, so a longer input is refused at run time. None: 128 (or the example's size
            when larger). It also lowers a larger bound the trace took from the model (a position table's
            ``max_position_embeddings``); a bound equal to a ``max`` that ``dynamic_shapes`` give is kept, and so is
            the bound of a size read from data. A generation folder's prompt plus new tokens must fit in it.
        quantize: ``"8da4w"`` or ``"8da8w"``: the linear layers quantized with torchao in Stage 1 (int8
            dynamic activations, int4 or int8 weights; ``hf_exporters.exporters.executorch_quantize``),
            None for float.
        group_size: input features per weight scale with ``quantize`` (a power of 2, at least 32); None: the mode's
            default (32 for ``8da4w``, one scale per output channel for ``8da8w``, which takes no group size).
        quantize_embeddings: ``"8w"``: every ``nn.Embedding`` table in int8 (one scale per row), looked up
            by ExecuTorch's ``quantized_decomposed::embedding_byte`` kernel; None for float.
        one_program: a generation folder's parts (prefill, decode, encoder) as the methods of one program,
            lowered in one ``to_edge_transform_and_lower`` call and written as one ``model.pte`` whose
            methods share the weights (stored once); False: one ``.pte`` per part. A single export has one
            method, ``forward``, either way.
    """

    backend: str = "xnnpack"
    max_seq_len: int | None = None
    quantize: str | None = None
    group_size: int | None = None
    quantize_embeddings: str | None = None
    one_program: bool = True
