"""ExecutorchExporter Stage 4: FX program fixes (``register_fx_program_fix("executorch...")``).

Repairs of the traced ``ExportedProgram`` that need the whole program (range constraints, the graph
signature, placeholder metadata).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import sympy
import torch
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.symbol import SymT, symbol_is_type
from torch.utils._sympy.value_ranges import ValueRanges

from ...registry import register_fx_program_fix

#: The upper bound given to a dynamic input size ``Dim.AUTO`` leaves unbounded, or bounds far above it from the model.
#: ExecuTorch plans memory for the largest size a tensor can take; an explicit ``Dim(..., max=N)`` in ``dynamic_shapes``
#: overrides it for the axes it names.
UNBOUNDED_DIM_MAX = 128

#: the bound used by the current export (``ExecutorchConfig.max_seq_len``, CLI ``--max-seq-len``), and the maxima
#: the caller's ``dynamic_shapes`` gave (:func:`caller_maxima`): a finite bound equal to one of them is kept
_dim_max: contextvars.ContextVar[tuple[int, frozenset[int]]] = contextvars.ContextVar(
    "hf_exporters_executorch_dim_max", default=(UNBOUNDED_DIM_MAX, frozenset())
)


@contextlib.contextmanager
def dynamic_dim_max(bound: int | None, kept: frozenset[int] = frozenset()) -> Iterator[None]:
    """Use ``bound`` (default :data:`UNBOUNDED_DIM_MAX`) as the upper bound of dynamic input sizes in the block.

    A finite upper bound larger than ``bound`` (one the trace derived from the model, e.g. ``seq_len <=
    max_position_embeddings``) is brought down to it too, unless it is one of ``kept``: the ``max`` values the
    caller's ``dynamic_shapes`` gave (:func:`caller_maxima`)."""
    token = _dim_max.set((int(bound) if bound else UNBOUNDED_DIM_MAX, frozenset(kept)))
    try:
        yield
    finally:
        _dim_max.reset(token)


def caller_maxima(dynamic_shapes: Any) -> frozenset[int]:
    """The finite ``max`` values a ``dynamic_shapes`` spec gives its axes (``Dim("s", max=N)``, ``Dim.AUTO(max=N)``),
    in dicts, lists and tuples at any depth; :func:`_fix_unbounded_range_constraints` keeps a bound equal to one.
    (A ``ShapesCollection`` is read through its mapping of tensors to shapes.)"""
    if isinstance(dynamic_shapes, torch.export.ShapesCollection):
        dynamic_shapes = list(getattr(dynamic_shapes, "_shapes", {}).values())
    if isinstance(dynamic_shapes, dict):
        return frozenset().union(*(caller_maxima(value) for value in dynamic_shapes.values()))
    if isinstance(dynamic_shapes, (list, tuple)):
        return frozenset().union(*(caller_maxima(value) for value in dynamic_shapes))
    upper = getattr(dynamic_shapes, "max", None)
    ok = isinstance(upper, int) and upper is not int_oo and not isinstance(upper, bool)
    return frozenset({int(upper)}) if ok else frozenset()


def _data_dependent(symbol: sympy.Symbol) -> bool:
    """Whether ``symbol`` is a size read from data (``nonzero``'s row count, ``item()``): its bounds are facts."""
    return symbol_is_type(symbol, (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT))


def _shape_env(exported_program: torch.export.ExportedProgram):
    for node in exported_program.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for size in val.shape:
                if isinstance(size, torch.SymInt):
                    return size.node.shape_env
    return None


def _hint(shape_env, symbol) -> int | None:
    if shape_env is None:
        return None
    values = getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
    value = values.get(symbol)
    return int(value) if value is not None else None


@register_fx_program_fix("executorch")
def _fix_unbounded_range_constraints(exported_program: torch.export.ExportedProgram) -> bool:
    """Give every dynamic size an upper bound of at most the export's bound: the unbounded (``[2, int_oo]``) and
    those the model bounds far above it.

    Pattern: ``Dim.AUTO`` (or ``Dim`` without ``max``) leaves a size symbol's range open above.
    ExecuTorch's memory planning sizes each planned tensor at its upper bound and falls back to the
    example input's size for ``int_oo``, so any larger input fails at run time with
    "Attempted to resize a bounded tensor with a maximum capacity of N elements". Where the trace bounds
    the symbol from the model instead (a slice of a ``max_position_embeddings``-row table gives
    ``seq_len <= 2048``), memory planning sizes every attention buffer at that bound: a tiny decoder's
    prefill at batch bound 128 planned ``128 heads-batch x 2048 x 2048`` score tensors, 35 GB, and failed to
    load with ``std::bad_alloc``. The symbol's range (``range_constraints`` and the program's ShapeEnv)
    becomes ``[lower, max(N, example, lower)]``, ``N`` the config's ``max_seq_len`` (CLI ``--max-seq-len``),
    :data:`UNBOUNDED_DIM_MAX` by default. A finite bound is kept when it is at most ``N``, when it
    equals a ``max`` the caller's ``dynamic_shapes`` give (:func:`caller_maxima`: their bounds stand), and for a
    size read from data (``nonzero``'s row count: its bound is a fact, not a plan).
    Models: every model exported with ``dynamic=True`` (BertModel, LlamaForCausalLM, EfficientNetModel, ...);
    the model-bounded case: DogeForCausalLM, LEDForConditionalGeneration generation folders.
    Upstream: pytorch/executorch memory planning needs bounded dynamic shapes (exir/sym_util.py eval_upper_bound
    falls back to the trace hint for int_oo); https://docs.pytorch.org/executorch/stable/concepts.html#dynamic-shapes
    Remove when: ExecuTorch plans unbounded dynamic tensors (dynamic unbound memory), or the export
    passes explicit ``Dim(max=...)`` for every axis.
    """
    shape_env = _shape_env(exported_program)
    changed = False
    bound, kept = _dim_max.get()
    for symbol, bounds in list(exported_program.range_constraints.items()):
        lower = int(bounds.lower) if bounds.lower.is_finite else 0
        upper = max(bound, _hint(shape_env, symbol) or 0, lower)
        if bounds.upper is not int_oo:
            finite = int(bounds.upper)
            if finite <= upper or finite in kept or _data_dependent(symbol):
                continue
        changed = True
        new = ValueRanges(bounds.lower, sympy.Integer(upper))
        exported_program.range_constraints[symbol] = new
        if shape_env is not None and symbol in shape_env.var_to_range:
            shape_env.var_to_range[symbol] = new
    return changed


def _sym_ints(value: Any) -> Iterator[torch.SymInt]:
    if isinstance(value, torch.SymInt):
        yield value
    elif isinstance(value, torch.Tensor):
        for size in (*value.shape, *value.stride(), value.storage_offset()):
            if isinstance(size, torch.SymInt):
                yield size
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _sym_ints(item)


def _generic_hint(taken: set[int], lower: int, upper: int) -> int | None:
    """The smallest odd prime above 2 in ``[lower, upper]`` that is no other symbol's hint."""
    for candidate in (3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47):
        if lower <= candidate <= upper and candidate not in taken:
            return candidate
    return None


@register_fx_program_fix("executorch")
def _fix_size_hints_of_one(exported_program: torch.export.ExportedProgram) -> bool:
    """Replace the trace hint of a dynamic size traced at 0 or 1 by a generic size.

    Pattern: a dynamic axis whose example size was 1 (batch 1, one new token) stays symbolic in the
    trace (size-oblivious), but ExecuTorch's lowering decomposes composite ops again
    (``scaled_dot_product_attention`` -> ``matmul`` -> ``view``) and C++ kernels decide their
    branches on the hint: ``Eq(32*s0, 32)`` becomes a guard, the batch range narrows to ``[1, 2]``
    and the views are built for batch 1, so other sizes fail at run time ("Attempted to resize a
    bounded tensor", "expanded size ... must match"). Each such symbol gets a small prime hint no
    other symbol uses, within its range, and every cached SymNode hint is dropped so it is recomputed.
    Models: BertModel, LlamaForCausalLM, MistralForCausalLM (any model exported dynamically from a
    batch-1 or one-token example).
    Upstream: pytorch/pytorch#150842 (size-1 specialisation); CIA decompositions guard on hints in
    torch/_export/utils.py _special_op_to_decompose_cia
    Remove when: run_decompositions honours backed_size_oblivious for C++ composite kernels.
    """
    shape_env = _shape_env(exported_program)
    if shape_env is None:
        return False
    hints = getattr(shape_env, "backed_var_to_val", None)
    if hints is None:
        return False
    changed = False
    taken = {int(v) for v in hints.values() if isinstance(v, sympy.Integer)}
    for symbol, bounds in exported_program.range_constraints.items():
        hint = hints.get(symbol)
        if hint is None or int(hint) > 1:
            continue
        lower = int(bounds.lower) if bounds.lower.is_finite else 0
        upper = int(bounds.upper) if bounds.upper.is_finite else 1 << 30
        new = _generic_hint(taken, lower, upper)
        if new is None:
            continue
        hints[symbol] = sympy.Integer(new)
        taken.add(new)
        changed = True
    if not changed:
        return False
    for gm in exported_program.graph_module.modules():
        if isinstance(gm, torch.fx.GraphModule):
            for node in gm.graph.nodes:
                for sym in _sym_ints(node.meta.get("val")):
                    sym.node._hint = None
    if hasattr(shape_env, "_update_version_counter"):
        shape_env._version_counter += 1
    return True
