"""OnnxExporter: a transformers model to a ``torch.onnx.ONNXProgram`` (torch.export + onnxscript)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from .. import registry
from ..config import OnnxConfig
from ..deps import require
from ..errors import ExportStageError
from ..known_issues import ONNX_DISABLE_OPTIMIZE
from ..pytree import register_model_pytrees
from ..shapes import output_names
from ._common import blamed_line, existing_objects_frozen, first_line, normalize_inputs, stage
from .dynamo import DynamoExporter
from .onnx_optimize import default_opset, fuse_for_onnxruntime, newest_opset, optimize_level
from .onnx_quantize import check_quantize, outlier_matmuls, quantize_model
from .result import ExportResult, trace_stage_seconds

logger = logging.getLogger("hf_exporters")

#: torch versions the Stage 2 hook (a torch.onnx internal) was written against
SUPPORTED_TORCH_FOR_ONNX_PATCHES = ("2.13",)
#: the torch.onnx internal Stage 2 wraps: it runs ``ExportedProgram.run_decompositions``
DECOMPOSITION_HOOK = "torch.onnx._internal.exporter._fx_passes.decompose_with_registry"


def _require_onnx_stack() -> None:
    for module in ("onnx", "onnxscript", "onnx_ir", "onnxruntime"):
        require(module, "The ONNX exporter")


def _check_onnx_internals() -> None:
    """Fail loudly when the torch.onnx internals the Stage 2 patches hook are not the ones they were written for.

    Raises:
        RuntimeError: torch is not a supported version, or a hooked attribute is missing.
    """
    if not torch.__version__.startswith(SUPPORTED_TORCH_FOR_ONNX_PATCHES):
        raise RuntimeError(
            f"the ONNX patches hook torch.onnx internals written for torch {', '.join(SUPPORTED_TORCH_FOR_ONNX_PATCHES)}.x; "
            f"torch {torch.__version__} is installed"
        )
    for workaround in registry.list_workarounds("onnx", stage="Stage 2: ONNX patches"):
        if workaround.kind != "patch":
            continue
        owner_path, _, attribute = workaround.target.rpartition(".")
        library = workaround.target.split(".")[0] if not workaround.target.startswith("torch.onnx.") else "torch.onnx"
        try:
            owner = registry.resolve_dotted_path(owner_path)
        except (ImportError, AttributeError) as error:
            raise RuntimeError(f"{library} internal {owner_path!r} has moved ({error}); {workaround.name} cannot hook it") from error
        if not hasattr(owner, attribute):
            raise RuntimeError(
                f"{library} internal {workaround.target!r} has moved (no attribute {attribute!r}); "
                f"{workaround.name} cannot hook it"
            )


class OnnxExporter(DynamoExporter):
    """Export a model to ONNX: the DynamoExporter trace, then ``torch.onnx.export`` with the project's workarounds.

    ``run()`` reads as seven stages around ``torch.onnx.export``; each applies the workarounds
    registered for ``"onnx"`` with that stage (``Workaround.stage``, declared at registration):

    1. Torch patches: patches on torch ops, active for the trace and the lowering.
    2. ONNX patches: patches on torch.onnx and onnxscript optimizer internals; re-runs the FX node fixes
       right after ``run_decompositions``.
    3. FX node fixes: ``apply_fx_node_fixes("onnx", ...)`` on the traced graph.
    4. ONNX translations: the custom translation table (aten op -> onnxscript function).
    5. ONNX IR fixes: rewrites of the finished model, main graph and every function.
    6. ONNX Runtime fusions: at ``optimize="ort-cpu"``, onnxscript's onnxruntime fusions
       (:mod:`hf_exporters.exporters.onnx_optimize`).
    7. Quantization: with ``config.quantize``, onnxruntime's int8 quantizer
       (:mod:`hf_exporters.exporters.onnx_quantize`).

    Example::

        program = OnnxExporter().export(model, inputs, OnnxConfig(dynamic=True))
        program.save("model.onnx")
    """

    name = "onnx"
    config_class = OnnxConfig
    artifact_name = "model.onnx"
    default_atol = 1e-3

    def __init__(self) -> None:
        super().__init__()
        #: the config of the last export, read by :meth:`save` (``external_data``)
        self.config: OnnxConfig | None = None
        #: the optimisation level (``none``, ``default``, ``ort-cpu``), opset, onnxruntime fusions applied
        #: in Stage 6 (fusion name -> count) and nodes the IR fixes changed, of the last export
        self.optimize_level: str = "default"
        self.opset: int | None = None
        self.fusions: dict[str, int] = {}
        self.float_matmuls: list[str] = []
        self.ir_fixes_applied: int = 0

    # ── Export ────────────────────────────────────────────────────────────────

    def export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: OnnxConfig | None = None) -> Any:
        """Export ``model`` called as ``model(**inputs)`` to ONNX: ``run(model, inputs, config).program``.

        Returns:
            the ``torch.onnx.ONNXProgram``; ``.save(path)`` writes it, ``.model`` is its ``onnx_ir`` model.

        Raises:
            MissingDependencyError: onnx, onnxscript, onnx-ir or onnxruntime is not installed.
            InputError: ``config.optimize`` names no optimisation level, ``config.quantize`` no mode.
            ExportStageError: a stage, the trace or the lowering failed.
        """
        return self.run(model, inputs, config).program

    def run(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: OnnxConfig | None = None) -> ExportResult:
        """Export ``model`` called as ``model(**inputs)`` to ONNX and report how.

        Returns:
            an :class:`~hf_exporters.ExportResult`: ``program`` is the ``torch.onnx.ONNXProgram``,
            ``exported_program`` the trace as the Stage 3 fixes left it; ``optimized``,
            ``fx_fixes_applied`` and ``ir_fixes_applied`` are set; ``stage_seconds`` lists the seven
            stages, the trace's dynamo stages (``dynamo: Stage N: ...``), the trace, the lowering,
            ``output names`` and, with ``config.output_path``, ``save``.

        Raises:
            MissingDependencyError: onnx, onnxscript, onnx-ir or onnxruntime is not installed.
            ExportStageError: a stage, the trace or the lowering failed.
        """
        _require_onnx_stack()
        config = config or OnnxConfig()
        self.config = config
        inputs = normalize_inputs(inputs)
        seconds: dict[str, float] = {}
        model_class = type(model).__name__
        level = optimize_level(config.optimize)
        check_quantize(config.quantize)
        if level != "none" and model_class in ONNX_DISABLE_OPTIMIZE:
            level = "none"
            logger.warning("%s: onnxscript optimizer turned off: %s", model_class, ONNX_DISABLE_OPTIMIZE[model_class])
        self.optimize_level = level
        optimize = level != "none"
        opset = config.opset_version if config.opset_version is not None else default_opset(level, newest_opset())
        self.opset = opset
        self.fusions = {}
        self.float_matmuls = []
        fx_fixes = [0]  # nodes the FX node fixes consumed, in Stage 3 and after the decomposition

        with registry.export_lock(), existing_objects_frozen(), registry.recording_fired() as fired:
            with contextlib.ExitStack() as stack:  # the Stage 1 and 2 patches: for the trace and the lowering
                # ── Stage 1: Torch patches ──
                with stage(self.name, "Stage 1: Torch patches", seconds):
                    stack.enter_context(registry.apply_patches("onnx", stage="Stage 1: Torch patches"))
                traced = super().run(model, inputs, config)
                seconds.update(trace_stage_seconds(traced))
                exported = traced.exported_program

                # ── Stage 2: ONNX patches ──
                with stage(self.name, "Stage 2: ONNX patches", seconds):
                    _check_onnx_internals()
                    stack.enter_context(registry.apply_patches("onnx", stage="Stage 2: ONNX patches"))

                # ── Stage 3: FX node fixes ──
                with stage(self.name, "Stage 3: FX node fixes", seconds):
                    fx_fixes[0] = registry.apply_fx_node_fixes("onnx", exported.graph_module, stage="Stage 3: FX node fixes")

                # ── Stage 4: ONNX translations ──
                with stage(self.name, "Stage 4: ONNX translations", seconds):
                    _load_custom_op_namespaces()
                    translations = registry.onnx_translations(stage="Stage 4: ONNX translations")
                    table = registry.onnx_translation_table(stage="Stage 4: ONNX translations")
                    for op, funcs in table.items():
                        if isinstance(funcs, list):  # torch.onnx takes one function per op
                            raise TypeError(f"more than one ONNX translation registered for {op}: {[f.__name__ for f in funcs]}")

                with stage(self.name, LOWERING, seconds), _counting_decomposition_fixes(fx_fixes):
                    try:
                        program = torch.onnx.export(
                            exported,
                            (),
                            kwargs=None,
                            dynamo=True,
                            opset_version=opset,
                            custom_translation_table=table,
                            optimize=optimize,
                            external_data=config.external_data,
                            verbose=False,
                        )
                    except Exception as error:  # noqa: BLE001 - reported with the error torch.onnx wraps
                        raise _lowering_error(self.name, error) from error
                    _record_translations_used(translations, program)

            # ── Stage 5: ONNX IR fixes ──
            with stage(self.name, "Stage 5: ONNX IR fixes", seconds):
                ir_fixes = apply_onnx_ir_fixes(program.model)
        self.ir_fixes_applied = ir_fixes

        with stage(self.name, "output names", seconds):
            name_graph_outputs(program.model, output_names(exported))
            drop_size_outputs(program.model, exported)

        # ── Stage 6: ONNX Runtime fusions ──
        with stage(self.name, "Stage 6: ONNX Runtime fusions", seconds):
            if level == "ort-cpu":
                self.fusions = fuse_for_onnxruntime(program.model)

        # ── Stage 7: Quantization ──
        with stage(self.name, "Stage 7: Quantization", seconds):
            if config.quantize:
                calibration = config.calibration_inputs or [inputs]
                if config.quantize == "int8-dynamic":
                    self.float_matmuls = outlier_matmuls(program.model, calibration)
                program.model = quantize_model(program.model, config.quantize, calibration, keep_float=self.float_matmuls)

        if config.output_path:
            with stage(self.name, "save", seconds):
                program.save(str(config.output_path), external_data=config.external_data)
        return dataclasses.replace(
            traced,
            program=program,
            workarounds_fired=list(fired),
            stage_seconds=seconds,
            optimized=optimize,
            fx_fixes_applied=fx_fixes[0],
            ir_fixes_applied=ir_fixes,
        )

    def manifest_entries(self) -> dict[str, Any]:
        """What ``export.json`` records of the last export under ``"onnx"``: opset, optimisation level,
        the onnxruntime fusions applied, the number of nodes the IR fixes changed and, for
        ``int8-dynamic``, the ``MatMul``/``Gemm`` nodes left float for their activation's outliers."""
        quantize = self.config.quantize if self.config is not None else None
        entry = {"opset": self.opset, "optimize": self.optimize_level, "fusions": dict(self.fusions), "ir_fixes_applied": self.ir_fixes_applied}
        if quantize == "int8-dynamic":
            entry["float_matmuls"] = list(self.float_matmuls)
        return {"onnx": entry | {"quantize": quantize}}

    # ── Save and run ──────────────────────────────────────────────────────────

    def save(self, program: Any, directory: str | os.PathLike[str]) -> Path:
        """Write ``program`` as ``directory/model.onnx`` (weights in ``model.onnx.data`` when
        ``config.external_data``) and return the path."""
        path = Path(directory) / self.artifact_name
        path.parent.mkdir(parents=True, exist_ok=True)
        external = self.config.external_data if self.config is not None else True
        program.save(str(path), external_data=external)
        return path

    def graph_output_names(self, program: Any) -> list[str] | None:
        """The ONNX graph's output names (an updated cache is ``present.past_key_values_N``)."""
        return [value.name for value in program.model.graph.outputs]

    def load_runner(self, path: str | os.PathLike[str]) -> Any:
        """A callable ``run(inputs) -> output arrays in flatten order`` over the saved ``.onnx`` in onnxruntime (CPU)."""
        from ..runtime.ort_runner import OrtRunner

        register_model_pytrees(None)
        return OrtRunner(path)


# ── Stage helpers ─────────────────────────────────────────────────────────────

LOWERING = "lowering (torch.onnx.export)"

#: modules that define custom torch ops some ONNX translation is registered for
_CUSTOM_OP_MODULES = ("transformers.integrations.moe",)  # torch.ops.transformers.grouped_mm_fallback


def _load_custom_op_namespaces() -> None:
    """Import the modules defining the custom ops the translation table names, so they resolve."""
    import importlib

    for module in _CUSTOM_OP_MODULES:
        importlib.import_module(module)


def _lowering_error(exporter: str, error: BaseException) -> ExportStageError:
    """An ExportStageError for a torch.onnx failure, worded from the error torch.onnx wrapped (its
    ConversionError's first line is a generic "Failed to decompose/translate ..." banner)."""
    cause: BaseException = error
    while type(cause).__module__.startswith("torch.onnx") and cause.__cause__ is not None:
        cause = cause.__cause__
    return ExportStageError(exporter, LOWERING, first_line(cause), blamed_line(cause))

_DECOMPOSITION_FIX_COUNTER: list[list[int]] = []


@contextlib.contextmanager
def _counting_decomposition_fixes(counter: list[int]) -> Iterator[None]:
    """Let the Stage 2 hook add the nodes it fixes to ``counter[0]`` (the export's FX fix count)."""
    _DECOMPOSITION_FIX_COUNTER.append(counter)
    try:
        yield
    finally:
        _DECOMPOSITION_FIX_COUNTER.pop()


def record_decomposition_fixes(count: int) -> None:
    """Called by the Stage 2 hook with the number of nodes the FX node fixes consumed after decomposition."""
    if _DECOMPOSITION_FIX_COUNTER:
        _DECOMPOSITION_FIX_COUNTER[-1][0] += count


def _record_translations_used(translations: list[tuple[Any, registry.Workaround]], program: Any) -> None:
    """Record as fired each translation whose op is a node of the program torch.onnx lowered (its
    decomposed ``exported_program``); several translations of one op are all recorded."""
    lowered = getattr(program, "exported_program", None)
    if lowered is None or not translations:
        return
    used = {
        node.target
        for module in lowered.graph_module.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
        if node.op == "call_function"
    }
    for op, workaround in translations:
        if op in used:
            registry.record_fired(workaround)


def drop_size_outputs(model: Any, exported: torch.export.ExportedProgram) -> int:
    """Remove the graph outputs that are sizes (a ``SymInt``/``SymFloat``/``SymBool`` user output of the
    dynamic program, as a model returns its feature-map sides); return how many were removed.

    Eager returns such an output as a Python number, and a static export folds it into a constant that
    is no output, so the ONNX model of either export has the same outputs: the tensors, in flatten
    order. Left in, a dynamic model would add one int64 scalar per size (MaskFormer's Swin backbone: ten).
    Constant user outputs are no graph outputs (torch.onnx leaves them out), so they are not counted;
    an output is removed only when it is a scalar. Removing outputs runs onnx_ir's
    ``RemoveUnusedNodesPass``, which drops every node and initializer no output needs (after the
    optimizer there are none but the sizes' own).
    """
    from onnx_ir.passes.common import RemoveUnusedNodesPass
    from torch.export.graph_signature import ConstantArgument, OutputKind, SymBoolArgument, SymFloatArgument, SymIntArgument

    user = [s for s in exported.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT and not isinstance(s.arg, ConstantArgument)]
    sizes = (SymIntArgument, SymFloatArgument, SymBoolArgument)
    if not any(isinstance(spec.arg, sizes) for spec in user):
        return 0
    outputs = model.graph.outputs
    if len(user) != len(outputs):
        logger.warning("the ONNX graph has %d outputs for %d program outputs; its size outputs are kept", len(outputs), len(user))
        return 0
    drop = [i for i, spec in enumerate(user) if isinstance(spec.arg, sizes) and outputs[i].shape is not None and len(outputs[i].shape) == 0]
    for index in reversed(drop):
        outputs.pop(index)
    if drop:
        RemoveUnusedNodesPass()(model)
    return len(drop)


def name_graph_outputs(model: Any, names: list[str]) -> None:
    """Rename the graph outputs of ``model`` (an ``onnx_ir.Model``) to the model's output names
    (``last_hidden_state``, ``logits``, ``past_key_values_0``, ...) instead of the name of the node that
    produced them. An output whose name an input already has (an updated cache) gets the prefix
    ``present.``; one that is itself a graph input is left as it is."""
    outputs = list(model.graph.outputs)
    if len(names) != len(outputs):
        return
    taken = {v.name for v in model.graph.inputs}
    for value, name in zip(outputs, names):
        if value in model.graph.inputs or value.is_initializer():
            continue
        value.name = f"present.{name}" if name in taken else name
        taken.add(value.name)


def apply_onnx_ir_fixes(model: Any) -> int:
    """Run every registered ONNX IR fix on the main graph and every function of ``model`` (an ``onnx_ir.Model``).

    Returns the number of nodes changed; a fix that changed one is recorded as fired
    (:func:`hf_exporters.registry.recording_fired`)."""
    changed = 0
    for fix in registry.onnx_ir_fixes(stage="Stage 5: ONNX IR fixes"):
        count = fix.func(model.graph)
        for function in model.functions.values():
            count += fix.func(function)
        if count:
            registry.record_fired(fix)
        changed += count
    return changed


__all__ = ["OnnxExporter", "apply_onnx_ir_fixes", "name_graph_outputs", "newest_opset"]

