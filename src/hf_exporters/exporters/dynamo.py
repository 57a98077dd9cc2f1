"""DynamoExporter: a transformers model to a ``torch.export.ExportedProgram``."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import torch

from .. import registry
from ..config import DynamoConfig
from ..errors import ExportStageError
from ..folders import AOTI_SUFFIX
from ..pytree import materialize_caches, register_model_pytrees
from ..runtime.compare import evaluation_mode
from ..runtime.torch_runner import ExportedProgramRunner
from ..shapes import auto_dynamic_shapes, axis_report, recorded_guards
from ._common import (
    cleared_model_state,
    existing_objects_frozen,
    first_line,
    flat_forward_signature,
    normalize_inputs,
    stage,
)
from .capture import capture, strategies_for
from .result import ExportResult

logger = logging.getLogger("hf_exporters")


def load_exported_program(path: str | os.PathLike[str], model_class: str | None = None) -> torch.export.ExportedProgram:
    """``torch.export.load`` for a ``model.pt2`` written by hf-exporters.

    A saved program names the pytree types of its inputs and outputs (a ``ModelOutput``, a cache);
    torch can only rebuild them once those types are registered, which happens when transformers'
    modules defining them are imported. This registers the caches, imports
    ``transformers.modeling_outputs`` and the modeling module of ``model_class`` (read from the
    folder's ``export.json`` when not given), then loads, under the ``"load.pt2"`` patches (each
    symbolic size expression parsed once).

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    import importlib
    import json

    import transformers.modeling_outputs  # noqa: F401  (registers the shared ModelOutput classes)

    path = Path(path)
    if path.is_dir():
        path = path / DynamoExporter.artifact_name
    if not path.is_file():
        raise FileNotFoundError(f"no exported program at {path}")
    manifest = path.parent / "export.json"
    if model_class is None and manifest.is_file():
        model_class = json.loads(manifest.read_text()).get("model_class")
    if model_class:
        import transformers

        cls = getattr(transformers, model_class, None)
        if cls is not None:
            importlib.import_module(cls.__module__)
    register_model_pytrees(None)
    with registry.apply_patches("load.pt2", stage="Loading: torch.export.load"):
        return torch.export.load(str(path))


class DynamoExporter:
    """Export a model with ``torch.export`` and the project's workarounds.

    ``run()`` reads as five stages, each one context that stays open for the trace:

    1. Forward signature patch: ``model.forward`` takes the inputs' names explicitly.
    2. Model patches: the patches registered for ``"dynamo"`` (every one is declared for this stage).
    3. Pytree registration: caches and model outputs become pytree nodes.
    4. Dynamic shapes: ``Dim.AUTO`` on every tensor axis when ``config.dynamic``.
    5. State cleanup: attributes a forward caches on modules are cleared for the trace.

    Then the trace: the capture strategies of :mod:`~hf_exporters.exporters.capture`, tried in order.
    The result's ``static_axes`` lists every axis asked to be dynamic that ended static (its
    placeholder shows a number, or an input guard pins it to the example's size: the guard and the
    model line that added it are named), ``constrained_axes`` every one that stayed symbolic but
    refuses size 1; ``config.on_static_axis`` says whether a static axis is a warning (the default)
    or an error.
    ``run()`` returns an :class:`~hf_exporters.ExportResult` (the program, the dynamic shapes used, the
    axes that ended static, the capture strategy, the workarounds that fired, stage times);
    ``export()`` returns its program. The exporter keeps no state between exports.

    Example::

        ep = DynamoExporter().export(model, tokenizer(["hi"], return_tensors="pt"), DynamoConfig(dynamic=True))
        ep.module()(**inputs)
        result = DynamoExporter().run(model, inputs, DynamoConfig(dynamic=True))
        result.static_axes, result.stage_seconds
    """

    name = "dynamo"
    config_class = DynamoConfig
    #: file name of the artifact inside an output folder
    artifact_name = "model.pt2"
    #: default parity tolerance (max abs diff, float32) in the artifact's runtime
    default_atol = 1e-4

    def graph_output_names(self, program: Any) -> list[str] | None:
        """The artifact's own names of its outputs, in order, where they differ from the model's
        output names (None: outputs are positional or named as the model names them)."""
        return None

    def save(self, program: Any, directory: str | os.PathLike[str]) -> Path:
        """Write ``program`` as ``directory/model.pt2`` (``torch.export.save``) and return the path."""
        path = Path(directory) / self.artifact_name
        path.parent.mkdir(parents=True, exist_ok=True)
        saved_examples = program.example_inputs
        program.example_inputs = None  # example caches would be pickled; the artifact does not need them
        try:
            torch.export.save(program, str(path))
        finally:
            program.example_inputs = saved_examples
        return path

    def load_runner(self, path: str | os.PathLike[str]) -> Any:
        """A callable ``run(inputs) -> output tensors in flatten order`` over the saved artifact
        (an AOTInductor package, ``*.aoti.pt2``, runs through AOTInductor's loader)."""
        if str(path).endswith(AOTI_SUFFIX):
            from ..runtime.torch_runner import AotiRunner

            return AotiRunner(path)
        return ExportedProgramRunner(load_exported_program(path))

    def compile_aoti(self, program: torch.export.ExportedProgram, path: str | os.PathLike[str]) -> Path:
        """Compile ``program`` ahead of time with AOTInductor into the package ``path`` (``*.aoti.pt2``:
        a zip holding the compiled shared library and its weights, loaded from C++ by libtorch's
        ``torch::inductor::AOTIModelPackageLoader`` or from Python by ``torch._inductor.aoti_load_package``).

        Needs the program's example inputs (kept by :meth:`export`) and a C++ compiler (g++) at
        export time. Dynamic axes stay dynamic. Raises ExportStageError ("AOTInductor compile").
        """
        from ._common import blamed_line

        target = Path(path)
        if program.example_inputs is None:
            raise ExportStageError(self.name, "AOTInductor compile", "the program has no example inputs (export it in this process)")
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=str(target))
        except Exception as error:  # noqa: BLE001
            raise ExportStageError(self.name, "AOTInductor compile", first_line(error), blamed_line(error)) from error
        return target

    def export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: DynamoConfig | None = None) -> torch.export.ExportedProgram:
        """Trace ``model`` called as ``model(**inputs)``: ``run(model, inputs, config).program``.

        Args:
            model: a ``torch.nn.Module`` (a transformers ``PreTrainedModel``), put in eval mode.
            inputs: forward keyword arguments: tensors of shape ``(batch, sequence, ...)``, caches, scalars.
            config: a :class:`DynamoConfig`; defaults to a static export.

        Returns:
            the ``ExportedProgram``; its ``module()`` takes the same keyword arguments.

        Raises:
            ExportStageError: a stage or the trace failed; the message names the stage and, for a
                trace failure, the model source line torch.export stopped on.
        """
        return self.run(model, inputs, config).program

    def run(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: DynamoConfig | None = None) -> ExportResult:
        """Trace ``model`` called as ``model(**inputs)`` and report how.

        Args:
            model: a ``torch.nn.Module`` (a transformers ``PreTrainedModel``), put in eval mode.
            inputs: forward keyword arguments: tensors of shape ``(batch, sequence, ...)``, caches, scalars.
            config: a :class:`DynamoConfig`; defaults to a static export.

        Returns:
            an :class:`~hf_exporters.ExportResult` whose ``program`` and ``exported_program`` are the
            ``ExportedProgram``; ``stage_seconds`` has one entry per stage and
            ``trace (torch.export.export)``.

        Raises:
            ExportStageError: a stage or the trace failed; the message names the stage and, for a
                trace failure, the model source line torch.export stopped on. When every capture
                strategy failed, the first one's error is reported, with a note naming the others'.
        """
        config = config or DynamoConfig()
        inputs = normalize_inputs(inputs)
        seconds: dict[str, float] = {}
        with registry.export_lock(), existing_objects_frozen(), registry.recording_fired() as fired, torch.no_grad(), contextlib.ExitStack() as stack:
            stack.enter_context(evaluation_mode(model))  # traced in eval mode; the caller's modes come back after
            # ── Stage 1: Forward signature patch ──
            with stage(self.name, "Stage 1: Forward signature patch", seconds):
                stack.enter_context(flat_forward_signature(model, list(inputs)))

            # ── Stage 2: Model patches ──
            with stage(self.name, "Stage 2: Model patches", seconds):
                stack.enter_context(registry.apply_patches("dynamo", stage="Stage 2: Model patches"))

            # ── Stage 3: Pytree registration ──
            with stage(self.name, "Stage 3: Pytree registration", seconds):
                register_model_pytrees(model, inputs)
                materialize_caches(model, inputs)

            # ── Stage 4: Dynamic shapes ──
            with stage(self.name, "Stage 4: Dynamic shapes", seconds):
                dynamic_shapes = config.dynamic_shapes
                if dynamic_shapes is None and config.dynamic:
                    dynamic_shapes = auto_dynamic_shapes(inputs)

            # ── Stage 5: State cleanup ──
            with stage(self.name, "Stage 5: State cleanup", seconds):
                stack.enter_context(cleared_model_state(model))

            with stage(self.name, TRACE, seconds), recorded_guards() as guards:
                captured, failed = capture(model, inputs, dynamic_shapes, config, strategies_for(dynamic_shapes))

        exported = captured.program
        fixed, constrained = axis_report(exported, inputs, dynamic_shapes, guards) if dynamic_shapes is not None else ([], [])
        if fixed:
            listing = ", ".join(map(str, fixed))
            if config.on_static_axis == "error":
                raise ExportStageError(
                    self.name,
                    "Stage 4: Dynamic shapes",
                    f"{len(fixed)} axis/axes asked to be dynamic ended static (the program accepts only "
                    f"these sizes): {listing}; export with an example of other sizes, or on_static_axis='warn'",
                )
            logger.warning(
                "%s: %d axis/axes asked to be dynamic ended static (the program accepts only these sizes): %s",
                type(model).__name__,
                len(fixed),
                listing,
            )
        if constrained:
            logger.warning(
                "%s: %d dynamic axis/axes refuse size 1: %s",
                type(model).__name__,
                len(constrained),
                ", ".join(map(str, constrained)),
            )
        return ExportResult(
            program=exported,
            exported_program=exported,
            dynamic_shapes=dynamic_shapes,
            static_axes=fixed,
            constrained_axes=constrained,
            capture_strategy=captured.strategy,
            capture_errors=[(f.strategy, f.error) for f in failed],
            size_oblivious=captured.size_oblivious,
            workarounds_fired=list(fired),
            stage_seconds=seconds,
        )


#: the stage title of the trace (the capture strategies), in errors and ``stage_seconds``
TRACE = "trace (torch.export.export)"
