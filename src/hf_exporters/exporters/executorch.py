"""ExecutorchExporter: a transformers model to an ExecuTorch program (``.pte``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .. import registry
from ..config import ExecutorchConfig
from ..deps import require
from ..errors import InputError
from ..pytree import register_model_pytrees
from ..shapes import size_oblivious_sizes
from ..workarounds.executorch.fx_program_fixes import dynamic_dim_max
from ..workarounds.executorch.lowering_speed import check_pinned_internals
from ._common import normalize_inputs, stage
from .dynamo import DynamoExporter


from ..runtime.et_runner import INPUT_MUTATIONS_METHOD


def _input_mutation_outputs(exported: torch.export.ExportedProgram) -> int:
    kind = torch.export.graph_signature.OutputKind.USER_INPUT_MUTATION
    return sum(spec.kind == kind for spec in exported.graph_signature.output_specs)


class ExecutorchExporter(DynamoExporter):
    """Export a model with ``torch.export``, lower it with ExecuTorch and serialise a ``.pte`` program.

    ``export()`` reads as five stages around the parent's trace and ExecuTorch's lowering; each applies
    the workarounds registered for ``"executorch.<backend>"`` (or ``"executorch"``) with that stage
    (``Workaround.stage``, declared at registration):

    1. Backend preparation: the registered ``prepare_for_<backend>(model, inputs)`` moves the model and
       inputs to the backend's device and dtype and picks its partitioners.
    2. Torch patches: patches for torch ops (and model code) ExecuTorch rejects, active during the trace.
    3. ExecuTorch patches: patches on ExecuTorch internals, active during lowering.
    4. FX program fixes: ``apply_fx_program_fixes`` on the traced program.
    5. FX node fixes: ``apply_fx_node_fixes`` on its graph.

    Then ``to_edge_transform_and_lower`` and ``to_executorch``.

    Example::

        manager = ExecutorchExporter().export(model, inputs, ExecutorchConfig(backend="xnnpack", dynamic=True))
        Path("model.pte").write_bytes(manager.buffer)
    """

    name = "executorch"
    config_class = ExecutorchConfig
    artifact_name = "model.pte"
    default_atol = 1e-3

    def save(self, program: Any, directory: str | os.PathLike[str]) -> Path:
        """Write ``program.buffer`` as ``directory/model.pte`` and return the path."""
        path = Path(directory) / self.artifact_name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(program.buffer)
        return path

    def load_runner(self, path: str | os.PathLike[str]) -> Any:
        """A callable ``run(inputs) -> output tensors in flatten order`` over the ``.pte`` with executorch.runtime."""
        from ..runtime.et_runner import ExecutorchRunner

        register_model_pytrees(None)
        return ExecutorchRunner(path)

    def export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: ExecutorchConfig | None = None) -> Any:
        """Trace ``model(**inputs)`` and lower it to an ExecuTorch program for ``config.backend``.

        Returns:
            the ``ExecutorchProgramManager``; its ``buffer`` is the ``.pte`` file's content.

        Raises:
            MissingDependencyError: executorch is not installed.
            ExportStageError: a stage, the trace or the lowering failed; the message names it.
        """
        config = config or ExecutorchConfig()
        exir = require("executorch.exir", "The ExecuTorch exporter")
        inputs = normalize_inputs(inputs)
        scope = f"executorch.{config.backend}"
        with registry.export_lock(), contextlib.ExitStack() as stack:
            # ── Stage 1: Backend preparation ──
            with stage(self.name, "Stage 1: Backend preparation"):
                backends = registry.executorch_backends()
                if config.backend not in backends:
                    raise InputError(
                        f"unknown ExecuTorch backend {config.backend!r}; known backends: {', '.join(sorted(backends))}"
                    )
                model, inputs, partitioners = backends[config.backend](model, inputs)

            # ── Stage 2: Torch patches ──
            with stage(self.name, "Stage 2: Torch patches"):
                torch_patches = registry.apply_patches(scope, stage="Stage 2: Torch patches")
                with torch_patches:
                    exported = super().export(model, inputs, config)

            # ── Stage 3: ExecuTorch patches ──
            with stage(self.name, "Stage 3: ExecuTorch patches"):
                check_pinned_internals(scope)
                stack.enter_context(registry.apply_patches(scope, stage="Stage 3: ExecuTorch patches"))

            # ── Stage 4: FX program fixes ──
            with stage(self.name, "Stage 4: FX program fixes"), dynamic_dim_max(config.max_seq_len):
                registry.apply_fx_program_fixes(scope, exported, stage="Stage 4: FX program fixes")

            # ── Stage 5: FX node fixes ──
            with stage(self.name, "Stage 5: FX node fixes"):
                registry.apply_fx_node_fixes(scope, exported.graph_module, stage="Stage 5: FX node fixes")

            if self.dynamic_shapes is not None and self.size_oblivious:
                # The lowering re-traces the program (run_decompositions); sizes traced from an
                # example of 0 or 1 must stay symbolic there too, as in the trace (and plain when
                # the trace fell back to plain reasoning).
                stack.enter_context(size_oblivious_sizes())
            with stage(self.name, "lowering (to_edge_transform_and_lower)"):
                edge = exir.to_edge_transform_and_lower(
                    exported,
                    partitioner=partitioners or None,
                    constant_methods={INPUT_MUTATIONS_METHOD: 0},
                )
                # Functionalisation in the lowering turns in-place cache updates into user-input
                # mutations, which ExecuTorch returns before the model outputs: record how many.
                edge._config_methods[INPUT_MUTATIONS_METHOD] = _input_mutation_outputs(edge.exported_program())
            with stage(self.name, "serialisation (to_executorch)"):
                manager = edge.to_executorch()
        return manager
