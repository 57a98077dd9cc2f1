"""ExecutorchExporter Stage 3: mutated buffers whose initial value the program reads.

ExecuTorch serialises a buffer the program mutates without its data: it assumes the program writes it before
reading it (a cache). A model that reassigns a buffer it then reads, or updates a nonzero state, needs the
buffer's initial value in the program.
"""

from __future__ import annotations

from typing import Any

import torch

from ...registry import register_patch


def initialized_mutable_buffers(exported: torch.export.ExportedProgram) -> list[str]:
    """The placeholder names of the buffers ``exported`` mutates whose initial value has a nonzero element: the
    buffers whose initial state the program must keep.

    Pattern: a forward that reassigns a buffer it then reads, ``self.pos_encoding = self.pos_encoding.to(dtype)``
    (traced as a mutation of the buffer). ExecuTorch serialises a mutated buffer without its data ("ExecuTorch
    assumes buffers that are mutated in the graph have a meaningless initial state") unless its placeholder is
    marked with ``InitializedMutableBufferPass``, so the program read uninitialised memory where the model reads
    its table: CTRLModel's last hidden state differed from eager by 3.7, on XNNPACK and portable alike. Buffers
    whose initial value is all zeros (a cache held in the program) stay uninitialised, as before: the program
    writes them before it reads them.
    Models: CTRLModel (executorch in the sweep).
    Upstream: executorch exir/emit/_emitter.py (mutable buffers emitted without data unless ``et_init_buffer``)
    Remove when: ExecuTorch keeps the initial state of every mutated buffer."""
    signature = exported.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    names = []
    for placeholder, target in signature.inputs_to_buffers.items():
        if target not in mutated:
            continue
        value = exported.state_dict.get(target)
        if value is None:
            value = exported.constants.get(target)
        if isinstance(value, torch.Tensor) and value.numel() and bool(value.count_nonzero() > 0):
            names.append(placeholder)
    return names


@register_patch("executorch", "executorch.exir.program._program.EdgeProgramManager.to_executorch", stage="Stage 3: ExecuTorch patches")
def _patch_initial_values_of_mutated_buffers(original: Any) -> Any:
    """``to_executorch`` keeps the initial value of every mutated buffer :func:`initialized_mutable_buffers` names, in
    every method, with ExecuTorch's ``InitializedMutableBufferPass`` appended to the config's passes.

    Pattern: a forward that reassigns a buffer it then reads (CTRL's positional encoding): see
    :func:`initialized_mutable_buffers`.
    Models: CTRLModel (executorch in the sweep).
    Upstream: executorch exir/emit/_emitter.py (mutable buffers emitted without data unless ``et_init_buffer``)
    Remove when: ExecuTorch keeps the initial state of every mutated buffer.
    """

    def to_executorch(self: Any, config: Any = None) -> Any:
        names = sorted({n for method in self.methods for n in initialized_mutable_buffers(self.exported_program(method))})
        if not names:
            return original(self, config)
        import dataclasses

        from executorch.exir.capture._config import ExecutorchBackendConfig
        from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

        config = config if config is not None else ExecutorchBackendConfig()
        return original(self, dataclasses.replace(config, passes=[*config.passes, InitializedMutableBufferPass(names)]))

    return to_executorch
