"""int8 quantization of a finished ONNX model with onnxruntime's quantizer (``onnxruntime.quantization``).

Two modes (``OnnxConfig.quantize``, ``hf-exporters export --quantize``):

- ``int8-dynamic``: ``quantize_dynamic``: weights of ``MatMul``, ``Gemm`` and onnxruntime's fused
  ``Attention`` (and the other ops it knows) stored as int8 with one scale per output channel,
  activations quantized at run time per call (``DynamicQuantizeMatMul``, ``QAttention``); no
  calibrated ranges. Per-tensor weight scales cost all-MiniLM-L6-v2 too much: mean cosine of its sentence
  embeddings 0.966 against 0.994 per channel (``optimize="ort-cpu"``).
  A ``MatMul``/``Gemm`` whose activation has outliers stays float (:func:`outlier_matmuls`, measured on
  the calibration inputs): one range per call, spread over 256 steps, loses the typical values. In
  all-MiniLM-L6-v2 that is the feed-forward down projection of the first three layers: with them
  quantized too the worst of its 40 sentences has cosine 0.9866, with them float 0.9908, at 0.53 to
  0.61 of float32's latency instead of 0.46 to 0.57 (``benchmarks/onnx_speed.py``).
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

import numpy as np
import torch

from ..errors import InputError
from ..shapes import tensor_leaves

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


#: the ratio of an activation's max |x| to its standard deviation past which ``int8-dynamic`` leaves
#: the ``MatMul``/``Gemm`` that takes it in float: past it one uint8 step (range / 255) is more than a
#: quarter of the standard deviation, so most values of the tensor fall on a handful of steps
OUTLIER_RATIO = 64.0


def quantize_model(model: Any, mode: str, calibration: Iterable[Mapping[str, Any]] | None = None, keep_float: Iterable[str] = ()) -> Any:
    """The int8 ``onnx_ir.Model`` of ``model`` (an ``onnx_ir.Model``, left unchanged).

    ``calibration`` (``int8-static`` only): input sets keyed by graph input name (numpy arrays or
    torch tensors); inputs of the graph they do not name are an error. ``keep_float``: names of nodes
    left in float (for ``int8-dynamic``, :func:`outlier_matmuls` gives them).

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
        standard_attention += list(keep_float)
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


def outlier_matmuls(model: Any, calibration: Iterable[Mapping[str, Any]], ratio: float = OUTLIER_RATIO) -> list[str]:
    """Names of the ``MatMul``/``Gemm`` nodes of ``model`` (an ``onnx_ir.Model``, left unchanged) with a
    constant weight whose activation (first input) has outliers over the ``calibration`` input sets:
    max |x| above ``ratio`` times its standard deviation (all elements of all sets). In graph order.

    Raises:
        InputError: no calibration inputs, or inputs that do not name every graph input.
    """
    import onnx
    import onnx_ir as ir
    import onnxruntime as ort

    proto = ir.serde.serialize_model(model)
    constants = {i.name for i in proto.graph.initializer} | {n.output[0] for n in proto.graph.node if n.op_type == "Constant"}
    weighted = [n for n in proto.graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in constants]
    activations = list(dict.fromkeys(n.input[0] for n in weighted if n.input[0] not in constants))
    feeds = [_numpy_feeds(inputs, [v.name for v in model.graph.inputs]) for inputs in calibration]
    if not feeds:
        raise InputError("int8-dynamic needs calibration inputs to find the activations with outliers")
    if not activations:
        return []
    del proto.graph.output[:]
    proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in activations)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the tensors as the graph names them
    with tempfile.TemporaryDirectory(prefix="hfx-outliers-") as tmp:
        path = Path(tmp) / "probe.onnx"
        onnx.save(proto, str(path), save_as_external_data=True, location="probe.onnx.data")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        peak = dict.fromkeys(activations, 0.0)
        sums = {name: [0.0, 0.0, 0] for name in activations}  # sum, sum of squares, count (float64)
        for feed in feeds:
            for name, value in zip(activations, session.run(activations, feed), strict=True):
                x = np.asarray(value, dtype=np.float64)
                peak[name] = max(peak[name], float(np.abs(x).max(initial=0.0)))
                sums[name][0] += float(x.sum())
                sums[name][1] += float((x * x).sum())
                sums[name][2] += x.size
    outliers = set()
    for name, (total, squares, count) in sums.items():
        std = float(np.sqrt(max(squares / count - (total / count) ** 2, 0.0))) if count else 0.0
        if std > 0 and peak[name] > ratio * std:
            outliers.add(name)
    return [n.name for n in weighted if n.input[0] in outliers]


#: GELU ops, standard and onnxruntime's fused ones
_GELU_OPS = ("Gelu", "BiasGelu", "FastGelu")


def _numpy_feeds(inputs: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """``{graph input name: array}`` of one input set: by name, or, for nested inputs (a cache
    object, lists), their tensors in ``torch.export``'s flatten order when the counts agree.

    Raises:
        InputError: a graph input has no tensor.
    """
    leaves = tensor_leaves(dict(inputs), (torch.Tensor, np.ndarray))
    by_name = dict(leaves)
    nested = any(not isinstance(v, (torch.Tensor, np.ndarray)) for v in inputs.values())
    if nested and len(leaves) == len(names) and not all(n in by_name for n in names):
        by_name = {name: leaf for name, (_, leaf) in zip(names, leaves, strict=True)}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise InputError(f"calibration inputs lack the graph inputs {missing}")
    return {n: np.asarray(by_name[n].numpy() if isinstance(by_name[n], torch.Tensor) else by_name[n]) for n in names}


def _reader(base: type, feeds: list[dict[str, Any]]) -> Any:
    """An onnxruntime ``CalibrationDataReader`` (``base``) over a list of feeds."""

    class Reader(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self._feeds = iter(feeds)

        def get_next(self) -> dict[str, Any] | None:
            return next(self._feeds, None)

    return Reader()


__all__ = ["OUTLIER_RATIO", "QUANTIZE_MODES", "check_quantize", "outlier_matmuls", "quantize_model"]
