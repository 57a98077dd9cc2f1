"""How far an ONNX export is optimised for onnxruntime, and the opset it targets.

Three levels (``OnnxConfig.optimize``, ``hf-exporters export --optimize``):

- ``none``: the graph torch.onnx lowers, unoptimised (no constant folding, no function inlining).
- ``default``: the onnxscript optimizer (constant folding, dead code, inlining), then the IR fixes.
  The graph keeps standard ONNX ops only and runs in any ONNX runtime.
- ``ort-cpu``: ``default``, then onnxscript's onnxruntime fusions
  (``onnxscript.rewriter.ort_fusions.optimize_for_ort``): attention into ``com.microsoft.Attention``
  (packed Q/K/V) or ``MultiHeadAttention``, ``Add`` + ``LayerNormalization`` into
  ``SkipLayerNormalization``, GELU with its bias into ``BiasGelu``, RMS norms, and rotary embeddings
  where they apply. The graph then needs onnxruntime (its ``com.microsoft`` contrib ops).

The default opset (:func:`default_opset`) is the one measured fastest in
the pinned onnxruntime on CPU while matching eager on every row; see :func:`default_opset`.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import InputError

logger = logging.getLogger("hf_exporters")

#: the optimisation levels, least first
OPTIMIZE_LEVELS = ("none", "default", "ort-cpu")

#: the default-domain opset of an export at level ``none`` or ``default`` when none is asked for
#: (see :func:`default_opset`)
DEFAULT_OPSET = 23

#: the newest opset whose SDPA lowering onnxscript's attention fusion matches: from opset 23 on,
#: torch.onnx emits the ONNX ``Attention`` op, which ``optimize_for_ort`` leaves as it is
FUSABLE_ATTENTION_MAX_OPSET = 22


def optimize_level(value: bool | str | None) -> str:
    """The level named by ``value``: ``True`` is ``"default"``, ``False`` and ``None`` are ``"none"``.

    Raises:
        InputError: ``value`` names no level (the message lists the levels).
    """
    if value is True:
        return "default"
    if value is False or value is None:
        return "none"
    if value not in OPTIMIZE_LEVELS:
        raise InputError(f"unknown optimisation level {value!r}; choose one of: {', '.join(OPTIMIZE_LEVELS)}")
    return value


#: the oldest opset torch.onnx's dynamo exporter lowers to
MIN_OPSET = 18


def newest_opset() -> int:
    """The newest default-domain opset both onnxscript's version converter and ``onnx`` support."""
    import onnx
    from onnxscript.version_converter import _version_converter

    return min(_version_converter.SUPPORTED_MAX_ONNX_OPSET, onnx.defs.onnx_opset_version())


def check_opset(opset: int) -> int:
    """``opset`` when torch.onnx and the installed onnx and onnxscript can target it.

    Raises:
        InputError: ``opset`` is below :data:`MIN_OPSET` or above the newest supported (the message
            gives the range).
    """
    newest = newest_opset()
    if not MIN_OPSET <= opset <= newest:
        raise InputError(f"opset {opset} is not supported: choose one from {MIN_OPSET} to {newest} (onnx and onnxscript installed)")
    return opset


def default_opset(level: str, newest: int) -> int:
    """The opset an export at ``level`` targets when none is asked for.

    :data:`DEFAULT_OPSET` (23) at levels ``none`` and ``default``, measured on all-MiniLM-L6-v2 in
    onnxruntime 1.32 CPU (2 threads, sequence 128, batch 1 and 8, ``benchmarks/onnx_speed.py``,
    ``benchmarks/results/onnx_speed.json``):

    - from opset 23 SDPA is lowered to the ONNX ``Attention`` op. onnxruntime 1.32 has a CPU kernel
      for ``Attention``-23 but none for ``Attention``-24, which it runs as its function body (556
      nodes after its optimizer instead of 160 for MiniLM: casts, identities, a ``Where`` per mask
      step): opset 23 took 0.92x (batch 1) and 0.95x (batch 8) the CPU time of opset 25 (the
      ``onnx_speed.json`` of commit 10a9543, whose run had an opset-25 row; later runs compare opsets 22 and 23);
    - ``Attention`` zeroes a query row whose every key is masked as eager does; below 23 torchlib's
      softmax decomposition returns the mean of the values there (a sequence whose attention mask is
      all zeros differs from eager);
    - below 20 GELU is ``Erf`` arithmetic onnxruntime does not fuse (``Gelu`` is an op from 20 on).

    At level ``ort-cpu`` it is :data:`FUSABLE_ATTENTION_MAX_OPSET` (22): onnxscript's attention fusion
    matches the decomposition only. ``newest`` (the newest opset onnx and onnxscript support) caps
    the result.
    """
    return min(FUSABLE_ATTENTION_MAX_OPSET if level == "ort-cpu" else DEFAULT_OPSET, newest)


def fuse_for_onnxruntime(model: Any) -> dict[str, int]:
    """Fuse ``model`` (an ``onnx_ir.Model``, changed in place) into onnxruntime's contrib ops with
    ``onnxscript.rewriter.ort_fusions.optimize_for_ort``; return the fusions applied (name -> count,
    zero counts left out). Graph inputs and outputs keep their names, shapes and order."""
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    inputs = [value.name for value in model.graph.inputs]
    outputs = [value.name for value in model.graph.outputs]
    _, counts = optimize_for_ort(model)
    if [v.name for v in model.graph.inputs] != inputs or [v.name for v in model.graph.outputs] != outputs:
        raise RuntimeError("onnxruntime fusions renamed the graph inputs or outputs")
    return {name: count for name, count in counts.items() if count}


__all__ = ["DEFAULT_OPSET", "newest_opset", "MIN_OPSET", "check_opset", "FUSABLE_ATTENTION_MAX_OPSET", "OPTIMIZE_LEVELS", "default_opset", "fuse_for_onnxruntime", "optimize_level"]
