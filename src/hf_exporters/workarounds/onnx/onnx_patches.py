"""torch.onnx and onnxscript internals: patches of OnnxExporter's Stage 2 (ONNX patches), active for
the lowering (``torch.onnx.export`` and its onnxscript optimizer).

Pattern: the exporter's passes between decomposition and lowering (the FX node fixes re-run, type
promotion, output handling) and the optimizer's rewrite rules, matcher and constant folding. The
exporter checks before applying them that torch is a version they were written for and that every
hooked attribute still exists, and fails with ``Stage 2: ONNX patches`` otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ... import registry


@registry.register_patch("onnx", "torch.onnx._internal.exporter._fx_passes.decompose_with_registry", stage="Stage 2: ONNX patches")
def _patch_decompose_with_registry(original: Callable[..., Any]) -> Callable[..., Any]:
    """Re-run the ONNX FX node fixes on the graph ``run_decompositions`` returns.

    Pattern: ``torch.onnx`` decomposes the ExportedProgram (``ExportedProgram.run_decompositions``
    with its ONNX-friendly table) after the exporter's Stage 3 fixes ran; the decomposition brings
    back nodes those fixes remove (``aten.alias``, in-place views, dead comparisons) or introduces new
    ones, which then reach the lowering unrepaired.
    Models: every model whose graph the FX node fixes touch (e.g. SwinModel, GPT2Model, BertModel).
    Remove when: torch.onnx offers a post-decomposition pass hook, or the FX node fixes are all gone.
    Upstream: https://github.com/pytorch/pytorch/blob/v2.13.0/torch/onnx/_internal/exporter/_core.py
        (_prepare_exported_program_for_export offers no hook between decomposition and lowering)
    """

    def decompose_with_registry(exported_program: Any, onnx_registry: Any) -> Any:
        from ...exporters.onnx import record_decomposition_fixes

        decomposed = original(exported_program, onnx_registry)
        record_decomposition_fixes(registry.apply_fx_node_fixes("onnx", decomposed.graph_module, stage="Stage 3: FX node fixes"))
        return decomposed

    return decompose_with_registry


@registry.register_patch("onnx", "torch.onnx._internal.exporter._fx_passes.insert_type_promotion_nodes", stage="Stage 2: ONNX patches")
def _patch_type_promotion_keeps_lstm_whole(original: Callable[..., Any]) -> Callable[..., Any]:
    """Run torch.onnx's type-promotion pass with ``aten.lstm.input`` kept whole, as the decomposition keeps it.

    Pattern: after the decomposition, torch.onnx re-runs the graph on fake tensors to insert type
    promotions; calling ``aten.lstm.input`` there runs its composite kernel, a Python loop over the
    time steps, which fixes a dynamic sequence length (``Eq(s28, 4)`` for an RNN-T prediction network's
    tokens) in the shapes of every node after it. The pass runs inside torch's own "keep this
    composite op" context for the one op, whose fake rule the Stage 1 patch
    ``_patch_lstm_kept_whole_with_symbolic_length`` makes size-only.
    Models: ParakeetForRNNT, ParakeetForTDT, NemotronAsrStreamingForRNNT, Nemotron3_5AsrForRNNT (onnx dynamic).
    Upstream: https://github.com/pytorch/pytorch/blob/v2.13.0/torch/onnx/_internal/exporter/_core.py
        (``_prepare_exported_program_for_export`` runs ``insert_type_promotion_nodes`` on fake tensors); no report found
    Remove when: ``aten.lstm.input`` gets a size-only fake rule in torch.
    """
    import torch

    def insert_type_promotion_nodes(graph_module: Any) -> Any:
        from torch._export.utils import _special_op_to_preserve_cia
        from torch.export import exported_program

        keep = {torch.ops.aten.lstm.input: _special_op_to_preserve_cia}
        with exported_program._override_composite_implicit_decomp(keep):
            return original(graph_module)

    return insert_type_promotion_nodes


@registry.register_patch("onnx", "torch.onnx._internal.exporter._core._handle_output_node", stage="Stage 2: ONNX patches")
def _patch_output_node_constants(original: Callable[..., Any]) -> Callable[..., Any]:
    """Leave Python numbers in the program's outputs out of the ONNX graph outputs, as ``None`` is.

    Pattern: a forward that returns sizes next to tensors (MaskFormerSwin's
    ``hidden_states_spatial_dimensions``, a tuple of ints per stage). torch.export keeps them as
    constant outputs of the program; torch.onnx's ``_handle_output_node`` skips ``None`` but reads
    ``.name`` of every other output and fails with "'int' object has no attribute 'name'". An ONNX
    graph output must be a tensor; the numbers are fixed by the trace, so the exported graph keeps the
    tensor outputs only, and :func:`hf_exporters.shapes.output_names` names those alone (the same
    leaves :func:`hf_exporters.shapes.tensor_leaves` gives of the eager output).
    Models: MaskFormerSwinModel (onnx in the sweep) and other backbones that return feature-map sizes.
    Upstream: torch/onnx/_internal/exporter/_core.py ``_handle_output_node`` in torch 2.13 (no report found)
    Remove when: torch.onnx skips or materialises constant outputs.
    """

    def handle_output_node(node: Any, node_name_to_values: Any, graph_like: Any) -> Any:
        import torch

        outputs, args = node.args[0], node.args
        if not (isinstance(outputs, (tuple, list)) and any(o is not None and not isinstance(o, torch.fx.Node) for o in outputs)):
            return original(node, node_name_to_values, graph_like=graph_like)
        node.args = (type(outputs)(o for o in outputs if o is None or isinstance(o, torch.fx.Node)), *args[1:])
        try:
            return original(node, node_name_to_values, graph_like=graph_like)
        finally:
            node.args = args  # the program's output node keeps matching its output specs

    return handle_output_node


def _exact_no_op_rules() -> list[Any]:
    """``x + 0``, ``0 + x``, ``x - 0``, ``x * 1``, ``1 * x`` and ``x / 1`` rewritten to ``x`` only when
    the constant is exactly 0 or 1 (one element, and no wider than ``x``, so that it broadcasts nothing)."""
    from onnxscript.rewriter import RewriteRule

    def exactly(value: float) -> Callable[..., bool]:
        def check(context: Any, x: Any, c: Any, **_: Any) -> bool:
            tensor = c.const_value
            if tensor is None or tensor.size != 1:  # checked before reading the data of a large initializer
                return False
            try:
                array = tensor.numpy()
            except Exception:  # noqa: BLE001 - unreadable data (external file): leave the node alone
                return False
            if array.reshape(-1)[0] != value:
                return False
            return array.ndim == 0 if x.shape is None else array.ndim <= len(x.shape)

        return check

    def identity(op: Any, x: Any, **_: Any) -> Any:
        return op.Identity(x)

    patterns: list[tuple[Callable[..., Any], float]] = [
        (lambda op, x, c: op.Add(x, c), 0),
        (lambda op, x, c: op.Add(c, x), 0),
        (lambda op, x, c: op.Sub(x, c), 0),
        (lambda op, x, c: op.Mul(x, c), 1),
        (lambda op, x, c: op.Mul(c, x), 1),
        (lambda op, x, c: op.Div(x, c), 1),
    ]
    return [RewriteRule(pattern, identity, exactly(value)) for pattern, value in patterns]


@registry.register_patch("onnx", "onnxscript.rewriter._DEFAULT_REWRITE_RULES", stage="Stage 2: ONNX patches")
def _patch_no_op_rules_exact_constants(original: tuple[Any, ...]) -> tuple[Any, ...]:
    """The optimizer's no-op rules (``x + 0 -> x``, ``x * 1 -> x``, ...) for exact constants only.

    Pattern: ``x + eps`` with a small epsilon, as in ``rsqrt(mean(x ** 2) + 1e-8)`` or
    ``weights / (weights.sum() + 1e-15)``. onnxscript's pattern constants match with
    ``abs_tol=1e-8`` and ``rel_tol=1e-5``, so the ``Add`` of any epsilon of at most 1e-8 is matched
    as ``x + 0`` and removed (likewise ``x * (1 + 1e-6)`` as ``x * 1``). The program then divides
    by an unguarded sum or takes an RMS norm without its epsilon: MuseSpark's experts (post-expert
    norm, eps 1e-8; router normalisation, eps 1e-15) differed from eager by 0.029 in onnxruntime,
    and an all-zero sum gives inf or NaN where eager gives a finite value. The replacement keeps
    every rule of the default set and swaps the six arithmetic no-op rules for versions whose
    constant must equal 0 or 1 exactly.
    Models: MuseSparkModel (onnx static in the sweep); every model with an epsilon of 1e-8 or less.
    Upstream: microsoft/onnxscript onnxscript/rewriter/_pattern_ir.py (``Constant`` pattern matches
        with abs_tol=1e-8) and rewriter/rules/common/_no_op.py (``add_0_rule`` and friends), in
        onnxscript 0.7.2; no report found
    Remove when: onnxscript's no-op rules compare constants exactly.
    """
    from onnxscript.rewriter.rules.common import _no_op

    dropout = {id(_no_op.dropout_zero_rule), id(_no_op.dropout_inference_rule)}
    inexact = {id(rule) for rule in _no_op.rules} - dropout
    return (*_exact_no_op_rules(), *(rule for rule in original if id(rule) not in inexact))


@registry.register_patch("onnx", "onnxscript.rewriter._matcher.SimplePatternMatcher.match", stage="Stage 2: ONNX patches")
def _patch_multi_output_match_checks_the_first_node_first(original: Any) -> Any:
    """Reject a node for a multi-output rewrite pattern before indexing the whole graph, when its
    op type cannot match the pattern's first output node.

    Pattern: the optimizer's rewrite pass tries every rule at every node. For a pattern with several
    output nodes (``SlicesSplit``: two ``Slice`` nodes into one ``Split``), onnxscript 0.7.2's
    ``SimplePatternMatcher.match`` first groups all the graph's nodes by op type, then tries
    combinations whose first member is the given node, so each try costs a walk over the whole
    graph, ``Slice`` or not: quadratic in the graph size. On a 10,000-node vision tower
    (Exaone4_5_VisionModel) the rewrite pass took 210 s of a 327 s export (40 million node visits)
    and the ONNX export timed out in the sweep. The first combination member is the given node
    itself and is matched first, op type first, so a node whose op type the first pattern node
    refuses can never match: the patch returns that failure at once and calls the original for
    every other node. Rewrites are unchanged.
    Models: Exaone4_5_VisionModel and every large graph (onnx in the sweep).
    Upstream: microsoft/onnxscript onnxscript/rewriter/_matcher.py (``SimplePatternMatcher.match``
        builds ``op_to_nodes`` before matching the given node), in onnxscript 0.7.2; no report found
    Remove when: onnxscript matches the given node before indexing the graph for multi-output patterns.
    """
    from onnxscript.rewriter._basics import MatchResult

    @functools.wraps(original)
    def match(self: Any, model: Any, graph_or_function: Any, node: Any, **kwargs: Any) -> Any:
        pattern = self.pattern
        if not pattern.has_single_output_node:
            first = pattern.output_nodes[0]
            if not first.op.matches(node.op_type):
                return MatchResult().fail(f"OpType mismatch: expected {first.op}, got {node.op_type}.", node)
        return original(self, model, graph_or_function, node, **kwargs)

    return match


@registry.register_patch("onnx", "onnxscript.optimizer._constant_folding.registry.op_evaluators", stage="Stage 2: ONNX patches")
def _patch_split_to_sequence_folding_skips_a_runtime_split(original: dict[Any, Any]) -> dict[Any, Any]:
    """Constant folding leaves a ``SplitToSequence`` alone when its ``split`` input is a scalar known
    only at run time.

    Pattern: ``torch.split(x, size)`` with a symbolic ``size`` (ProphetNet's n-gram streams, split by the
    sequence length, exported with a dynamic length) becomes ``SplitToSequence(x, size)`` with a 0-d
    ``size`` computed in the graph. onnxscript 0.7.2's folding of ``SplitToSequence`` knows the split's
    shape (a scalar) but not its value, takes neither the 1-D branch nor a None check, and reads
    ``split_value.ndim`` on None: the whole optimize step fails ("Error during constant folding for
    node ... (::SplitToSequence)", ``AttributeError: 'NoneType' object has no attribute 'ndim'``).
    The patch gives the optimizer a copy of its evaluator table in which ``SplitToSequence``'s
    evaluators return "no change" for exactly that case (value unknown, shape not 1-D) and run as
    before otherwise; the node then stays, and onnxruntime runs it.
    Models: ProphetNetModel, ProphetNetForConditionalGeneration (onnx dynamic in the sweep).
    Upstream: microsoft/onnxscript onnxscript/optimizer/_constant_folding.py (``split_to_sequence``),
        in onnxscript 0.7.2; no report found
    Remove when: ``split_to_sequence`` returns None when ``split_value`` is None.
    """
    from onnxscript.optimizer import _constant_folding as folding

    def guarded(evaluator: Any) -> Any:
        @functools.wraps(evaluator)
        def split_to_sequence(node: Any, op: Any, state: Any) -> Any:
            split = node.inputs[1] if len(node.inputs) > 1 else None
            if split is not None and folding._get_numpy_value(split) is None:
                shape = split.shape
                if shape is not None and shape.is_static() and len(shape) != 1:
                    return None
            return evaluator(node, op, state)

        return split_to_sequence

    table = dict(original)
    key = ("", "SplitToSequence")
    if key in table:
        table[key] = [folding.PartialEvaluator(e.min_version, e.max_version, guarded(e.function)) for e in table[key]]
    return table


@registry.register_patch("onnx", "onnxscript.rewriter.rules.fusion._rotary_embedding.fuse_rotary_embedding", stage="Stage 2: ONNX patches")
def _patch_no_rotary_fusion_across_batches(original: Callable[..., Any]) -> Callable[..., Any]:
    """Leave rotary embeddings unfused in the optimizer's opset-23 ONNX fusions.

    Pattern: at opset 23 torch.onnx's optimizer (onnxscript ``_framework_apis.torch_2_8.optimize``)
    fuses ``x * cos + rotate_half(x) * sin`` into the ONNX ``RotaryEmbedding`` op with the model's
    cos/sin tables as its caches. transformers computes those tables from ``position_ids`` of batch 1
    that broadcast over the batch; ``RotaryEmbedding`` does not broadcast, so onnxruntime 1.32 refuses
    every batch but 1 ("Inputs 'cos_cache' and 'sin_cache' are expected to have the same shape as
    input 'x', got 1 and 3"), a failure at run time of a dynamic export.
    Models: every rotary decoder exported at opset 23 with a dynamic batch (Llama, Mistral, Mixtral:
    case H2, Qwen2, ...).
    Upstream: onnxscript rewriter/rules/fusion/_rotary_embedding.py (the fusion checks no batch
        agreement between x and the tables); no report found
    Remove when: the fusion checks that the tables' batch matches x's, or expands them.
    """

    def fuse_rotary_embedding(model: Any, *args: Any, **kwargs: Any) -> int:
        return 0  # nothing fused: the decomposition broadcasts as eager does

    return fuse_rotary_embedding
