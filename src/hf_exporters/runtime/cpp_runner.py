"""The C++ runner (``cpp/``, built into ``build/cpp``) from Python: its ``hfx-run`` command and the
``_hfx`` pybind11 module, so Python code can run ExecuTorch parts with the C++ runtime (``runtime="cpp"``).

The build folder is ``$HFX_BUILD_DIR`` when set, else ``build/cpp`` of the source checkout
(``make cpp`` builds it).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import torch

from ..errors import CppRunnerError

#: runtimes a caller can choose for ExecuTorch parts
RUNTIMES = ("python", "cpp")


def build_dir() -> Path:
    """Where ``hfx-run`` and ``_hfx`` are: ``$HFX_BUILD_DIR``, else ``<checkout>/build/cpp``."""
    env = os.environ.get("HFX_BUILD_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "build" / "cpp"


def hfx_run() -> Path:
    """Path of the ``hfx-run`` executable. Raises CppRunnerError when it is not built."""
    path = build_dir() / "hfx-run"
    if not path.is_file():
        raise CppRunnerError(f"the C++ runner is not built ({path} is missing): run 'make cpp'")
    return path


def load_module() -> Any:
    """The ``_hfx`` extension module. Raises CppRunnerError when it is not built."""
    if "_hfx" in sys.modules:
        return sys.modules["_hfx"]
    found = sorted(build_dir().glob("_hfx*.so"))
    if not found:
        raise CppRunnerError(f"the C++ runner's Python bindings are not built (no _hfx*.so in {build_dir()}): run 'make cpp'")
    spec = importlib.util.spec_from_file_location("_hfx", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["_hfx"] = module
    return module


_DTYPES = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
}
_TORCH = {v: k for k, v in _DTYPES.items()}


def to_hfx(module: Any, tensor: torch.Tensor) -> Any:
    """A torch tensor as an ``_hfx.Tensor`` (a contiguous copy of its bytes)."""
    t = tensor.detach().contiguous().cpu()
    raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return module.Tensor(_DTYPES[t.dtype], list(t.shape), raw)


def from_hfx(value: Any) -> torch.Tensor:
    """An ``_hfx.Tensor`` as a torch tensor."""
    dtype = _TORCH[value.dtype]
    data = bytearray(value.data)
    flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
    return flat.reshape(list(value.shape))


class CppExecutorchRunner:
    """Runs a ``.pte`` with the C++ runner (the ExecuTorch C++ runtime): ``runner(inputs) -> output
    tensors``, the same contract as :class:`~hf_exporters.runtime.et_runner.ExecutorchRunner`."""

    def __init__(self, path: str | os.PathLike[str], method: str = "forward"):
        self.module = load_module()
        try:
            self.part = self.module.load_executorch(str(path), method)
        except self.module.HfxError as error:
            raise CppRunnerError(str(error)) from None

    def __call__(self, inputs: dict[str, Any]) -> list[torch.Tensor]:
        from .et_runner import flat_inputs

        tensors = [to_hfx(self.module, t) for t in flat_inputs(inputs) if isinstance(t, torch.Tensor)]
        try:
            return [from_hfx(o) for o in self.part.run(tensors)]
        except self.module.HfxError as error:
            raise CppRunnerError(str(error)) from None
