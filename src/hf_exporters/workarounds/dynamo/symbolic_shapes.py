"""torch's symbolic-shape machinery under a dynamic export: model patches (DynamoExporter Stage 2,
applied for every backend).

Pattern: a dynamic size that torch's own reasoning cannot keep symbolic or cannot afford: the
constraint solver giving up on floor-division guards, ``sympy.simplify`` on nested floor divisions
(also registered for the ONNX lowering's decompositions, in :mod:`..onnx.torch_patches`), and
``len(tensor)`` turning a dynamic leading size into an ``int``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ...registry import register_patch


@register_patch("dynamo", "torch.fx.experimental.symbolic_shapes.DimConstraints.solve")
def _patch_dim_constraints_skip_unsolvable(original: Any) -> Any:
    """Let a dynamic export finish when torch's constraint solver meets a guard sympy cannot solve.

    Pattern: a dynamic export whose guards include an equality with floor divisions, such as a
    dynamic image side that must split into whole patches or windows (``Eq(-x/8 + 4*((x/8)//4), 0)``:
    the side is a multiple of 32). After the trace, ``DimConstraints.solve`` hands each symbol's
    equalities to sympy's ``reduce_inequalities`` to turn them into specialisations; sympy raises
    ``NotImplementedError`` ("cannot be solved using solve_univariate_inequality") and the export
    fails, although the guard is a divisibility, not a specialisation. The solve only builds the
    suggested-fixes message and the list of forced specialisations, so when sympy gives up the patch
    logs it and keeps what the solve found so far; the program's own guards and runtime asserts are
    unchanged, and an axis that really ended static is still reported by
    :func:`~hf_exporters.shapes.static_axes` (the exporter's warning, the sweep's failure).
    Models: MobileViTV2Model, EfficientLoFTRModel (dynamic in the sweep).
    Upstream: pytorch/pytorch#131897 (the solver fails on guards with floor division and rounding)
    Remove when: torch's ``DimConstraints.solve`` catches ``NotImplementedError`` for equalities as it
        does for inequalities.
    """
    import logging

    log = logging.getLogger("hf_exporters.dynamo")

    def solve(self: Any) -> None:
        try:
            return original(self)
        except NotImplementedError as error:
            if "cannot be solved" not in str(error):
                raise
            log.info("torch's constraint solver gave up on a guard sympy cannot solve: %s", " ".join(str(error).split()))
            return None

    return functools.wraps(original)(solve)


def _cancel_common_factor(expr: Any) -> Any | None:
    """``expr``, a quotient ``base / gcd`` of integer size expressions, with the factor cancelled term
    by term, or None when a term keeps a denominator (the factor did not divide it).

    A product over a sum is distributed at the top level only (``(g*a + g*b) / g`` -> ``a + b``);
    sympy's own product rules cancel ``g`` in each term. Nested expressions (floor divisions inside the
    terms) are left as they are: they were reduced when they were built.
    """
    import sympy

    distributed = sympy.expand_mul(expr, deep=False) if expr.is_Mul else expr
    for term in sympy.Add.make_args(distributed):
        for factor in sympy.Mul.make_args(term):
            if factor.is_Rational and not factor.is_Integer:
                return None
            if factor.is_Pow and factor.exp.is_negative is not False:
                return None
    return distributed


@register_patch("dynamo", "torch.utils._sympy.functions.sympy")
def _patch_floordiv_cancels_without_simplify(original: Any) -> Any:
    """Reduce a floor division by a common factor without calling ``sympy.simplify``.

    Pattern: a dynamic export of a model that pads to whole windows or patches at every stage (Swin,
    Donut-Swin, Swin2SR, SAM 2's Hiera, MaskFormer's Swin backbone). Each stage's sizes nest the last
    stage's (``((((x//4) + 1)//2) + 1)//2`` plus ``Mod``/``Min`` terms of the padding). Building
    ``FloorDiv(base, divisor)`` with a common factor ``g`` in ``torch.utils._sympy.functions`` returns
    ``FloorDiv(sympy.simplify(base / g), sympy.simplify(divisor / g))``, and ``sympy.simplify`` over
    these nested expressions takes 10-25 s per call (SwinModel: 5 calls, 56 s of a 138 s trace, and
    as much again in the ONNX lowering's decompositions); SwinModel timed out at 150 s on ONNX with a
    dynamic image side. The quotient only needs ``g`` cancelled, which sympy's product rules do term
    by term (:func:`_cancel_common_factor`), so the patch hands that module a copy of ``sympy`` whose
    ``simplify`` does so and calls the full ``sympy.simplify`` only when a term keeps a denominator.
    The floor division's value is unchanged: ``floor(base / divisor)`` is the same whichever common
    factor is cancelled. The module's other ``sympy`` names are the real ones. Installed for the
    trace (dynamo scope) and the ONNX lowering's decompositions (onnx scope); the ExecuTorch
    lowering's re-trace and ``torch.export.load`` still take the full simplify.
    Models: SwinModel, DonutSwinModel, Swin2SRModel, Sam2HieraDetModel, Sam2VisionModel,
    MaskFormerSwinModel (dynamic in the sweep).
    Upstream: pytorch/pytorch#134133 (sympy in ``FloorDiv.eval`` blows up on large sums; the fix
        there covers ``sympy.gcd``, not the ``sympy.simplify`` that follows it)
    Remove when: ``FloorDiv.eval`` cancels the common factor without ``sympy.simplify``.
    """
    import types

    full_simplify = original.simplify
    copy = types.ModuleType(original.__name__, original.__doc__)
    copy.__dict__.update(original.__dict__)

    def simplify(expr: Any, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs and isinstance(expr, original.Expr):
            cancelled = _cancel_common_factor(expr)
            if cancelled is not None:
                return cancelled
        return full_simplify(expr, *args, **kwargs)

    copy.simplify = functools.wraps(full_simplify)(simplify)
    return copy


@register_patch("dynamo", "transformers.models.*.modeling_*.len")
def _patch_len_of_tensor_keeps_symbol(original: Any) -> Any:
    """``len(tensor)`` in modeling code returns the tensor's leading size as a symbol while exporting.

    Pattern: ``batch_size = len(source_flatten)`` (RT-DETR v1/v2, D-FINE, DEIMv2, PP-DocLayout,
    MaskFormer, OneFormer, SeamlessM4T, ...). CPython's ``len()`` must return a true ``int``, so on a
    fake tensor it materialises the symbolic leading size and guards it equal to the example's: the
    batch axis asked to be dynamic ends static ("axes asked to be dynamic ended static:
    pixel_values[axis 0] = 2"). Shadowing ``len`` in each loaded ``transformers.models.*.modeling_*``
    module with a function that returns ``tensor.shape[0]`` (what ``Tensor.__len__`` computes) keeps
    the symbol; anything else, and every size that is already a plain int (eager), goes to the builtin.
    Scoped to modeling modules rather than ``builtins.len``, so torch's own code is untouched.
    Limit: while exporting, a dynamic leading size is then a ``SymInt``, not an ``int``: code that
    uses ``len(tensor)`` as a dict key or set member, or checks ``isinstance(n, int)``, sees the
    difference (none is known in transformers; ``[0] * n`` and ``range(n)`` still specialise as before).
    Models: RTDetrV2Model, Deimv2Model, PPDocLayoutV3Model (dynamic batch in the sweep).
    Upstream: pytorch/pytorch#185804 (non-strict export leaves ``builtins.len`` unpatched while it
        overrides ``max``/``min``/``math.pow`` for fake tensors)
    Remove when: torch's non-strict export routes ``len(tensor)`` to ``Tensor.__len__`` (#185804 released).
    """

    def len_keeping_symbol(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.dim() > 0:
            size = obj.shape[0]
            if isinstance(size, torch.SymInt):
                return size
        return original(obj)

    return len_keeping_symbol
