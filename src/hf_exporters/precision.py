"""Reduced precision: an export in float16 or bfloat16, and the parity its artifact must keep.

``export --dtype float16`` casts the model's floating parameters and buffers and the floating example inputs
before tracing (:func:`cast_for_export`), so the artifact computes in that dtype end to end. Its outputs
cannot match float32 eager to float32's tolerance, so an export in ``dtype`` is checked twice, each with a
tolerance that scales with the output (:func:`dtype_tolerance`): against eager in the same dtype (the
export is faithful) and against float32 eager on the example inputs (the cast itself kept the model's
meaning).

The relative tolerances (:data:`DTYPE_RTOL`) are about ten times the largest difference seen on the
embedded all-MiniLM-L6-v2 and a tiny Llama (float16: 6.4e-4 of the largest output, bfloat16: 5.9e-3).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .errors import InputError

#: ``--dtype`` values (the names optimum-cli uses are accepted too) -> torch dtype
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

#: the tolerance of a reduced-precision export, relative to the largest |value| of eager's floating outputs;
#: added to the backend's absolute tolerance
DTYPE_RTOL: dict[torch.dtype, float] = {torch.float32: 0.0, torch.float16: 5e-3, torch.bfloat16: 4e-2}


def parse_dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype ``name`` (``float32``/``fp32``, ``float16``/``fp16``, ``bfloat16``/``bf16``) names;
    None for None.

    Raises:
        InputError: an unknown name.
    """
    if name is None:
        return None
    try:
        return DTYPES[name]
    except KeyError:
        raise InputError(f"--dtype {name!r} is not one of float32, float16, bfloat16 (or fp32, fp16, bf16)") from None


def check_dtype_request(
    dtype: str | None, backend: str, recipe: str | None, quantize: str | None, quantize_embeddings: str | None
) -> torch.dtype | None:
    """The torch dtype ``dtype`` names (:func:`parse_dtype`), after refusing a request the export cannot honour,
    before the model loads.

    Raises:
        InputError: an unknown name; a reduced dtype (float16, bfloat16) with ``quantize`` or ``quantize_embeddings``
            (both quantize a float32 model); bfloat16 for ExecuTorch's ``xnnpack`` ``recipe`` (no bfloat16 kernels).
    """
    torch_dtype = parse_dtype(dtype)
    reduced = torch_dtype is not None and torch_dtype != torch.float32
    if reduced and quantize is not None:
        raise InputError(f"--quantize {quantize} quantizes a float32 model; it cannot be combined with --dtype {dtype}")
    if reduced and quantize_embeddings is not None:
        raise InputError(f"--qembedding {quantize_embeddings} quantizes a float32 model; it cannot be combined with --dtype {dtype}")
    if torch_dtype == torch.bfloat16 and backend == "executorch" and recipe == "xnnpack":
        raise InputError("--dtype bfloat16: XNNPACK has no bfloat16 kernels; export float16 or float32 with xnnpack, or bfloat16 with --recipe portable")
    return torch_dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``float16`` for ``torch.float16``."""
    return str(dtype).removeprefix("torch.")


def cast_for_export(model: torch.nn.Module, inputs: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """Cast ``model`` in place (``model.to(dtype)``: floating parameters and buffers) and return ``inputs`` with
    every floating tensor cast to ``dtype`` (integer ids and masks unchanged; nested lists and dicts walked).
    ``model.hfx_export_dtype`` records the request, so a backend keeps a dtype it would otherwise cast away
    (XNNPACK keeps float16 only when asked for it)."""
    model.to(dtype)
    model.hfx_export_dtype = dtype
    return _cast_tree(inputs, dtype)


#: ExecuTorch backend -> (device type, dtype) its program computes in when no dtype is asked for (the backends'
#: Stage 1 moves the model there: :mod:`hf_exporters.workarounds.executorch.backends`)
EXECUTORCH_COMPUTES: dict[str, tuple[str, torch.dtype]] = {"xnnpack": ("cpu", torch.float32), "cuda": ("cuda", torch.bfloat16)}


def cast_to_executorch_backend(model: torch.nn.Module, backend: str | None) -> bool:
    """Cast ``model`` in place to the device and dtype the ExecuTorch ``backend`` computes in
    (:data:`EXECUTORCH_COMPUTES`: a bfloat16 checkpoint exported with XNNPACK computes in float32), so that eager, the
    parity reference, computes as the program does; the exporter itself casts a copy. Nothing is done for another
    backend, for a model already there, or when the device is not available here (the exporter's Stage 1 then
    refuses the export with the reason). Returns whether the model was cast."""
    device, dtype = EXECUTORCH_COMPUTES.get(backend or "", (None, None))
    if device is None or (device == "cuda" and not torch.cuda.is_available()):
        return False
    if all(p.device.type == device and (not p.is_floating_point() or p.dtype == dtype) for p in model.parameters()):
        return False
    model.to(device=device, dtype=dtype)
    return True


def _cast_tree(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _cast_tree(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_tree(v, dtype) for v in value)
    return value


def dtype_tolerance(dtype: torch.dtype, atol: float, expected: Sequence[tuple[str, torch.Tensor]]) -> float:
    """``atol + DTYPE_RTOL[dtype] * max |x|`` over eager's floating outputs ``expected`` (``(name, tensor)``)."""
    scale = max(
        (float(t.detach().double().abs().nan_to_num(posinf=0.0, neginf=0.0).max()) for _, t in expected if t.is_floating_point() and t.numel()),
        default=0.0,
    )
    return atol + DTYPE_RTOL[dtype] * scale
