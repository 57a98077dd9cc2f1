"""ExecuTorch lowering work that is done again on a graph it can no longer change: patches of
ExecutorchExporter's Stage 3 (ExecuTorch patches), active during ``to_edge_transform_and_lower``.

Pattern: ExecuTorch's lowering re-traces the whole graph for steps that find nothing to do on it.
``to_edge_transform_and_lower`` decomposes each program a third time after it has marked the
operators the partitioner keeps, even when none is left for that pass to decompose; and XNNPACK's
``preprocess`` runs its whole pipeline of 17 passes on every partition, where most passes
(batch-norm fusion, 1-D convolutions, PReLU, bilinear upsampling, quantisation metadata, ...)
look for operators the partition does not hold and then re-trace it through an FX interpreter
with fake tensors anyway. Those re-traces were half of a tiny Llama's lowering (``benchmarks/
executorch_profile.py``). The patches skip a step only when the operators it acts on are absent
from the graph, so the program is the same.

These patches hook ExecuTorch internals and are pinned to the ExecuTorch version they were written
for (:data:`SUPPORTED_EXECUTORCH`): :func:`check_pinned_internals`, called by the exporter's Stage 3,
fails naming the stage when the version differs or a hooked internal has moved.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ... import registry
from ...registry import register_patch

#: ExecuTorch versions the patches of this module were written for
SUPPORTED_EXECUTORCH = ("1.4.",)

#: XNNPACK's default pass pipeline (``XNNPACKPassManager``) as this module knows it, in order
KNOWN_XNNPACK_PASSES = (
    "XNNPACKRemoveCloneOpsTransform",
    "DimOrderOpsRevertPass",
    "ConvertToUpsampleBilinear2d",
    "ConvertToLinearPass",
    "PropagateCustomMetaPass",
    "ConvertToSDPAPass",
    "ConstPropPass",
    "FuseBatchNormPass",
    "DecomposeBatchNorm",
    "FuseActivationPass",
    "DecomposeConcatenate",
    "RemoveGetItemPass",
    "InsertPadQDQPass",
    "Conv1dUnsqueezePass",
    "PReLUReshapePass",
    "ChannelsLastTaggedReshapePass",
    "RemoveRedundantCopyPass",
)

_STAGE = "Stage 3: ExecuTorch patches"
_PINNED = (
    "_patch_auto_functionalized_removal_only_where_present",
    "_patch_edge_dtype_check_reads_metadata",
    "_patch_xnnpack_passes_skip_absent_operators",
    "_patch_no_third_decomposition_when_nothing_is_left",
    "_patch_edge_passes_skip_absent_operators",
)

#: the passes ExecuTorch 1.4 runs before turning aten operators into edge operators
#: (``_get_aten_to_edge_passes``), in order, as this module knows them
KNOWN_EDGE_PASSES = (
    "ReplaceSymSizeOpPass",
    "NormalizeTransposePass",
    "ReplaceBrokenOpsWithFunctionalOpsPass",
    "ScalarToTensorPass",
    "SymToTensorPass",
    "RemoveNoopPass",
    "PruneEmptyTensorsPass",
    "RemoveToCopyPass",
    "RemoveMixedTypeOperators",
)
#: torch versions the provenance patch (:func:`_patch_node_provenance_shared`) was written for
SUPPORTED_TORCH = ("2.13.",)


def _executorch_version() -> str:
    return importlib.metadata.version("executorch")


def check_pinned_internals(scope: str) -> None:
    """Fail when the ExecuTorch internals that this module's patches selected for ``scope``
    (``"executorch.xnnpack"``) hook are not the ones they were written for; nothing when none is selected.

    Raises:
        RuntimeError: ExecuTorch is another version, a hooked attribute is missing, or XNNPACK's pass
            pipeline differs from :data:`KNOWN_XNNPACK_PASSES`.
    """
    pinned = [
        w for w in registry.list_workarounds(scope, stage=_STAGE) if w.kind == "patch" and w.func.__name__ in _PINNED
    ]
    if not pinned:
        return
    version = _executorch_version()
    if not version.startswith(SUPPORTED_EXECUTORCH):
        raise RuntimeError(
            f"the lowering-speed patches hook ExecuTorch internals written for executorch "
            f"{', '.join(v + 'x' for v in SUPPORTED_EXECUTORCH)}; executorch {version} is installed"
        )
    for workaround in pinned:
        owner_path, _, attribute = workaround.target.rpartition(".")
        try:
            owner = registry.resolve_dotted_path(owner_path)
        except (ImportError, AttributeError) as error:
            raise RuntimeError(f"ExecuTorch internal {owner_path!r} has moved ({error}); {workaround.name} cannot hook it") from error
        if not hasattr(owner, attribute):
            raise RuntimeError(f"ExecuTorch internal {workaround.target!r} has moved; {workaround.name} cannot hook it")
    selected = {w.func.__name__ for w in registry.list_workarounds(scope, stage=_STAGE) if w.kind == "patch"}
    if "_patch_node_provenance_shared" in selected:
        _node_source_is_known()
    if "_patch_cia_ops_materialized_once" in selected:
        _cia_materialization_is_known()
    if "_patch_graph_modules_compiled_on_first_use" in selected:
        _lazy_graph_module_is_known()
    from executorch.exir.program import _program

    for helper in ("_remove_invalid_ops_for_not_decompose", "_default_decomposition_table"):
        if not hasattr(_program, helper):
            raise RuntimeError(f"ExecuTorch internal 'executorch.exir.program._program.{helper}' has moved")
    if any(w.func.__name__ == "_patch_xnnpack_passes_skip_absent_operators" for w in pinned):
        _xnnpack_pipeline_is_known()
    if any(w.func.__name__ == "_patch_edge_passes_skip_absent_operators" for w in pinned):
        _edge_passes_are_known()


def _xnnpack_pipeline_is_known() -> None:
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    names = tuple(p.__name__ for p in XNNPACKPassManager(None).passes)
    if names != KNOWN_XNNPACK_PASSES:
        raise RuntimeError(
            "XNNPACK's pass pipeline is not the one the lowering-speed patch was written for: "
            f"{list(names)} (known: {list(KNOWN_XNNPACK_PASSES)})"
        )


def _cia_materialization_is_known() -> None:
    import torch._export.utils as export_utils

    if not torch.__version__.startswith(SUPPORTED_TORCH):
        raise RuntimeError(
            f"the CIA-operator patch hooks torch._export.utils as torch {', '.join(v + 'x' for v in SUPPORTED_TORCH)} has it; "
            f"torch {torch.__version__} is installed"
        )
    if not hasattr(export_utils, "_collect_all_valid_cia_ops_for_namespace"):
        raise RuntimeError("torch internal 'torch._export.utils._collect_all_valid_cia_ops_for_namespace' has moved; _patch_cia_ops_materialized_once cannot hook it")


def _lazy_graph_module_is_known() -> None:
    from torch.fx import _lazy_graph_module

    if not torch.__version__.startswith(SUPPORTED_TORCH):
        raise RuntimeError(
            f"the graph-module patch hooks torch.fx.GraphModule.__new__ as torch {', '.join(v + 'x' for v in SUPPORTED_TORCH)} has it; "
            f"torch {torch.__version__} is installed"
        )
    lazy = getattr(_lazy_graph_module, "_LazyGraphModule", None)
    if lazy is None or not issubclass(lazy, torch.fx.GraphModule) or not all(hasattr(lazy, a) for a in ("_lazy_forward", "real_recompile")):
        raise RuntimeError(
            "torch internal 'torch.fx._lazy_graph_module._LazyGraphModule' has moved; "
            "_patch_graph_modules_compiled_on_first_use cannot use it"
        )


def _node_source_is_known() -> None:
    import torch.fx.traceback as fx_traceback

    if not torch.__version__.startswith(SUPPORTED_TORCH):
        raise RuntimeError(
            f"the provenance patch hooks torch.fx.traceback.NodeSource as torch "
            f"{', '.join(v + 'x' for v in SUPPORTED_TORCH)} has it; torch {torch.__version__} is installed"
        )
    fields = getattr(fx_traceback.NodeSource, "__annotations__", {})
    if not {"from_node", "node_info", "pass_name", "action"} <= set(fields) or not hasattr(fx_traceback.NodeSource, "NodeInfo"):
        raise RuntimeError("torch internal 'torch.fx.traceback.NodeSource' has moved; _patch_node_provenance_shared cannot hook it")


def _edge_passes_are_known() -> None:
    from executorch.exir import EdgeCompileConfig
    from executorch.exir.program import _program

    names = tuple(_pass_name(p) for p in _program._get_aten_to_edge_passes(EdgeCompileConfig())[0])
    if names != KNOWN_EDGE_PASSES:
        raise RuntimeError(
            "ExecuTorch's aten-to-edge passes are not the ones the lowering-speed patch was written for: "
            f"{list(names)} (known: {list(KNOWN_EDGE_PASSES)})"
        )


def _pass_name(each: Any) -> str:
    return getattr(each, "__name__", None) or type(each).__name__


# ── the edge-dialect conversion ──────────────────────────────────────────────


def _all_nodes(gm: torch.fx.GraphModule) -> Iterable[torch.fx.Node]:
    """The nodes of ``gm`` and of every graph module nested in it (control-flow branches)."""
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            yield from module.graph.nodes


def _all_targets(gm: torch.fx.GraphModule) -> set[Any]:
    return {node.target for node in _all_nodes(gm) if node.op == "call_function"}


def _promotes(gm: torch.fx.GraphModule) -> bool:
    """Whether ``RemoveMixedTypeOperators`` could insert a cast: some binary arithmetic call (of its allow
    list) whose arguments are not all tensors of the dtype it would compute in."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    aten = torch.ops.aten
    default, to_float = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT, ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT
    kinds = {aten.add.Tensor: default, aten.mul.Tensor: default, aten.sub.Tensor: default, aten.div.Tensor: to_float,
             aten.div.Tensor_mode: default, aten.minimum.default: default}
    for node in _all_nodes(gm):
        if node.op != "call_function" or node.target not in kinds or len(node.args) <= 1:
            continue
        values = [arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg for arg in node.args]
        if not all(isinstance(v, torch.Tensor) for v in values):
            return True  # a scalar or symbolic argument: let the pass decide
        kind = kinds[node.target]
        if node.target is aten.div.Tensor_mode and node.kwargs.get("rounding_mode") is None:
            kind = to_float
        dtype = elementwise_dtypes(*values, type_promotion_kind=kind)[1]
        if any(v.dtype != dtype for v in values):
            return True
    return False


def _edge_skip_rules() -> dict[str, Callable[[torch.fx.GraphModule], bool]]:
    """Pass name -> ``acts(graph_module)``: False when the aten-to-edge pass cannot change the graph. Each
    rule mirrors what the pass's ``call_operator`` rewrites in ExecuTorch 1.4; passes without a rule run."""
    symbolic = (torch.SymInt, torch.SymFloat, torch.SymBool)
    return {
        # aten.t -> aten.t_copy
        "NormalizeTransposePass": lambda gm: torch.ops.aten.t.default in _all_targets(gm),
        # every view operator -> its _copy variant
        "ReplaceBrokenOpsWithFunctionalOpsPass": lambda gm: any(
            isinstance(t, torch._ops.OpOverload) and t.is_view for t in _all_targets(gm)
        ),
        # a symbolic value passed where the schema takes a tensor -> scalar_tensor; no symbolic value, no change
        "SymToTensorPass": lambda gm: any(isinstance(n.meta.get("val"), symbolic) for n in _all_nodes(gm)),
        # binary arithmetic over mixed dtypes -> casts to the promoted dtype
        "RemoveMixedTypeOperators": _promotes,
    }


def _skipping(each: Any, acts: Callable[[torch.fx.GraphModule], bool]) -> Callable[[torch.fx.GraphModule], Any]:
    from torch.fx.passes.infra.pass_base import PassResult

    def run(gm: torch.fx.GraphModule) -> Any:
        if not acts(gm):
            return PassResult(gm, False)
        return each(gm)

    run.__name__ = _pass_name(each)
    return run


@register_patch("executorch", "executorch.exir.program._program._get_aten_to_edge_passes", stage=_STAGE)
def _patch_edge_passes_skip_absent_operators(original: Any) -> Any:
    """The conversion to the edge dialect skips each of its aten passes that finds nothing to rewrite.

    Pattern: every program lowered to ExecuTorch. ``_generate_edge_program`` runs nine passes over the
    aten graph before it renames operators into the edge dialect; four of them re-trace the whole graph
    through ``ExportPass`` with fake tensors to rewrite operators most models no longer hold after
    ``torch.export``'s functionalisation: ``aten.t`` (``NormalizeTransposePass``), view operators left
    un-functionalised (``ReplaceBrokenOpsWithFunctionalOpsPass``), symbolic values passed as tensors
    (``SymToTensorPass``, static shapes hold none) and binary arithmetic over mixed dtypes
    (``RemoveMixedTypeOperators``). On all-MiniLM-L6-v2 none of the four changes the graph and they take
    1.3 of an 8 s lowering. A pass is skipped only when what its ``call_operator`` rewrites is absent
    from the graph and its nested graphs, so the graph is the one the pass would return; the ``.pte``
    is byte-identical (tested).
    Models: every model lowered to ExecuTorch (BertModel, all-MiniLM-L6-v2, LlamaForCausalLM, ...).
    Upstream: pytorch/executorch exir/program/_program.py (``_generate_edge_program`` runs every pass of
        ``_get_aten_to_edge_passes`` on every program); the same kind of repeated re-trace as
        pytorch/executorch#1893 (XNNPACK's passes), not reported for the edge conversion.
    Remove when: the edge conversion's passes return without re-tracing when they find nothing (checked:
        the pass list is :data:`KNOWN_EDGE_PASSES` of ExecuTorch 1.4).
    """
    rules = _edge_skip_rules()

    def passes(config: Any) -> Any:
        pre, post = original(config)
        pre = [_skipping(p, rules[_pass_name(p)]) if _pass_name(p) in rules else p for p in pre]
        return pre, post

    return passes


# ── the auto_functionalized removal of to_executorch ─────────────────────────

#: the torch module whose import brings in inductor's lowering and pattern matcher (about 0.5 s, once
#: per process); ExecuTorch imports it for one function, which the patch below calls only when needed
DEFERRED_MODULE = "torch.export._remove_auto_functionalized_pass"


def defer_auto_functionalized_module() -> None:
    """Make :data:`DEFERRED_MODULE` load on first use instead of when ``executorch.exir`` imports it.

    Installs a stand-in module: its ``unsafe_remove_auto_functionalized_pass`` loads the real module on
    its first call and calls the real function; any other attribute loads the real module too. Nothing
    happens when the module is already loaded. The exporter calls this before importing
    ``executorch.exir``; with :func:`_patch_auto_functionalized_removal_only_where_present` a program
    without ``auto_functionalized`` calls never loads the module (nor inductor)."""
    if DEFERRED_MODULE in sys.modules:
        return
    stand_in = types.ModuleType(DEFERRED_MODULE, f"{DEFERRED_MODULE}, loaded on its first use (hf_exporters)")

    def load() -> types.ModuleType:
        if sys.modules.get(DEFERRED_MODULE) is stand_in:
            del sys.modules[DEFERRED_MODULE]
        return importlib.import_module(DEFERRED_MODULE)

    def unsafe_remove_auto_functionalized_pass(program: Any) -> Any:
        return load().unsafe_remove_auto_functionalized_pass(program)

    def attribute(name: str) -> Any:  # PEP 562: called for what the stand-in does not hold
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # module scans (inspect.getmodule reads every module's dunders) do not load it
        return getattr(load(), name)

    spec = importlib.util.find_spec(DEFERRED_MODULE)
    stand_in.__file__ = spec.origin if spec is not None else None
    stand_in.unsafe_remove_auto_functionalized_pass = unsafe_remove_auto_functionalized_pass  # type: ignore[attr-defined]
    stand_in.__getattr__ = attribute  # type: ignore[method-assign]
    sys.modules[DEFERRED_MODULE] = stand_in


def _holds_auto_functionalized(program: torch.export.ExportedProgram) -> bool:
    from torch._higher_order_ops.auto_functionalize import auto_functionalized, auto_functionalized_v2

    return any(node.op == "call_function" and node.target in (auto_functionalized, auto_functionalized_v2) for node in _all_nodes(program.graph_module))


@register_patch("executorch", "executorch.exir.program._program.unsafe_remove_auto_functionalized_pass", stage=_STAGE)
def _patch_auto_functionalized_removal_only_where_present(original: Any) -> Any:
    """``to_executorch`` calls torch's ``auto_functionalized`` removal only on a program that holds such a call.

    Pattern: every program serialised by ExecuTorch. ``to_executorch`` passes each program through
    ``torch.export``'s ``unsafe_remove_auto_functionalized_pass``, which turns ``auto_functionalized``
    calls (custom operators that mutate their inputs) back into the in-place operator, then drops
    ``copy_`` of a tensor onto itself and dead code. Its module imports inductor's pattern matcher and
    lowering for that first step, about 0.5 s of the first export in a process (the largest single cost
    of a tiny Llama's first export after ExecuTorch's own import). On a program without such a call the
    patch does the two other steps itself (self copies replaced by their source, dead code eliminated,
    under the program's signature hook as torch does), and the module is never loaded
    (:func:`defer_auto_functionalized_module`); a program with one gets torch's function. The ``.pte``
    is byte-identical (tested).
    Models: every model lowered to ExecuTorch; programs with ``auto_functionalized`` calls (custom
        mutating operators) take torch's path.
    Upstream: pytorch/pytorch torch/export/_remove_auto_functionalized_pass.py (imports
        ``torch._inductor.fx_passes.post_grad`` at module level) and pytorch/executorch
        exir/program/_program.py (imports it at module level); no upstream report found.
    Remove when: either import becomes lazy (checked: executorch 1.4 by :data:`SUPPORTED_EXECUTORCH`).
    """

    def remove(program: Any) -> Any:
        if _holds_auto_functionalized(program):
            return original(program)
        graph = program.graph
        with program.graph_module._set_replace_hook(program.graph_signature.get_replace_hook()):
            for node in list(graph.nodes):
                if node.op == "call_function" and node.target is torch.ops.aten.copy_.default and node.args[0] is node.args[1]:
                    node.replace_all_uses_with(node.args[0])
                    graph.erase_node(node)
            graph.eliminate_dead_code()
        return program

    return remove


# ── the edge verifier's dtype check ─────────────────────────────────────────


def _edge_op_arg_checker() -> Any:
    """ExecuTorch's ``EdgeOpArgValidator`` with the operator call taken out: its ``call_function`` records
    a violation when the dtypes of a call's tensor arguments and results are not ones the operator allows,
    then calls the operator; here that last step returns nothing, so the check runs on given values."""
    from executorch.exir.verification.arg_validator import EdgeOpArgValidator

    class _NoCall(torch.fx.Interpreter):
        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            return None

    class _Checker(EdgeOpArgValidator, _NoCall):
        """The validator's checks, its operator call resolved to :class:`_NoCall`'s (method order)."""

    return _Checker


@register_patch("executorch", "executorch.exir.verification.verifier._check_tensor_args_matching_op_allowed_dtype", stage=_STAGE)
def _patch_edge_dtype_check_reads_metadata(original: Any) -> Any:
    """The edge-dialect verifier's dtype check reads each call's tensor dtypes from the node's recorded
    value (``node.meta["val"]``) instead of running the whole graph again under fake tensors to get them.

    Pattern: every program lowered to ExecuTorch. Each time ExecuTorch builds or transforms an edge
    program it verifies it, and the verifier's dtype check (``_check_tensor_args_matching_op_allowed_dtype``)
    re-executes every operator of the graph in a ``torch.fx.Interpreter`` under fake tensors only to read
    the dtypes of its arguments and results: 10 such runs in an all-MiniLM-L6-v2 lowering, 18 % of it
    (``benchmarks/executorch_profile.py``). Those dtypes are the ones recorded on the graph's nodes when
    they were traced. Here each edge operator call is checked by ExecuTorch's own validator on its
    nodes' recorded values; the original check runs instead when a value is missing, when the graph
    holds a higher-order operator (a delegate call or a control-flow region, where the original stops),
    and when a call is found invalid (so the error raised is ExecuTorch's own). The ``.pte`` is byte-identical.
    Models: every model lowered to ExecuTorch (BertModel, all-MiniLM-L6-v2, LlamaForCausalLM, ...).
    Upstream: pytorch/executorch exir/verification/verifier.py (``_check_tensor_args_matching_op_allowed_dtype``
        runs ``EdgeOpArgValidator`` over fake inputs on every verification); no upstream report found.
    Remove when: the edge verifier checks dtypes from node metadata, or verifies a program once per
        lowering (checked: executorch 1.4 by :data:`SUPPORTED_EXECUTORCH`).
    """
    from executorch.exir.dialects.edge._ops import EdgeDialectFunctionSchema, EdgeOpOverload

    checker_class = _edge_op_arg_checker()

    def check(gm: torch.fx.GraphModule) -> None:
        calls = [node for node in gm.graph.nodes if node.op == "call_function"]
        if any(isinstance(node.target, torch._ops.HigherOrderOperator) for node in calls):
            return original(gm)
        checker = checker_class(gm)
        missing = []

        def value(arg: torch.fx.Node) -> Any:
            if "val" not in arg.meta:
                missing.append(arg)
            return arg.meta.get("val")

        for node in calls:
            if not (isinstance(node.target, EdgeOpOverload) and isinstance(node.target._schema, EdgeDialectFunctionSchema)):
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), value)
            if missing or "val" not in node.meta:
                return original(gm)
            checker.node = node
            checker.call_function(node.target, args, kwargs)
        if checker.violating_ops:
            return original(gm)  # ExecuTorch's own message, from its own run
        return None

    return check


# ── provenance ───────────────────────────────────────────────────────────────


@register_patch("executorch", "torch.fx.traceback.NodeSource.__init__", stage=_STAGE)
def _patch_node_provenance_shared(original: Any) -> Any:
    """A node's provenance record (``NodeSource``) shares the records of the node it came from instead of
    deep-copying them.

    Pattern: every re-trace of a graph with node metadata preserved (each ``ExportPass`` of the edge
    conversion and of XNNPACK's pipeline, each ``run_decompositions``). For every node it visits,
    ``torch.fx.traceback.set_current_meta`` creates ``NodeSource(node)``, whose constructor deep-copies the
    node's whole ``from_node`` chain, one level deeper after every pass, so the copying grows with the number
    of passes a node has been through: 2.1 of 18 s of a profiled all-MiniLM-L6-v2 lowering were
    ``copy.deepcopy`` of these chains. The records are never changed after they are made (torch appends
    only to a node's own ``meta["from_node"]`` list, which is still copied here, one level deep), so a
    shared chain holds the same provenance, equal record for record; the ``.pte`` is byte-identical.
    Models: every model lowered to ExecuTorch (all-MiniLM-L6-v2, LlamaForCausalLM, ...).
    Upstream: pytorch/pytorch torch/fx/traceback.py (``NodeSource.__init__`` deep-copies ``from_node``,
        since pytorch/pytorch#142066 made provenance recursive); no upstream report found.
    Remove when: ``NodeSource`` stops deep-copying its ancestors (checked: torch 2.13 by
        :data:`SUPPORTED_TORCH`).
    """

    def __init__(self: Any, node: Any, pass_name: str = "", action: Any = None) -> None:
        original(self, None, pass_name, action)  # the fields of a record without a node
        if node:
            self.node_info = self.NodeInfo(name=node.name, target=str(node.target), graph_id=id(node.graph))
            self.from_node = list(node.meta.get("from_node", ()))

    return __init__


#: the composite-implicit operator registrations last made attributes of ``torch.ops`` (see below)
_MATERIALIZED: list[tuple[str, ...] | None] = [None]


@register_patch("executorch", "torch._export.utils._materialize_cpp_cia_ops", stage=_STAGE)
def _patch_cia_ops_materialized_once(original: Any) -> Any:
    """Make the dispatcher's composite-implicit (CIA) operators attributes of ``torch.ops`` only when its
    registrations changed since they last were.

    Pattern: ``run_decompositions`` builds its table of preservable CIA operators
    (``_collect_all_valid_cia_ops``) one operator namespace at a time, and for every namespace asks the
    dispatcher for all CIA registrations and looks each one up on ``torch.ops`` again: 40 namespaces, 5
    tables per all-MiniLM-L6-v2 lowering, 200 walks of about 2,000 operators, 0.9 of a profiled 9 s. A lookup
    makes an attribute that stays, so a walk over the same registrations finds nothing new; a registration
    added since (a custom operator library loaded mid-export) changes the list and the walk runs. The
    ``.pte`` is byte-identical. Models: every model lowered to ExecuTorch (all-MiniLM-L6-v2,
    LlamaForCausalLM, ...), and every ``run_decompositions``.
    Upstream: pytorch/pytorch torch/_export/utils.py (``_materialize_cpp_cia_ops``, per namespace, "can't
        cache this because custom op registry API in python can still add entries"); no upstream report found.
    Remove when: the table materializes once per call (checked: torch 2.13 by :data:`SUPPORTED_TORCH`).
    """

    def materialize() -> None:
        registrations = tuple(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))
        if registrations != _MATERIALIZED[0]:
            original()
            _MATERIALIZED[0] = registrations

    return materialize


# ── XNNPACK's pass pipeline ──────────────────────────────────────────────────


def _targets(graph: torch.fx.Graph) -> set[Any]:
    return {node.target for node in graph.nodes if node.op == "call_function"}


def _holds_any(targets: set[Any], wanted: Iterable[Any]) -> bool:
    return any(op in targets for op in wanted)


def _pattern_targets(graphs: Iterable[torch.fx.GraphModule]) -> list[set[Any]]:
    return [_targets(graph.graph) for graph in graphs]


def _may_match(targets: set[Any], patterns: list[set[Any]]) -> bool:
    """Whether a subgraph matcher could match one of ``patterns`` (operator sets) in a graph holding ``targets``:
    only if the graph holds every operator of the pattern."""
    return any(pattern <= targets for pattern in patterns)


def _names(targets: set[Any]) -> set[str]:
    return {getattr(t, "__name__", "") for t in targets}


#: operators that every one of XNNPACK's SDPA pattern graphs (``partition/graphs/sdpa.get_graphs``) holds,
#: in ExecuTorch 1.4 (checked against the built patterns by the tests): a partition missing one of them
#: cannot match any pattern, and the patterns (each built by ``torch.export`` and ``to_edge``, about a
#: second per process) need not be built for it
SDPA_PATTERN_OPERATORS = frozenset(
    {"aten._softmax.default", "aten.any.dim", "aten.bmm.default", "aten.eq.Scalar", "aten.logical_not.default", "aten.where.self"}
)
#: the same for the bilinear-upsampling patterns (``partition/graphs/bilinear_2d.get_graphs_dict``)
BILINEAR_PATTERN_OPERATORS = frozenset({"aten.upsample_bilinear2d.vec"})


def _may_match_patterns(required: frozenset[str], build: Callable[[], Iterable[torch.fx.GraphModule]]) -> Callable[[torch.fx.GraphModule, set[Any]], bool]:
    """A rule for a pattern pass: False without building the patterns when the graph lacks an operator
    every pattern holds (``required``), else :func:`_may_match` over the built patterns (built once)."""
    built: list[list[set[Any]]] = []

    def rule(_: torch.fx.GraphModule, targets: set[Any]) -> bool:
        if not required <= _names(targets):
            return False
        if not built:
            built.append(_pattern_targets(build()))
        return _may_match(targets, built[0])

    return rule


def _skip_rules() -> dict[str, Callable[[torch.fx.GraphModule, set[Any]], bool]]:
    """Pass class name -> ``acts(graph_module, call_function targets)``: False when the pass cannot change
    the graph (it looks only at operators the graph does not hold). Passes without a rule always run.
    Each rule mirrors what the pass's ``call`` looks for in ExecuTorch 1.4."""
    from executorch.backends.xnnpack._passes.convert_to_linear import ConvertToLinearPass
    from executorch.backends.xnnpack._passes.decompose_batch_norm import DecomposeBatchNorm
    from executorch.backends.xnnpack._passes.fuse_activation_pass import FuseActivationPass
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.passes.dim_order_ops_registry import MemoryFormatOpsMap

    edge = exir_ops.edge.aten

    def quant_nodes(gm: torch.fx.GraphModule, _: set[Any]) -> bool:
        return any(is_quant(n) or is_dequant(n) for n in gm.graph.nodes if n.op == "call_function")

    def long_cat(gm: torch.fx.GraphModule, _: set[Any]) -> bool:
        return any(
            n.op == "call_function" and getattr(n.target, "__name__", "") == "aten.cat.default" and len(n.args[0]) > 5
            for n in gm.graph.nodes
        )

    return {
        "DimOrderOpsRevertPass": lambda gm, t: _holds_any(t, MemoryFormatOpsMap),
        "ConvertToUpsampleBilinear2d": _may_match_patterns(BILINEAR_PATTERN_OPERATORS, bilinear_2d.get_graphs_dict),
        "ConvertToLinearPass": lambda gm, t: _holds_any(t, ConvertToLinearPass.targets),
        "PropagateCustomMetaPass": quant_nodes,
        "ConvertToSDPAPass": _may_match_patterns(SDPA_PATTERN_OPERATORS, sdpa.get_graphs),
        "FuseBatchNormPass": lambda gm, t: _holds_any(
            t, (edge.native_batch_norm.default, edge._native_batch_norm_legit_no_training.default)
        ),
        "DecomposeBatchNorm": lambda gm, t: _holds_any(t, DecomposeBatchNorm.BATCH_NORM_OPS),
        "FuseActivationPass": lambda gm, t: _holds_any(t, FuseActivationPass.FUSEABLE_ACTIVATIONS),
        "DecomposeConcatenate": long_cat,
        "RemoveGetItemPass": lambda gm, t: bool({"aten.max_pool2d_with_indices.default", "aten.max.dim"} & _names(t)),
        "Conv1dUnsqueezePass": lambda gm, t: "aten.convolution.default" in _names(t),
        "PReLUReshapePass": lambda gm, t: _holds_any(t, (edge._prelu_kernel.default,)),
        "RemoveRedundantCopyPass": lambda gm, t: _holds_any(t, (edge._to_copy.default,)),
    }


@register_patch("executorch.xnnpack", "executorch.backends.xnnpack._passes._transform", stage=_STAGE)
def _patch_xnnpack_passes_skip_absent_operators(original: Any) -> Any:
    """XNNPACK's ``preprocess`` skips each pass of its pipeline that looks only for operators the
    partition does not hold.

    Pattern: every XNNPACK partition. ``XNNPACKPassManager.transform`` runs 17 passes one after another
    on each partition's program, each through ``_transform`` (a pass manager that re-compiles and
    validates the program before and after the pass); most passes scan the graph for their operators
    (batch norms, 1-D convolutions, PReLU, ``cat`` of more than five tensors, quantise/dequantise
    nodes, the SDPA and bilinear-upsampling patterns), change nothing when there are none, and then
    re-trace the whole partition through ``ExportPass`` anyway. A tiny Llama's 10 partitions took 170
    such runs, 44 % of its export. A pass is skipped only when the operators its ``call`` looks for
    are absent (for pattern passes: when some operator of every pattern is absent), so its program
    is returned unchanged. The SDPA and bilinear-upsampling pattern graphs themselves (six small
    programs, each built with ``torch.export`` and ``to_edge``: about 2.5 s of the first export in a
    process) are built only for a partition that holds every operator all of them share
    (:data:`SDPA_PATTERN_OPERATORS`, :data:`BILINEAR_PATTERN_OPERATORS`); the passes that act on every
    graph (constant propagation, the channels-last tagging, clone removal, the pad quantisation) always run.
    Models: every model lowered with ``--recipe xnnpack`` (BertModel, all-MiniLM-L6-v2, LlamaForCausalLM, ...).
    Upstream: pytorch/executorch backends/xnnpack/_passes/__init__.py (``XNNPACKPassManager.transform``
        runs every pass on every partition); pytorch/executorch#1893 (XNNPACK preprocess slow from
        running every transform pass; "allow partitioner to highlight what was partitioned so we dont
        run unrelated transform passes", not done)
    Remove when: XNNPACK's passes return ``modified=False`` without re-tracing when they find nothing,
        or preprocess runs its pipeline once for all partitions.
    """
    rules = _skip_rules()

    def _transform(ep: Any, *passes: Any, **kwargs: Any) -> Any:
        if len(passes) == 1:
            rule = rules.get(type(passes[0]).__name__)
            if rule is not None and not rule(ep.graph_module, _targets(ep.graph_module.graph)):
                return ep
        return original(ep, *passes, **kwargs)

    return _transform


# ── the third decomposition ──────────────────────────────────────────────────


def _left_to_decompose(program: torch.export.ExportedProgram, table: set[Any]) -> bool:
    """Whether a call of ``program``'s graph (or of a control-flow branch) is an operator of ``table``, or a
    higher-order operator or overload packet (kept conservative)."""
    from executorch.exir.graph_module import get_control_flow_submodules

    graphs = [program.graph_module] + [sub for _, sub, _ in get_control_flow_submodules(program.graph_module)]
    for graph_module in graphs:
        for node in graph_module.graph.nodes:
            if node.op != "call_function":
                continue
            if isinstance(node.target, torch._ops.HigherOrderOperator):
                return True  # a region with its own rules: decompose as ExecuTorch does
            if isinstance(node.target, torch._ops.OpOverloadPacket) or (
                isinstance(node.target, torch._ops.OpOverload) and node.target in table
            ):
                return True
    return False


@register_patch(
    "executorch",
    "executorch.exir.program._program._replace_aten_ops_with_transformed_ops",
    stage=_STAGE,
)
def _patch_no_third_decomposition_when_nothing_is_left(original: Any) -> Any:
    """``to_edge_transform_and_lower`` skips its third ``run_decompositions`` of a program when no operator
    of the decomposition table is left in the graph.

    Pattern: every program lowered with a partitioner that checks the operators it keeps (XNNPACK's
    does). ``_gen_edge_manager_for_partitioners`` functionalises the program, decomposes it with the
    default table less the operators the partitioner keeps, marks the kept operators the partitioner's
    check accepts (``_replace_aten_ops_with_transformed_ops``, which renames them into the
    ``EDGE_DO_NOT_DECOMP`` namespace), then decomposes the whole program again with the full table so
    that kept operators the check refused are decomposed after all. The two tables differ only in those
    kept operators (every other operator of the table already went through the same decomposition), so
    when none of them is left as an aten operator in the graph, that third run re-traces the program
    and changes nothing: a third of the lowering's decomposition time. The wrapper marks the program so that its next
    ``run_decompositions`` call (that third one) returns the program itself; the kept operators are
    then restored in place as before.
    Models: every model lowered with ``--recipe xnnpack`` (BertModel, all-MiniLM-L6-v2, LlamaForCausalLM, ...).
    Upstream: pytorch/executorch#18496 and pytorch/executorch#21799 (skip ``run_decompositions`` when
        no operator of the table is in the graph; not in executorch 1.4.1)
    Remove when: executorch ships that skip (a release after 1.4 with pytorch/executorch#21799).
    """

    def replace(name: str, program: Any, partitioner: Any) -> Any:
        from executorch.exir.program import _program

        preserved = original(name, program, partitioner)
        # the third pass differs from the second only in decomposing the operators the partitioners
        # keep: those of them the check refused are still aten operators in the graph
        kept: set[Any] = set()
        for each in (partitioner or {}).get(name) or []:
            ops, _ = each.ops_to_not_decompose(program)
            kept.update(_program._remove_invalid_ops_for_not_decompose(ops))
        if not _left_to_decompose(program, kept & set(_program._default_decomposition_table().keys())):

            def decomposed_already(*args: Any, **kwargs: Any) -> Any:
                del program.run_decompositions  # one call only: later calls decompose as usual
                return program

            program.run_decompositions = decomposed_already
        return preserved

    return replace


# ── graph modules compiled when first used ───────────────────────────────────


@register_patch("executorch", "torch.fx.graph_module.GraphModule.__new__", stage=_STAGE)
def _patch_graph_modules_compiled_on_first_use(original: Any) -> Any:
    """Graph modules made during the lowering generate and compile their Python code when it is first
    used (a call, ``.code``, ``str``, pickling), not each time their graph is made or changed.

    Pattern: every program lowered to ExecuTorch. Each ``ExportPass`` of the edge conversion, of
    XNNPACK's pipeline and of ``to_executorch`` builds a new ``torch.fx.GraphModule``, and its
    constructor, and every ``recompile()`` after a rewrite, turns the whole graph into Python source and
    compiles it. The lowering walks graphs node by node (``torch.fx.Interpreter``) and almost never
    calls that code: an all-MiniLM-L6-v2 lowering makes about 70 graph modules and ran their code once,
    while ``recompile`` took 2.2 s of its 8 s. A ``torch.fx.GraphModule`` made while the patch is
    active is a ``torch.fx._lazy_graph_module._LazyGraphModule`` (a ``GraphModule`` subclass torch uses
    for the same reason in ``torch.compile``), which defers that work until the code is needed;
    subclasses of ``GraphModule``, graph modules made before the stage and those made by other threads are
    unchanged. When the stage ends the exporter makes the lazy modules still alive (the lowered program's)
    plain graph modules again (:func:`lazy_graph_modules_made_plain`). The ``.pte`` is byte-identical (tested).
    Models: every model lowered to ExecuTorch (all-MiniLM-L6-v2, LlamaForCausalLM, ...).
    Upstream: pytorch/pytorch torch/fx/_lazy_graph_module.py (lazy graph modules are made only through
        ``_make_graph_module`` under ``_use_lazy_graph_module(True)``, which torch.compile sets and
        ``torch.export`` and ExecuTorch do not); no upstream report found.
    Remove when: ExecuTorch's lowering makes its graph modules lazily itself (checked: torch 2.13 by
        :data:`SUPPORTED_TORCH`).
    """
    lazy = _lazy_graph_module_class()
    exporting = threading.get_ident()  # the patch is installed by the exporting thread, under the export lock

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        if cls is not torch.fx.GraphModule or threading.get_ident() != exporting:
            return original(cls, *args, **kwargs)
        made = original(lazy, *args, **kwargs)
        _LAZY_MADE.add(made)
        return made

    return __new__


#: the graph modules :func:`_patch_graph_modules_compiled_on_first_use` made lazy that are still alive
_LAZY_MADE: weakref.WeakSet[torch.fx.GraphModule] = weakref.WeakSet()


def lazy_graph_modules_made_plain() -> int:
    """Make every graph module the lazy-graph-module patch made, and that is still alive, a plain
    ``torch.fx.GraphModule`` with its code compiled: the exporter calls this when its Stage 3 patches end, so
    that the program it returns (and anything a fix kept) holds no lazy module, whose ``forward`` signature is
    ``(*args, **kwargs)`` until first called, whose first call runs forward hooks twice, and which
    ``torch.jit.script`` refuses. Returns how many it changed."""
    changed = 0
    for module in list(_LAZY_MADE):
        lazy = type(module)
        module.__class__ = type("GraphModuleImpl", (torch.fx.GraphModule,), {})  # as GraphModule.__new__ makes it
        try:
            module.recompile()
        except Exception:  # noqa: BLE001 - a graph left half-rewritten by a failed pass: it stays lazy, the export's error stands
            module.__class__ = lazy
            continue
        changed += 1
    _LAZY_MADE.clear()
    return changed


@functools.cache
def _lazy_graph_module_class() -> type:
    """torch's ``_LazyGraphModule`` whose deferred ``recompile`` still records the graph's pytree input and
    output specs (``_in_spec``, ``_out_spec``) at once, as ``GraphModule.recompile`` does: ``torch.export``
    reads them from a graph module without running its code."""
    from torch.fx._lazy_graph_module import _LazyGraphModule
    from torch.fx.graph import _PyTreeCodeGen

    class GraphModuleCompiledOnFirstUse(_LazyGraphModule):
        def recompile(self) -> None:  # type: ignore[override]
            codegen = self._graph._codegen
            if isinstance(codegen, _PyTreeCodeGen):
                self._in_spec = codegen.pytree_info.in_spec
                self._out_spec = codegen.pytree_info.out_spec
            type(self).forward = type(self)._lazy_forward  # the code is made on the first call

    return GraphModuleCompiledOnFirstUse
