"""int8 quantization of a finished ONNX model with onnxruntime's quantizer (``onnxruntime.quantization``).

Two modes (``OnnxConfig.quantize``, ``hf-exporters export --quantize``):

- ``int8-dynamic``: ``quantize_dynamic``: weights of ``MatMul``, ``Gemm`` and onnxruntime's fused
  ``Attention`` (and the other ops it knows) stored as int8 with one scale per output channel,
  activations quantized at run time per call (``DynamicQuantizeMatMul``, ``QAttention``); no
  calibration. Per-tensor weight scales cost all-MiniLM-L6-v2 too much: mean cosine of its sentence
  embeddings 0.966 against 0.994 per channel (``optimize="ort-cpu"``).
- ``int8-static``: ``quantize_static`` in the QDQ format: ``MatMul``/``Gemm`` only, weights int8 per
  channel, activations uint8 with ranges calibrated (min/max) on ``calibration`` inputs: tokenizer
  encodings of real sentences when the pipeline has a tokenizer
  (:data:`hf_exporters.runtime.embedding_accuracy.SENTENCES`), else the export's example inputs.
  A ``MatMul`` that takes a GELU's output (the feed-forward down projection) stays float: its input's
  long tail makes one min/max range too coarse (all-MiniLM-L6-v2: mean cosine 0.94 with it
  quantized, 0.991 without).

The ONNX-domain ``Attention`` op (opset 23 on) is left in float: onnxruntime 1.32's quantizer takes
every node named ``Attention`` for its own ``com.microsoft`` one and writes a ``QAttention`` that
onnxruntime then refuses to load ("This is an invalid model ... QAttention").

A quantized artifact cannot match eager element by element; its accuracy is measured against the
float32 eager model on real data instead (:mod:`hf_exporters.runtime.embedding_accuracy`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import InputError

#: the quantization modes
QUANTIZE_MODES = ("int8-dynamic", "int8-static")


def check_quantize(mode: str | None) -> str | None:
    """``mode`` when it is None or one of :data:`QUANTIZE_MODES`.

    Raises:
        InputError: an unknown mode (the message lists the modes).
    """
    if mode is not None and mode not in QUANTIZE_MODES:
        raise InputError(f"unknown quantization {mode!r}; choose one of: {', '.join(QUANTIZE_MODES)}")
    return mode


def quantize_model(model: Any, mode: str, calibration: Iterable[Mapping[str, Any]] | None = None) -> Any:
    """The int8 ``onnx_ir.Model`` of ``model`` (an ``onnx_ir.Model``, left unchanged).

    ``calibration`` (``int8-static`` only): input sets keyed by graph input name (numpy arrays or
    torch tensors); inputs of the graph they do not name are an error.

    Raises:
        InputError: an unknown mode, or ``int8-static`` without calibration inputs.
    """
    import onnx
    import onnx_ir as ir
    from onnxruntime import quantization

    check_quantize(mode)
    proto = ir.serde.serialize_model(model)
    with tempfile.TemporaryDirectory(prefix="hfx-quantize-") as tmp:
        output = Path(tmp) / "quantized.onnx"
        standard_attention = [n.name for n in proto.graph.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]
        if mode == "int8-dynamic":
            quantization.quantize_dynamic(
                proto, output, weight_type=quantization.QuantType.QInt8, per_channel=True, nodes_to_exclude=standard_attention
            )
        else:
            gelu = {n.output[0] for n in proto.graph.node if n.op_type in _GELU_OPS}
            after_gelu = [n.name for n in proto.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[0] in gelu]
            feeds = [_numpy_feeds(inputs, [v.name for v in model.graph.inputs]) for inputs in (calibration or [])]
            if not feeds:
                raise InputError("int8-static quantization needs calibration inputs")
            quantization.quantize_static(
                proto,
                output,
                _reader(quantization.CalibrationDataReader, feeds),
                quant_format=quantization.QuantFormat.QDQ,
                op_types_to_quantize=["MatMul", "Gemm"],
                activation_type=quantization.QuantType.QUInt8,
                weight_type=quantization.QuantType.QInt8,
                per_channel=True,
                nodes_to_exclude=standard_attention + after_gelu,
            )
        return ir.from_proto(onnx.load(str(output)))


#: GELU ops, standard and onnxruntime's fused ones
_GELU_OPS = ("Gelu", "BiasGelu", "FastGelu")


def _numpy_feeds(inputs: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    import numpy as np

    missing = [n for n in names if n not in inputs]
    if missing:
        raise InputError(f"calibration inputs lack the graph inputs {missing}")
    return {n: np.asarray(inputs[n].numpy() if hasattr(inputs[n], "numpy") else inputs[n]) for n in names}


def _reader(base: type, feeds: list[dict[str, Any]]) -> Any:
    """An onnxruntime ``CalibrationDataReader`` (``base``) over a list of feeds."""

    class Reader(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self._feeds = iter(feeds)

        def get_next(self) -> dict[str, Any] | None:
            return next(self._feeds, None)

    return Reader()


__all__ = ["QUANTIZE_MODES", "check_quantize", "quantize_model"]
