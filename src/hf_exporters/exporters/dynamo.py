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
from ..runtime.torch_runner import ExportedProgramRunner
from ..shapes import ConstrainedAxis, StaticAxis, auto_dynamic_shapes, axis_report, recorded_guards, size_oblivious_sizes
from ._common import (
    cleared_model_state,
    clone_inputs,
    first_line,
    flat_forward_signature,
    normalize_inputs,
    stage,
)

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


def _is_data_dependent(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, is a guard on data (``GuardOnDataDependentSymNode``)."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    seen = 0
    while error is not None and seen < 50:
        if isinstance(error, GuardOnDataDependentSymNode) or "data-dependent expression" in str(error):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


class DynamoExporter:
    """Export a model with ``torch.export`` and the project's workarounds.

    ``export()`` reads as five stages, each one context that stays open for the trace:

    1. Forward signature patch: ``model.forward`` takes the inputs' names explicitly.
    2. Model patches: the patches registered for ``"dynamo"`` (every one is declared for this stage).
    3. Pytree registration: caches and model outputs become pytree nodes.
    4. Dynamic shapes: ``Dim.AUTO`` on every tensor axis when ``config.dynamic``.
    5. State cleanup: attributes a forward caches on modules are cleared for the trace.

    After the trace, :attr:`static_axes` lists every axis that was asked to be dynamic and ended static
    (its placeholder shows a number, or an input guard pins it to the example's size: the guard and
    the model line that added it are named), and :attr:`constrained_axes` every one that stayed
    symbolic but refuses size 1. ``config.on_static_axis`` says whether a static axis is a warning
    (the default) or an error.

    Example::

        ep = DynamoExporter().export(model, tokenizer(["hi"], return_tensors="pt"), DynamoConfig(dynamic=True))
        ep.module()(**inputs)
    """

    name = "dynamo"
    config_class = DynamoConfig
    #: file name of the artifact inside an output folder
    artifact_name = "model.pt2"
    #: default parity tolerance (max abs diff, float32) in the artifact's runtime
    default_atol = 1e-4

    def __init__(self) -> None:
        self.static_axes: list[StaticAxis] = []
        self.constrained_axes: list[ConstrainedAxis] = []
        self.dynamic_shapes: Any = None
        #: whether the last dynamic trace ran under size-oblivious reasoning (False after the plain retry)
        self.size_oblivious = False
        #: the ExportedProgram of the last export (the traced graph every backend starts from)
        self.exported_program: torch.export.ExportedProgram | None = None

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
        from ..errors import ExportStageError
        from ._common import blamed_line

        target = Path(path)
        if program.example_inputs is None:
            raise ExportStageError(self.name, "AOTInductor compile", "the program has no example inputs (export it in this process)")
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=str(target))
        except Exception as error:  # noqa: BLE001
            raise ExportStageError(self.name, "AOTInductor compile", first_line(error), blamed_line(error)) from error
        return target

    def _trace(self, model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any, config: DynamoConfig) -> torch.export.ExportedProgram:
        """``torch.export.export`` of ``model(**inputs)``; with dynamic shapes, under size-oblivious reasoning
        (:func:`~hf_exporters.shapes.size_oblivious_sizes`), so an example size of 0 or 1 does not pin
        its axis. Size-oblivious reasoning also assumes a computed size is never 1, so a model that
        broadcasts a size the config fixes (SegGPT reshapes its config-sized patch mask to
        ``(-1, patch_height, patch_width, 1)`` and broadcasts the leading 1 over the batch) fails the
        broadcast check; such a trace is tried once more with plain reasoning, which guards the sizes
        instead (the axes it pins are reported in :attr:`static_axes`, and :attr:`size_oblivious` is
        False so that a later lowering re-traces the same way). A data-dependent guard is not
        retried; when the retry fails too, the first error is raised with a note naming the second.
        Guards torch's constraint solver cannot solve are left to
        ``_patch_dim_constraints_skip_unsolvable`` (a workaround of the registry).

        Raises:
            Exception: whatever ``torch.export.export`` raises.
        """

        def trace() -> torch.export.ExportedProgram:
            return torch.export.export(
                model,
                args=(),
                kwargs=clone_inputs(inputs),
                dynamic_shapes=dynamic_shapes,
                strict=config.strict,
                prefer_deferred_runtime_asserts_over_guards=config.prefer_deferred_runtime_asserts_over_guards,
            )

        self.size_oblivious = dynamic_shapes is not None
        if dynamic_shapes is None:
            return trace()
        try:
            with size_oblivious_sizes():
                return trace()
        except Exception as oblivious_error:
            if _is_data_dependent(oblivious_error):
                raise  # a guard on data, not on sizes: tracing again cannot help
            retry_error = None
            try:
                with cleared_model_state(model):  # nothing the failed trace cached reaches the retry
                    program = trace()
            except Exception as error:
                retry_error = first_line(error)
            if retry_error is not None:
                oblivious_error.add_note(f"traced again with plain size reasoning, it failed too: {retry_error}")
                raise
            self.size_oblivious = False
            logger.info(
                "%s: traced with plain size reasoning after size-oblivious reasoning failed (%s)",
                type(model).__name__,
                first_line(oblivious_error),
            )
            return program

    def export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: DynamoConfig | None = None) -> torch.export.ExportedProgram:
        """Trace ``model`` called as ``model(**inputs)``.

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
        config = config or DynamoConfig()
        inputs = normalize_inputs(inputs)
        model.eval()
        with registry.export_lock(), torch.no_grad(), contextlib.ExitStack() as stack:
            # ── Stage 1: Forward signature patch ──
            with stage(self.name, "Stage 1: Forward signature patch"):
                stack.enter_context(flat_forward_signature(model, list(inputs)))

            # ── Stage 2: Model patches ──
            with stage(self.name, "Stage 2: Model patches"):
                stack.enter_context(registry.apply_patches("dynamo", stage="Stage 2: Model patches"))

            # ── Stage 3: Pytree registration ──
            with stage(self.name, "Stage 3: Pytree registration"):
                register_model_pytrees(model, inputs)
                materialize_caches(model, inputs)

            # ── Stage 4: Dynamic shapes ──
            with stage(self.name, "Stage 4: Dynamic shapes"):
                dynamic_shapes = config.dynamic_shapes
                if dynamic_shapes is None and config.dynamic:
                    dynamic_shapes = auto_dynamic_shapes(inputs)
                self.dynamic_shapes = dynamic_shapes

            # ── Stage 5: State cleanup ──
            with stage(self.name, "Stage 5: State cleanup"):
                stack.enter_context(cleared_model_state(model))

            with stage(self.name, "trace (torch.export.export)"), recorded_guards() as guards:
                exported = self._trace(model, inputs, dynamic_shapes, config)

        self.exported_program = exported
        self.static_axes, self.constrained_axes = [], []
        if dynamic_shapes is not None:
            self.static_axes, self.constrained_axes = axis_report(exported, inputs, dynamic_shapes, guards)
        if self.static_axes:
            listing = ", ".join(map(str, self.static_axes))
            if config.on_static_axis == "error":
                raise ExportStageError(
                    self.name,
                    "Stage 4: Dynamic shapes",
                    f"{len(self.static_axes)} axis/axes asked to be dynamic ended static (the program accepts only "
                    f"these sizes): {listing}; export with an example of other sizes, or on_static_axis='warn'",
                )
            logger.warning(
                "%s: %d axis/axes asked to be dynamic ended static (the program accepts only these sizes): %s",
                type(model).__name__,
                len(self.static_axes),
                listing,
            )
        if self.constrained_axes:
            logger.warning(
                "%s: %d dynamic axis/axes refuse size 1: %s",
                type(model).__name__,
                len(self.constrained_axes),
                ", ".join(map(str, self.constrained_axes)),
            )
        return exported
