"""Run an ``ExportedProgram`` with ``ExportedProgram.module()``."""

from __future__ import annotations

from typing import Any

import torch

from ..shapes import tensor_leaves


class ExportedProgramRunner:
    """Calls ``exported_program.module()(**inputs)`` and returns its output tensors in flatten order."""

    def __init__(self, exported_program: torch.export.ExportedProgram):
        self.module = exported_program.module()

    def __call__(self, inputs: dict[str, Any]) -> list[torch.Tensor]:
        with torch.no_grad():
            out = self.module(**inputs)
        return [t for _, t in tensor_leaves(out)]


class AotiRunner:
    """Loads an AOTInductor package (``torch._inductor.aoti_load_package``) and returns its output
    tensors in flatten order, as :class:`ExportedProgramRunner` does for the program it was compiled from."""

    def __init__(self, path: Any):
        self.module = torch._inductor.aoti_load_package(str(path))

    def __call__(self, inputs: dict[str, Any]) -> list[torch.Tensor]:
        with torch.no_grad():
            out = self.module(**inputs)
        return [t for _, t in tensor_leaves(out)]
