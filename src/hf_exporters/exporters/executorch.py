"""ExecutorchExporter: a transformers model to an ExecuTorch program (``.pte``)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from .. import registry
from ..config import ExecutorchConfig
from ..deps import require
from ..errors import InputError
from ..pytree import register_model_pytrees
from ..runtime.et_runner import equal_axes_method, index_bounds_method, input_mutations_method, static_axes_method
from ..shapes import size_oblivious_sizes
from ..workarounds.executorch.fx_program_fixes import caller_maxima, dynamic_dim_max
from ..workarounds.executorch.lowering_speed import check_pinned_internals, defer_auto_functionalized_module, lazy_graph_modules_made_plain
from ._common import existing_objects_frozen, normalize_inputs, stage
from .executorch_quantize import check_embedding_quantize, check_quantize, fuse_quantized_embeddings, quantize_embeddings, quantize_linears
from .dynamo import DynamoExporter
from .result import ExportResult, trace_stage_seconds


def _input_mutation_outputs(exported: torch.export.ExportedProgram) -> int:
    kind = torch.export.graph_signature.OutputKind.USER_INPUT_MUTATION
    return sum(spec.kind == kind for spec in exported.graph_signature.output_specs)


#: operators (their name without namespace and overload) whose output holds only values of their first
#: argument: an index passed through them still indexes the same axis
_VALUE_PRESERVING = frozenset({
    "view", "view_copy", "_unsafe_view", "reshape", "expand", "expand_copy", "permute", "permute_copy", "squeeze", "squeeze_copy",
    "unsqueeze", "unsqueeze_copy", "clone", "_clone_dim_order", "_to_copy", "_to_dim_order_copy", "slice", "slice_copy",
    "select", "select_copy", "alias", "alias_copy", "flatten", "contiguous", "_local_scalar_dense",
})

#: the kinds of bound :func:`input_index_bounds` records (kept in sync with the runners' messages): the rows
#: of an embedding table, the positions of an axis, the run of positions written from the input's first
#: value (one per element)
EMBEDDING_ROWS, AXIS_POSITIONS, START_POSITIONS = 0, 1, 2


def _operator_name(target: Any) -> str:
    """``aten.view_copy.default`` -> ``view_copy`` (the edge dialect's and torch's operators alike, custom
    operators included); a higher-order operator's name (``auto_functionalized_v2``)."""
    name = getattr(getattr(target, "_op", target), "_opname", None)  # an edge operator wraps torch's
    if isinstance(name, str):
        return name
    parts = str(target).split(".")
    return parts[-2] if len(parts) >= 3 else parts[-1]


def input_index_bounds(exported: torch.export.ExportedProgram) -> list[int]:
    """``[position, size, kind, ...]``: every user input that indexes a tensor, directly or through operators
    that only move or cast its values (views, copies, slices, dtype casts), with its position among the
    method's inputs, the size it indexes and the kind of bound: :data:`EMBEDDING_ROWS` (the rows of an
    embedding table: ``aten.embedding``, ExecuTorch's quantized ``embedding_byte`` / ``embedding_4bit``) or
    :data:`AXIS_POSITIONS` (an axis written or read at the index: ``index_put``, ``index_copy``,
    ``index_select``, as a cache held in the program is written at ``cache_position``) or
    :data:`START_POSITIONS` (the start position of ExecuTorch's ``llama::update_cache`` and
    ``llama::custom_sdpa``, read from the input's first value with ``.item()``: the run of one position per
    element must fit). An input indexing several tensors gets the smallest size.

    ExecuTorch's quantized embedding kernels check an index with ``ET_CHECK``, which aborts the whole
    process on an index outside ``[0, size)``, and its ``index_put`` checks only part of an index tensor;
    the runners read these bounds from the program and refuse such inputs before ``execute``
    (:class:`~hf_exporters.runtime.et_runner.ExecutorchRunner`, the C++ runner). An index computed by
    arithmetic (``ids + 1``) is not followed: it gets no bound."""
    positions: dict[str, int] = {}
    position = 0
    for spec in exported.graph_signature.input_specs:
        if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT:
            if isinstance(spec.arg, torch.export.graph_signature.TensorArgument):
                positions[spec.arg.name] = position
            position += 1

    def source(index: Any) -> int | None:
        while isinstance(index, torch.fx.Node) and index.op == "call_function" and _operator_name(index.target) in _VALUE_PRESERVING:
            index = index.args[0]
        return positions.get(index.name) if isinstance(index, torch.fx.Node) and index.op == "placeholder" else None

    def size(node: Any, axis: int) -> int | None:
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dim() <= axis or not isinstance(value.shape[axis], int):
            return None
        return int(value.shape[axis])

    bounds: dict[int, tuple[int, int]] = {}

    def record(index: Any, bound: int | None, kind: int) -> None:
        at = source(index)
        if at is not None and bound is not None and (
            at not in bounds or bound < bounds[at][0] or (bound == bounds[at][0] and kind == START_POSITIONS)  # the stricter check
        ):
            bounds[at] = (bound, kind)

    for node in exported.graph.nodes:
        if node.op != "call_function":
            continue
        name = _operator_name(node.target)
        if name == "embedding":
            record(node.args[1], size(node.args[0], 0) if size(node.args[0], 1) is not None else None, EMBEDDING_ROWS)
        elif name in ("embedding_byte", "embedding_4bit"):  # the quantized ops take the indices last
            record(node.args[-1], size(node.args[0], 0), EMBEDDING_ROWS)
        elif name in ("index_put", "index_put_") and isinstance(node.args[1], (list, tuple)):
            for axis, index in enumerate(node.args[1]):
                record(index, size(node.args[0], axis), AXIS_POSITIONS)
        elif name in ("index_copy", "index_copy_", "index_select") and isinstance(node.args[1], int):
            record(node.args[2], size(node.args[0], node.args[1]), AXIS_POSITIONS)
        elif name == "update_cache" and len(node.args) > 2:  # ExecuTorch's llama::update_cache(value, cache, start_pos)
            record(node.args[2], size(node.args[1], 1), START_POSITIONS)
        elif name in ("auto_functionalized", "auto_functionalized_v2") and node.args and _operator_name(node.args[0]) == "update_cache":
            # the same call as functionalisation leaves it: the cache is a keyword, or one of the mutated bases
            kwargs = node.kwargs
            cache = kwargs["cache"] if "cache" in kwargs else kwargs.get("_all_bases", [None])[kwargs.get("_cache_base_index", 0)]
            record(kwargs.get("start_pos"), size(cache, 1), START_POSITIONS)
        elif name == "custom_sdpa" and len(node.args) > 3:  # llama::custom_sdpa(query, key_cache, value_cache, start_pos, ...)
            record(node.args[3], size(node.args[1], 1), START_POSITIONS)
    return [v for at in sorted(bounds) for v in (at, *bounds[at])]


def input_equal_axes(exported: torch.export.ExportedProgram) -> list[int]:
    """``[position_a, axis_a, position_b, axis_b, ...]``: the pairs of user-input axes that the trace tied to
    one size (the same symbolic size: ``input_ids``' sequence and ``cache_position``'s length, or
    ``input_ids`` and ``attention_mask``), each tied axis paired with the first one of its size.

    ExecuTorch checks each input against its own planned bounds only; inputs whose tied sizes differ
    reach kernels that assume they agree, and some abort the process (ExecuTorch's ``llama::custom_sdpa``
    over a cache held in the program: SIGABRT). The runners read these pairs from the program and refuse
    such inputs before ``execute``."""
    groups: dict[str, list[tuple[int, int]]] = {}
    for position, axis, size in _user_input_axes(exported):
        if not isinstance(size, int):
            groups.setdefault(str(size.node.expr), []).append((position, axis))
    return [v for members in groups.values() for other in members[1:] for v in (*members[0], *other)]


def _user_input_axes(exported: torch.export.ExportedProgram) -> Iterator[tuple[int, int, int | torch.SymInt]]:
    """``(position, axis, size)`` for every axis of every user tensor input, ``position`` among all user inputs
    (tensors or not); ``size`` an ``int`` where the trace kept it at one value, else its ``SymInt``."""
    nodes = {node.name: node for node in exported.graph.nodes if node.op == "placeholder"}
    user = [spec for spec in exported.graph_signature.input_specs if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    for position, spec in enumerate(user):
        node = nodes.get(getattr(spec.arg, "name", ""))
        value = node.meta.get("val") if node is not None else None
        if isinstance(value, torch.Tensor):
            for axis, size in enumerate(value.shape):
                fixed = isinstance(size, int) or size.node.expr.is_number
                yield position, axis, int(size) if fixed else size


def input_static_axes(exported: torch.export.ExportedProgram) -> list[int]:
    """``[position, axis, size, ...]``: every axis of a user tensor input that the trace kept at one size, when
    some other input axis is dynamic; ``[]`` for a program whose input axes are all static.

    ExecuTorch plans a dynamic program's inputs for their largest sizes and accepts any input that fits
    them, so an input whose static axis differs from the traced size (a batch of 2 for a program traced at
    batch 1, fewer elements on a static axis) can reach kernels that assume the traced size, and some
    abort the process (ExecuTorch's ``llama::update_cache`` on a cache held in the program: SIGABRT). The
    runners read these axes from the program and refuse such inputs before ``execute``. (A program with
    every axis static needs none: ExecuTorch refuses to resize its inputs.)"""
    every = list(_user_input_axes(exported))
    if all(isinstance(size, int) for _, _, size in every):
        return []
    return [v for position, axis, size in every if isinstance(size, int) for v in (position, axis, size)]


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
    #: the stages of ``stage_seconds`` done once for every method of a program (:meth:`run_methods`)
    PROGRAM_STAGES = ("lowering (to_edge_transform_and_lower)", "serialisation (to_executorch)")

    def save(self, program: Any, directory: str | os.PathLike[str]) -> Path:
        """Write ``program.buffer`` as ``directory/model.pte`` and return the path."""
        path = Path(directory) / self.artifact_name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(program.buffer)
        return path

    def load_runner(self, path: str | os.PathLike[str], method: str = "forward") -> Any:
        """A callable ``run(inputs) -> output tensors in flatten order`` over ``method`` of the ``.pte`` with
        executorch.runtime."""
        from ..runtime.et_runner import ExecutorchRunner

        register_model_pytrees(None)
        return ExecutorchRunner(path, method)

    def manifest_entries(self) -> dict[str, Any]:
        """What ``export.json`` records of the last export's quantization under ``"executorch"`` (mode, group
        size, linear layers quantized and left float); nothing for a float export."""
        quantization = getattr(self, "quantization", None)
        return {"executorch": dict(quantization)} if quantization else {}

    def export(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: ExecutorchConfig | None = None) -> Any:
        """Trace ``model(**inputs)`` and lower it to an ExecuTorch program: ``run(model, inputs, config).program``.

        Returns:
            the ``ExecutorchProgramManager``; its ``buffer`` is the ``.pte`` file's content.

        Raises:
            MissingDependencyError: executorch is not installed.
            ExportStageError: a stage, the trace or the lowering failed; the message names it.
        """
        return self.run(model, inputs, config).program

    def run(self, model: torch.nn.Module, inputs: Mapping[str, Any], config: ExecutorchConfig | None = None) -> ExportResult:
        """Trace ``model(**inputs)``, lower it to an ExecuTorch program for ``config.backend`` and report how.

        Returns:
            an :class:`~hf_exporters.ExportResult`: ``program`` is the ``ExecutorchProgramManager``,
            ``exported_program`` the trace as the Stage 4 and 5 fixes left it, ``partitions`` the number
            of delegated partitions of each method; ``stage_seconds`` lists the five stages, the trace's
            dynamo stages (``dynamo: Stage N: ...``), the trace, the lowering and the serialisation.

        With ``config.quantize``, Stage 1 quantizes the linear layers of a copy of ``model``
        (:func:`~hf_exporters.exporters.executorch_quantize.quantize_linears`); with
        ``config.quantize_embeddings`` its embedding tables too (``quantize_embeddings``), looked up by
        ExecuTorch's quantized kernel after the lowering (``fuse_quantized_embeddings``); ``model`` is left in float.

        Raises:
            MissingDependencyError: executorch (or, to quantize, torchao) is not installed.
            InputError: an unknown backend or quantization mode, or a group size no linear layer takes.
            ExportStageError: a stage, the trace or the lowering failed; the message names it.
        """
        return self.run_methods({"forward": (model, inputs)}, config)["forward"]

    def run_methods(
        self, methods: Mapping[str, tuple[torch.nn.Module, Mapping[str, Any]]], config: ExecutorchConfig | dict[str, ExecutorchConfig] | None = None
    ) -> dict[str, ExportResult]:
        """Trace each ``module(**inputs)`` of ``methods`` (method name -> ``(module, inputs)``) and lower them
        all in one ``to_edge_transform_and_lower`` call: one multi-method program whose methods share the
        weights they have in common (stored once in the ``.pte``).

        ``config``: one config for every method, or method name -> config for each (``dynamic_shapes`` and
        ``max_seq_len`` may differ by method; the fields of :data:`SHARED_CONFIG_FIELDS` must be equal).

        Stages 1, 2, 4 and 5 run per method, Stage 3 and the lowering once for all. Each method ``m``
        other than ``forward`` records its number of mutated-input outputs in the constant method
        :func:`~hf_exporters.runtime.et_runner.input_mutations_method` (``m``).

        Returns:
            method name -> :class:`~hf_exporters.ExportResult`, in the order of ``methods``; every result
            holds the same ``program`` (the ``ExecutorchProgramManager``), its own method's ``partitions``
            and ``workarounds_fired`` (its stages' and the shared lowering's); ``stage_seconds`` holds the
            method's own stages and the shared Stage 3, lowering and serialisation (the program's, not the
            method's alone).

        Raises:
            InputError: as :meth:`run`; a config dict without exactly one entry per method; configs that
                differ in a shared field; methods traced under different shape reasoning (size-oblivious and
                plain: one lowering cannot do both; the error has ``mixed_reasoning = True``).
            MissingDependencyError, ExportStageError: as :meth:`run`.
        """
        if not methods:
            raise InputError("no method to export")
        if isinstance(config, dict) and set(config) != set(methods):
            raise InputError(f"one config per method: configs for {sorted(config)}, methods {sorted(methods)}")
        configs = {name: (config[name] if isinstance(config, dict) else config) or ExecutorchConfig() for name in methods}
        first = next(iter(configs.values()))
        for name, method_config in configs.items():
            for field in SHARED_CONFIG_FIELDS:
                if getattr(method_config, field) != getattr(first, field):
                    raise InputError(
                        f"the methods of one program share {field}: {getattr(first, field)!r} for {next(iter(configs))!r}, "
                        f"{getattr(method_config, field)!r} for {name!r}"
                    )
        self.quantization = None
        scope = f"executorch.{first.backend}"
        seconds: dict[str, dict[str, float]] = {name: {} for name in methods}  # Stages 1-2 and the trace
        fixes: dict[str, dict[str, float]] = {name: {} for name in methods}  # Stages 4-5
        traced: dict[str, ExportResult] = {}
        own: dict[str, list[Any]] = {name: [] for name in methods}  # the workarounds each method's stages fired
        embeddings = None
        with registry.export_lock(), existing_objects_frozen() as freeze_new, registry.recording_fired() as fired, contextlib.ExitStack() as stack:
            defer_auto_functionalized_module()  # before executorch.exir imports it (see lowering_speed)
            exir = require("executorch.exir", "The ExecuTorch exporter")
            freeze_new()  # ExecuTorch's modules, imported on first use, are not walked by the collector either
            for name, (model, inputs) in methods.items():
                with registry.recording_fired() as method_fired:
                    method_config = configs[name]
                    inputs = normalize_inputs(inputs)
                    # ── Stage 1: Backend preparation ──
                    with stage(self.name, "Stage 1: Backend preparation", seconds[name]):
                        backends = registry.executorch_backends()
                        if method_config.backend not in backends:
                            raise InputError(
                                f"unknown ExecuTorch backend {method_config.backend!r}; known backends: {', '.join(sorted(backends))}"
                            )
                        model, inputs, partitioners = backends[method_config.backend](model, inputs)
                        embeddings = check_embedding_quantize(method_config.quantize_embeddings)
                        if method_config.quantize is not None or embeddings is not None:
                            mode, group_size = check_quantize(method_config.quantize, method_config.group_size)
                            model = copy.deepcopy(model)  # the caller's model stays the float reference
                            quantization: dict[str, Any] = {}
                            if mode is not None:
                                model, count, left_float = quantize_linears(model, mode, group_size, in_place=True)
                                quantization.update(quantize=mode, group_size=group_size, quantized_linears=count, float_linears=left_float)
                            if embeddings is not None:
                                quantization.update(quantize_embeddings=embeddings, quantized_embeddings=quantize_embeddings(model, embeddings))
                            self.quantization = quantization

                    with contextlib.ExitStack() as trace_patches:  # the Stage 2 patches: for the trace only
                        # ── Stage 2: Torch patches ──
                        with stage(self.name, "Stage 2: Torch patches", seconds[name]):
                            trace_patches.enter_context(registry.apply_patches(scope, stage="Stage 2: Torch patches"))
                        traced[name] = super().run(model, inputs, method_config)
                    seconds[name].update(trace_stage_seconds(traced[name]))
                own[name].extend(method_fired)

            # ── Stage 3: ExecuTorch patches ──
            patching: dict[str, float] = {}
            with stage(self.name, "Stage 3: ExecuTorch patches", patching):
                check_pinned_internals(scope)
                stack.callback(lazy_graph_modules_made_plain)  # after the patches end (see lowering_speed)
                stack.enter_context(registry.apply_patches(scope, stage="Stage 3: ExecuTorch patches"))

            for name, result in traced.items():
                exported = result.exported_program
                with registry.recording_fired() as method_fired:
                    # ── Stage 4: FX program fixes ──
                    with stage(self.name, "Stage 4: FX program fixes", fixes[name]), dynamic_dim_max(
                        configs[name].max_seq_len, caller_maxima(configs[name].dynamic_shapes)
                    ):
                        registry.apply_fx_program_fixes(scope, exported, stage="Stage 4: FX program fixes")

                    # ── Stage 5: FX node fixes ──
                    with stage(self.name, "Stage 5: FX node fixes", fixes[name]):
                        registry.apply_fx_node_fixes(scope, exported.graph_module, stage="Stage 5: FX node fixes")
                own[name].extend(w for w in method_fired if not any(w is v for v in own[name]))

            # The lowering re-traces the programs (run_decompositions); sizes traced from an example of 0
            # or 1 must stay symbolic there too, as in the trace (and plain when the trace fell back to
            # plain reasoning). One lowering has one way of reasoning: methods traced differently cannot
            # share it.
            reasoning = {name: result.size_oblivious for name, result in traced.items() if result.dynamic_shapes is not None}
            if len(set(reasoning.values())) > 1:
                error = InputError(
                    "the methods were traced under different shape reasoning (size-oblivious: "
                    f"{sorted(n for n, v in reasoning.items() if v)}; plain: {sorted(n for n, v in reasoning.items() if not v)}), "
                    "and one lowering reasons one way: export them as separate programs"
                )
                error.mixed_reasoning = True  # type: ignore[attr-defined]
                raise error
            if any(reasoning.values()):
                stack.enter_context(size_oblivious_sizes())
            programs = {name: result.exported_program for name, result in traced.items()}
            shared: dict[str, float] = {}  # the lowering and serialisation of every method
            lowering_fired = stack.enter_context(registry.recording_fired())
            with stage(self.name, LOWERING, shared):
                edge = exir.to_edge_transform_and_lower(
                    programs["forward"] if list(programs) == ["forward"] else programs,
                    partitioner=partitioners or None,
                    constant_methods={input_mutations_method(name): 0 for name in programs},
                )
                # Functionalisation in the lowering turns in-place cache updates into user-input
                # mutations, which ExecuTorch returns before the model outputs: record how many.
                for name in programs:
                    edge._config_methods[input_mutations_method(name)] = _input_mutation_outputs(edge.exported_program(name))
                if embeddings is not None:
                    self.quantization["embedding_lookups"] = fuse_quantized_embeddings(edge)
                # The inputs that index a tensor, with the size they index: the runners refuse an index
                # past it (a quantized embedding kernel aborts the process on one).
                for name in programs:
                    bounds = input_index_bounds(edge.exported_program(name))
                    if bounds:
                        edge._config_methods[index_bounds_method(name)] = bounds
                    # the input axes traced as one size: the runners refuse inputs where they differ
                    tied = input_equal_axes(edge.exported_program(name))
                    if tied:
                        edge._config_methods[equal_axes_method(name)] = tied
                    # the input axes traced at one size in a dynamic program: the runners refuse other sizes there
                    static = input_static_axes(edge.exported_program(name))
                    if static:
                        edge._config_methods[static_axes_method(name)] = static
            with stage(self.name, SERIALISATION, shared):
                manager = edge.to_executorch()
        partitions = delegated_partitions(manager)
        return {
            name: dataclasses.replace(
                result,
                program=manager,
                # one method: every workaround in the order it first acted; several: the method's own stages', then
                # the shared lowering's
                workarounds_fired=list(fired) if len(traced) == 1 else own[name] + [w for w in lowering_fired if not any(w is v for v in own[name])],
                stage_seconds={**seconds[name], **patching, **fixes[name], **shared},
                partitions=partitions if len(traced) == 1 else {name: partitions[name]},
            )
            for name, result in traced.items()
        }


#: ExecutorchConfig fields every method of one program must share (one lowering, one partitioner, one quantization)
SHARED_CONFIG_FIELDS = ("backend", "quantize", "group_size", "quantize_embeddings")

#: stage titles of the lowering and the serialisation, in errors and ``stage_seconds``
LOWERING = "lowering (to_edge_transform_and_lower)"
SERIALISATION = "serialisation (to_executorch)"


def delegated_partitions(manager: Any) -> dict[str, int]:
    """Method name -> the number of delegated partitions in its lowered program: the delegate call
    nodes (``executorch_call_delegate``) of its graph and nested subgraphs. 0 for a method that runs
    on portable kernels alone."""
    from executorch.exir.delegate import executorch_call_delegate

    counts = {}
    for method in sorted(manager.methods):
        program = manager.exported_program(method)
        counts[method] = sum(
            node.op == "call_function" and node.target is executorch_call_delegate
            for module in program.graph_module.modules()
            if isinstance(module, torch.fx.GraphModule)
            for node in module.graph.nodes
        )
    return counts
