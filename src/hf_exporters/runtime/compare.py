"""Parity between an exported artifact and eager PyTorch.

Every output tensor of the artifact is compared, element by element, with the same leaf of the eager
output (the pytree flatten of the model's output, caches included): the maximum absolute difference
per leaf must be within ``atol``. A NaN or infinity in the artifact where eager has a finite value is a
failure whatever the tolerance.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sympy
import torch

from ..errors import BrokenModelError, ParityError
from ..shapes import clone_tree, is_symbolic, tensor_leaves


@dataclasses.dataclass
class LeafDiff:
    """One output leaf: its name, shape, and the max absolute difference from eager."""

    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    nonfinite: bool = False

    def ok(self, atol: float) -> bool:
        return not self.nonfinite and self.max_abs_diff <= atol


@dataclasses.dataclass
class ParityReport:
    """Parity of one input set: every leaf, the tolerance, and the input sizes used."""

    input_shapes: dict[str, list[int]]
    leaves: list[LeafDiff]
    atol: float

    @property
    def max_abs_diff(self) -> float:
        return max((d.max_abs_diff for d in self.leaves), default=0.0)

    @property
    def ok(self) -> bool:
        return bool(self.leaves) and all(d.ok(self.atol) for d in self.leaves)

    def as_dict(self) -> dict[str, Any]:
        return {
            "input_shapes": self.input_shapes,
            "atol": self.atol,
            "max_abs_diff": self.max_abs_diff,
            "ok": self.ok,
            "outputs": {d.name: d.max_abs_diff for d in self.leaves},
        }

    def describe_failure(self) -> str:
        bad = [d for d in self.leaves if not d.ok(self.atol)]
        parts = [
            f"{d.name}: {'NaN/inf where eager is finite' if d.nonfinite else f'max abs diff {d.max_abs_diff:.3g}'}"
            for d in bad[:5]
        ]
        return f"outputs differ from eager beyond atol={self.atol:g} for inputs {self.input_shapes}: " + "; ".join(parts)


@contextlib.contextmanager
def evaluation_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode (dropout off, batch norm on its running statistics) for a trace or an eager
    reference; afterwards every submodule's ``training`` flag is what it was, so exporting or checking a
    model does not change it."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def eager_outputs(model: torch.nn.Module, inputs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every tensor leaf of ``model(**inputs)`` in eval mode (run on a copy of the inputs)."""
    with torch.no_grad(), evaluation_mode(model):  # the mode every export traces in
        out = model(**clone_tree(inputs))
    return tensor_leaves(out)


def eager_outputs_as_traced(model: torch.nn.Module, inputs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """:func:`eager_outputs` with ``torch.compiler.is_compiling()`` and ``torch.compiler.is_exporting()``
    answering True, as they do while ``torch.export`` traces: the path the model code takes when traced
    (transformers' ``is_tracing`` branches), run eagerly. The two functions are swapped process-wide for
    the length of the call (torch's own checks of them are as under ``torch.export``)."""
    from unittest import mock

    with mock.patch.object(torch.compiler, "is_compiling", lambda: True), mock.patch.object(torch.compiler, "is_exporting", lambda: True):
        return eager_outputs(model, inputs)


def traced_path_note(
    model: torch.nn.Module, inputs: dict[str, Any], expected: Sequence[tuple[str, torch.Tensor]], actual: Sequence[Any], atol: float
) -> str | None:
    """Why an artifact that differs from eager may still be a faithful export, or None.

    When the model code branches on tracing, eager and the traced program run different code. This reruns
    eager on the traced path (:func:`eager_outputs_as_traced`); if that differs from plain eager
    (``expected``) beyond ``atol`` while the artifact's outputs (``actual``) match it within ``atol``, the
    note says so: the difference is in the model's code, not in the export. An error in the rerun gives None.
    """
    try:
        traced = eager_outputs_as_traced(model, inputs)
        apart = ParityReport({}, compare_leaves(expected, [t for _, t in traced], atol), atol)
        matched = ParityReport({}, compare_leaves(traced, actual, atol), atol)
    except Exception:  # noqa: BLE001 - no note; the parity failure stands as measured
        return None
    if apart.ok or not matched.ok:
        return None
    return (
        f"the model computes differently when traced: eager run as under torch.export (torch.compiler.is_compiling() "
        f"true) differs from plain eager by {apart.max_abs_diff:.3g}, and the artifact matches that traced path within "
        f"{matched.max_abs_diff:.3g}; the model code branches on tracing (in transformers, an is_tracing() branch such as "
        "the causal-mask skip, which leaves a non-causal attention module unmasked in eager only)"
    )


def compare_leaves(expected: Sequence[tuple[str, torch.Tensor]], actual: Sequence[Any], atol: float) -> list[LeafDiff]:
    """Compare artifact outputs (tensors or numpy arrays, in flatten order) with eager leaves.

    Raises:
        ParityError: the artifact returned a different number of outputs or a different shape.
    """
    if len(expected) != len(actual):
        raise ParityError(
            f"the artifact returned {len(actual)} outputs where eager returns {len(expected)} "
            f"({', '.join(n for n, _ in expected)})"
        )
    diffs = []
    for (name, want), got in zip(expected, actual):
        got_t = torch.as_tensor(got)
        want_t = want.detach()
        if tuple(got_t.shape) != tuple(want_t.shape):
            raise ParityError(f"output {name}: artifact shape {tuple(got_t.shape)} != eager shape {tuple(want_t.shape)}")
        if want_t.is_floating_point() or got_t.is_floating_point():
            w, g = want_t.double(), got_t.double()
            nonfinite = bool((~torch.isfinite(g) & torch.isfinite(w)).any())
            both_same_nonfinite = (~torch.isfinite(w)) & (w == g)
            delta = (w - g).abs().masked_fill(both_same_nonfinite, 0.0)
            delta = delta.masked_fill(torch.isnan(delta), math.inf)
            diff = float(delta.max()) if delta.numel() else 0.0
        else:
            nonfinite = False
            diff = float((want_t.long() - got_t.long()).abs().max()) if want_t.numel() else 0.0
        diffs.append(LeafDiff(name, tuple(want_t.shape), diff, nonfinite))
    return diffs


def nonfinite_eager(expected: Sequence[tuple[str, torch.Tensor]], failing: Sequence[str]) -> str:
    """Where eager's own outputs are not finite, as ``"last_hidden_state: 512 of 512 values"``, or ``""``.

    Counted: a floating output that fails the comparison (``failing`` names) and holds a NaN or inf,
    and any floating output with no finite value at all (nothing in it can be checked). A non-finite
    value the artifact reproduces exactly (a ``-inf`` mask) in an output that passes is not counted.
    """
    found = []
    for name, tensor in expected:
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or not tensor.numel():
            continue
        bad = int((~torch.isfinite(tensor.detach())).sum())
        if bad and (name in failing or bad == tensor.numel()):
            found.append(f"{name}: {bad} of {tensor.numel()} values")
    return "; ".join(found)


def raise_if_eager_nonfinite(expected: Sequence[tuple[str, torch.Tensor]], failing: Sequence[str]) -> None:
    """Raise when :func:`nonfinite_eager` finds eager's own outputs broken.

    Raises:
        BrokenModelError: "eager PyTorch itself returns NaN or inf (<output>: N of M values): the model
            or its checkpoint is broken ...".
    """
    broken = nonfinite_eager(expected, failing)
    if broken:
        raise BrokenModelError(
            f"eager PyTorch itself returns NaN or inf ({broken}): the model or its checkpoint is broken "
            "(NaN or inf weights, or a dtype that overflows), not the export; check the weights and run the "
            "model eagerly before exporting"
        )


def _shapes(inputs: dict[str, Any]) -> dict[str, list[int]]:
    return {name: list(t.shape) for name, t in tensor_leaves(inputs)}


def check_parity(
    model: torch.nn.Module,
    run: Callable[[dict[str, Any]], Sequence[Any]],
    input_sets: Sequence[dict[str, Any]],
    atol: float,
    raise_on_mismatch: bool = True,
) -> list[ParityReport]:
    """Run eager and the artifact (``run(inputs) -> outputs in flatten order``) on each input set.

    Raises:
        ParityError: an output differs beyond ``atol`` (when ``raise_on_mismatch``; the message then says
            whether the artifact matches the model's traced path, see :func:`traced_path_note`), or the
            artifact's outputs do not line up with eager's.
    """
    from ..pytree import materialize_caches

    reports = []
    for inputs in input_sets:
        materialize_caches(model, inputs)
        expected = eager_outputs(model, inputs)
        actual = run(clone_tree(inputs))
        report = ParityReport(_shapes(inputs), compare_leaves(expected, actual, atol), atol)
        reports.append(report)
        if raise_on_mismatch:
            raise_if_eager_nonfinite(expected, [d.name for d in report.leaves if not d.ok(atol)])
        if raise_on_mismatch and not report.ok:
            note = traced_path_note(model, inputs, expected, actual, atol)
            raise ParityError(report.describe_failure() + (f" ({note})" if note else ""))
    return reports


# ── A second input set of other sizes ────────────────────────────────────────


def _resize(tensor: torch.Tensor, axis: int, size: int) -> torch.Tensor:
    """Tile (or crop) ``tensor`` along ``axis`` to ``size``, so values stay in the original range."""
    old = tensor.shape[axis]
    if old == size:
        return tensor
    index = torch.arange(size) % max(old, 1)
    return tensor.index_select(axis, index)


def _as_int(bound: Any, default: int) -> int:
    try:
        return int(bound)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return default


def resized_inputs(
    exported_program: torch.export.ExportedProgram,
    inputs: dict[str, Any],
    grow: int = 3,
    axes: Callable[[str, torch.Tensor], set[int]] | None = None,
) -> dict[str, Any] | None:
    """The same inputs with every dynamic size of ``exported_program`` changed, or None when the
    program has no dynamic axis.

    Each free size symbol whose example size is 2 or more grows by ``grow`` (or shrinks by one where
    the range constraints forbid growing); sizes 0 and 1 stay, so a decode step stays one token and
    a mask that is one longer than the cache stays so; derived sizes (``s0 + s1``) follow. Tensors are tiled along resized axes, so token ids
    and masks keep valid values.

    ``axes``, when given, is ``axes(input name, tensor) -> axis indices`` that may grow: a size symbol
    found on none of them keeps its example size (for a size the model ties to another through data,
    such as MAE's ``noise`` length and its patch count, which no guard records).
    """
    import torch.utils._pytree as pytree

    user = set(exported_program.graph_signature.user_inputs)
    metas = [n.meta.get("val") for n in exported_program.graph.nodes if n.op == "placeholder" and n.name in user]
    metas = [m for m in metas if isinstance(m, torch.Tensor)]
    leaves, spec = pytree.tree_flatten(inputs)
    # the input each leaf sits under (a dict flattens its values in order, each value's leaves together)
    names = [name for name, value in inputs.items() for _ in pytree.tree_leaves(value)]
    tensor_positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    if len(metas) != len(tensor_positions):
        return None

    values: dict[sympy.Symbol, int] = {}
    allowed: set[sympy.Symbol] = set()
    for meta, pos in zip(metas, tensor_positions):
        growable = axes(names[pos], leaves[pos]) if axes is not None else None
        for axis, (dim, actual) in enumerate(zip(meta.shape, leaves[pos].shape)):
            if isinstance(dim, torch.SymInt) and isinstance(dim.node.expr, sympy.Symbol):
                values[dim.node.expr] = int(actual)
                if growable is None or axis in growable:
                    allowed.add(dim.node.expr)
    if not any(v >= 2 for v in values.values()):
        return None
    new_values = {}
    for symbol, value in values.items():
        if value < 2 or symbol not in allowed:  # a batch of one or a one-token decode step keeps its size: other sizes follow from it
            new_values[symbol] = value
            continue
        bounds = exported_program.range_constraints.get(symbol)
        upper = _as_int(bounds.upper, value + grow) if bounds is not None else value + grow
        lower = _as_int(bounds.lower, 2) if bounds is not None else 2
        candidate = value + grow if value + grow <= upper else max(lower, value - 1)
        new_values[symbol] = candidate
    if new_values == values:
        return None
    for meta, pos in zip(metas, tensor_positions):
        tensor = leaves[pos]
        for axis, dim in enumerate(meta.shape):
            if is_symbolic(dim):
                size = int(dim.node.expr.subs(new_values))
                tensor = _resize(tensor, axis, size)
        leaves[pos] = tensor.clone()
    return pytree.tree_unflatten(leaves, spec)
