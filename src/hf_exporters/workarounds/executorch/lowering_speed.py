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

import importlib.metadata
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
    "_patch_xnnpack_passes_skip_absent_operators",
    "_patch_no_third_decomposition_when_nothing_is_left",
)


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
    from executorch.exir.program import _program

    for helper in ("_remove_invalid_ops_for_not_decompose", "_default_decomposition_table"):
        if not hasattr(_program, helper):
            raise RuntimeError(f"ExecuTorch internal 'executorch.exir.program._program.{helper}' has moved")
    if any(w.func.__name__ == "_patch_xnnpack_passes_skip_absent_operators" for w in pinned):
        _xnnpack_pipeline_is_known()


def _xnnpack_pipeline_is_known() -> None:
    from executorch.backends.xnnpack._passes import XNNPACKPassManager

    names = tuple(p.__name__ for p in XNNPACKPassManager(None).passes)
    if names != KNOWN_XNNPACK_PASSES:
        raise RuntimeError(
            "XNNPACK's pass pipeline is not the one the lowering-speed patch was written for: "
            f"{list(names)} (known: {list(KNOWN_XNNPACK_PASSES)})"
        )


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
    bilinear = _pattern_targets(bilinear_2d.get_graphs_dict())
    attention = _pattern_targets(sdpa.get_graphs())

    def quant_nodes(gm: torch.fx.GraphModule, _: set[Any]) -> bool:
        return any(is_quant(n) or is_dequant(n) for n in gm.graph.nodes if n.op == "call_function")

    def long_cat(gm: torch.fx.GraphModule, _: set[Any]) -> bool:
        return any(
            n.op == "call_function" and getattr(n.target, "__name__", "") == "aten.cat.default" and len(n.args[0]) > 5
            for n in gm.graph.nodes
        )

    return {
        "DimOrderOpsRevertPass": lambda gm, t: _holds_any(t, MemoryFormatOpsMap),
        "ConvertToUpsampleBilinear2d": lambda gm, t: _may_match(t, bilinear),
        "ConvertToLinearPass": lambda gm, t: _holds_any(t, ConvertToLinearPass.targets),
        "PropagateCustomMetaPass": quant_nodes,
        "ConvertToSDPAPass": lambda gm, t: _may_match(t, attention),
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
    is returned unchanged; the passes that act on every graph (constant propagation, the channels-last
    tagging, clone removal, the pad quantisation) always run.
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
