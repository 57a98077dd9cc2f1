"""ExecutorchExporter Stage 1: backend preparation (``register_executorch_backend(name)``).

``prepare_for_<name>(model, inputs) -> (model, inputs, partitioners)`` puts the model and its inputs
on the backend's device and dtype and returns the partitioners handed to
``to_edge_transform_and_lower``. Adding a backend is registering one such function.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.utils._pytree as pytree

from ...deps import require
from ...precision import EXECUTORCH_COMPUTES
from ...pytree import register_model_pytrees
from ...registry import register_executorch_backend


def _moved(model: torch.nn.Module, inputs: dict[str, Any], device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, dict[str, Any]]:
    """``model`` and ``inputs`` on ``device``, floating point tensors (cache tensors included) in ``dtype``.

    A model with a parameter or buffer elsewhere or in another floating dtype is copied first: the caller's
    model keeps its dtype and device (``Module.to`` casts in place)."""
    register_model_pytrees(model, inputs)  # caches must be pytree nodes to be mapped through
    target = torch.device(device)
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.device.type != target.type or (t.is_floating_point() and t.dtype != dtype) for t in tensors):
        model = copy.deepcopy(model)
    model = model.to(device=device, dtype=dtype)

    def move(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if value.is_floating_point():
            return value.to(device=device, dtype=dtype)
        return value.to(device=device)

    return model, pytree.tree_map(move, inputs)


@register_executorch_backend("xnnpack")
def prepare_for_xnnpack(model: torch.nn.Module, inputs: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, Any], list[Any]]:
    """XNNPACK: CPU, float32 (float16 when ``--dtype float16`` asked for it), the XNNPACK partitioner
    (ops it does not take run on portable kernels).

    Pattern: every model; XNNPACK's kernels are float32, float16 or quantised on CPU (a bfloat16 or float64
    model is cast to float32).
    Models: all.
    Upstream: not a workaround (backend selection); https://docs.pytorch.org/executorch/stable/backends-xnnpack.html
    Remove when: never (the backend's entry point)
    """
    partition = require("executorch.backends.xnnpack.partition.xnnpack_partitioner", "The ExecuTorch XNNPACK backend")
    # set by --dtype (hf_exporters.precision.cast_for_export) on the model, which a generation part wraps
    asked = next((m.hfx_export_dtype for m in model.modules() if hasattr(m, "hfx_export_dtype")), None)
    device, dtype = EXECUTORCH_COMPUTES["xnnpack"]
    model, inputs = _moved(model, inputs, device, torch.float16 if asked == torch.float16 else dtype)
    return model, inputs, [partition.XnnpackPartitioner()]


@register_executorch_backend("portable")
def prepare_for_portable(model: torch.nn.Module, inputs: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, Any], list[Any]]:
    """Portable: no delegate; every op runs on ExecuTorch's portable CPU kernels, in the model's dtype.

    Pattern: every model; the reference backend, slowest but with the widest op coverage.
    Models: all.
    Upstream: not a workaround (backend selection); https://docs.pytorch.org/executorch/stable/kernel-library-overview.html
    Remove when: never (the backend's entry point)
    """
    if any(t.device.type != "cpu" for t in [*model.parameters(), *model.buffers()]):
        model = copy.deepcopy(model).to("cpu")  # the caller's model stays on its device
    return model, inputs, []


@register_executorch_backend("cuda")
def prepare_for_cuda(model: torch.nn.Module, inputs: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, Any], list[Any]]:
    """CUDA: a CUDA GPU, bfloat16, the CUDA (AOTInductor) partitioner.

    Pattern: every model; needs a CUDA build of torch, a visible GPU and executorch's CUDA backend.
    Models: all.
    Upstream: not a workaround (backend selection); https://docs.pytorch.org/executorch/stable/backends/cuda/cuda-overview.html
    Remove when: never (the backend's entry point)
    """
    if not torch.cuda.is_available():
        cuda_build = torch.version.cuda or "none (a CPU-only build)"
        raise RuntimeError(
            "the ExecuTorch 'cuda' backend needs a CUDA GPU, and none is available here "
            f"(torch {torch.__version__}, CUDA version of this torch build: {cuda_build})"
        )
    partition = require("executorch.backends.cuda.cuda_partitioner", "The ExecuTorch CUDA backend")
    backend = require("executorch.backends.cuda.cuda_backend", "The ExecuTorch CUDA backend")
    model, inputs = _moved(model, inputs, *EXECUTORCH_COMPUTES["cuda"])
    specs = [backend.CudaBackend.generate_method_name_compile_spec("forward")]
    return model, inputs, [partition.CudaPartitioner(specs)]
