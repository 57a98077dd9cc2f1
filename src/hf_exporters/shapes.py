"""Dynamic shapes: ``Dim.AUTO`` on every axis, and the report of axes that ended static.

``torch.export`` with ``Dim.AUTO`` keeps an axis symbolic only when the trace allows it: a size of
0 or 1, a comparison with a constant or an equality with another static size specialises it, and
the exported program then refuses every other size. That is silent unless someone looks, so after
every dynamic export :func:`static_axes` lists each axis that was asked to be dynamic and ended
static, and :func:`constrained_axes` each one that stayed symbolic but refuses size 1. Both read
the program itself: the placeholder shapes, its range constraints and the input guards torch.export
keeps in ``ep.module()`` (``_guards_fn``); a guard such as ``input_ids.size()[0] == 1`` pins an axis
whose placeholder still shows a symbol. :func:`recorded_guards` keeps the model source line torch
logs for each guard it adds during the trace, so a report can say where an axis was pinned.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import sympy

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import ConstantArgument, OutputKind

__all__ = [
    "ConstrainedAxis",
    "StaticAxis",
    "auto_dynamic_shapes",
    "axis_report",
    "clone_tree",
    "constrained_axes",
    "is_symbolic",
    "recorded_guards",
    "static_axes",
    "tensor_leaves",
]


def clone_tree(value: Any) -> Any:
    """``value`` with every tensor detached and cloned, containers and caches rebuilt around them."""
    return pytree.tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, value)


def _auto(tensor: torch.Tensor) -> dict[int, Any]:
    return dict.fromkeys(range(tensor.dim()), torch.export.Dim.AUTO)


def auto_dynamic_shapes(value: Any) -> Any:
    """A ``dynamic_shapes`` spec with ``Dim.AUTO`` on every axis of every tensor in ``value``.

    ``value`` is an input mapping, a tensor, a list/tuple/dict, or a registered pytree node (a cache):
    a node's spec is the list of its children's specs, the structure ``torch.export`` matches.
    """
    if isinstance(value, torch.Tensor):
        return _auto(value)
    if type(value) is dict or isinstance(value, dict) and type(value) not in pytree.SUPPORTED_NODES:
        return {k: auto_dynamic_shapes(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(auto_dynamic_shapes(v) for v in value)
    node = pytree.SUPPORTED_NODES.get(type(value))
    if node is not None:
        children, _ = node.flatten_fn(value)
        return [auto_dynamic_shapes(child) for child in children]
    return None


def size_oblivious_sizes() -> Any:
    """A context in which input sizes of 0 or 1 stay symbolic (``backed_size_oblivious``).

    By default torch.export specialises any axis whose example size is 0 or 1, whatever
    ``dynamic_shapes`` says: a batch-1 or one-token example then yields a program that accepts only
    batch 1 or one token (pytorch/pytorch#150842, #152018). Size-oblivious reasoning keeps such axes
    symbolic; an axis the model really fixes still ends static and is reported by :func:`static_axes`.
    """
    import torch.fx.experimental._config as fx_config

    return fx_config.patch(backed_size_oblivious=True)


def _key_name(path: Any) -> str:
    return "_".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def output_names(exported_program: torch.export.ExportedProgram) -> list[str]:
    """Names of the program's user outputs, from its output pytree: ``logits``, ``past_key_values_0``, ...

    The same names :func:`tensor_leaves` gives the leaves of the eager output.
    """
    spec = exported_program.call_spec.out_spec
    if spec is None:
        return []
    # placeholder tensors for the tensor outputs (a cache's generic flatten keeps only tensors as
    # leaves); a constant output (a size the trace fixed) keeps its value, so it is not named
    leaves: list[Any] = [torch.empty(0) for _ in range(spec.num_leaves)]
    user = [s for s in exported_program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    if len(user) == spec.num_leaves:
        leaves = [s.arg.value if isinstance(s.arg, ConstantArgument) else leaf for leaf, s in zip(leaves, user)]
    structure = pytree.tree_unflatten(leaves, spec)
    return [name or "output" for name, _ in tensor_leaves(structure)]


def tensor_leaves(inputs: Any, types: tuple[type, ...] = (torch.Tensor,)) -> list[tuple[str, Any]]:
    """``(name, tensor)`` for every tensor in ``inputs``, in the order ``torch.export`` flattens them.

    Names join the pytree key path with ``_`` (``past_key_values_0``), as torch.export names inputs.
    ``types``: the leaf types that count as tensors (the ONNX runner adds ``onnxruntime.OrtValue``).
    """
    flat, _ = pytree.tree_flatten_with_path(inputs)
    out = []
    for path, leaf in flat:
        if isinstance(leaf, types):
            out.append((_key_name(path), leaf))
    return out


@dataclasses.dataclass(frozen=True)
class StaticAxis:
    """An input axis that was asked to be dynamic and was specialised to ``size`` by the trace.

    ``guard`` is the input guard that pins it when the placeholder itself kept a symbol (the text
    torch's guard check prints, ``input_ids.size()[0] == 1``), ``source`` the model source line where
    torch recorded that guard (``modeling_x.py:120 in forward``); both None when the trace replaced
    the size by a number. Neither takes part in equality.
    """

    input: str
    axis: int
    size: int
    guard: str | None = dataclasses.field(default=None, compare=False)
    source: str | None = dataclasses.field(default=None, compare=False)

    def __str__(self) -> str:
        text = f"{self.input}[axis {self.axis}] = {self.size}"
        if self.guard:
            text += f" (guard {self.guard}" + (f" at {self.source}" if self.source else "") + ")"
        return text

    def as_json(self) -> dict[str, Any]:
        """The record ``export.json`` keeps (``guard`` and ``source`` only when known)."""
        out: dict[str, Any] = {"input": self.input, "axis": self.axis, "size": self.size}
        out.update({k: v for k, v in (("guard", self.guard), ("source", self.source)) if v})
        return out


@dataclasses.dataclass(frozen=True)
class ConstrainedAxis:
    """An input axis that stayed symbolic but does not accept every size: the program refuses size 1
    on it (a guard such as ``x.size()[0] != 1``, or a range starting above 1).

    ``low``/``high`` are the range torch.export recorded for the axis (``high`` None: unbounded);
    ``guard`` is the failing check for size 1 and ``source`` the model line that added it, when known.
    """

    input: str
    axis: int
    size: int
    low: int
    high: int | None
    guard: str | None = dataclasses.field(default=None, compare=False)
    source: str | None = dataclasses.field(default=None, compare=False)

    def __str__(self) -> str:
        high = "inf" if self.high is None else self.high
        text = f"{self.input}[axis {self.axis}] in [{self.low}, {high}], refuses size 1"
        if self.guard:
            text += f" (guard {self.guard}" + (f" at {self.source}" if self.source else "") + ")"
        return text

    def as_json(self) -> dict[str, Any]:
        """The record ``export.json`` keeps."""
        out: dict[str, Any] = {"input": self.input, "axis": self.axis, "size": self.size, "low": self.low, "high": self.high}
        out.update({k: v for k, v in (("guard", self.guard), ("source", self.source)) if v})
        return out


_GUARD_LOGGER = "torch.fx.experimental.symbolic_shapes"


class _GuardRecorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.guards: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        # ShapeEnv._log_guard logs ("%s %s [guard added] %s%s%s", prefix, expression, location, ...)
        if "[guard added]" not in str(record.msg) or not isinstance(record.args, tuple) or len(record.args) < 3:
            return
        expression, sloc = str(record.args[1]), record.args[2]
        self.guards.setdefault(expression, _location(sloc))


def _location(sloc: Any) -> str:
    """``path:line in function`` of a ShapeEnv source location (``torch._guards.SLoc``): the user's
    frame where the trace records one, the path shown from ``site-packages/`` on; empty when the
    only frame torch recorded is its own."""
    user = getattr(sloc, "maybe_user_loc", None)
    if user:
        return str(user)
    frame = getattr(sloc, "framework_loc", None)
    if isinstance(frame, traceback.FrameSummary):
        path = frame.filename.split("site-packages/", 1)[-1]
        if path.startswith("torch/"):
            return ""  # torch's own frame (a kernel's meta function): no model line to name
        return f"{path}:{frame.lineno} in {frame.name}"
    return str(frame or "").strip().strip("()")


@contextlib.contextmanager
def recorded_guards() -> Iterator[dict[str, str]]:
    """Record, while the context is open, every shape guard torch adds and the model source line it
    logs for it: a dict ``{sympy expression text ("Eq(s77, 1)"): "file.py:120 in forward"}``.

    Reads ShapeEnv's ``[guard added]`` log records (logger ``torch.fx.experimental.symbolic_shapes``,
    INFO). For the time of the context the logger's own handlers (torch's stderr handler) are set
    aside so nothing is printed; its handlers, level and propagation are restored on exit.
    """
    logger = logging.getLogger(_GUARD_LOGGER)
    handler = _GuardRecorder()
    saved = logger.level, logger.propagate, list(logger.handlers)
    for other in saved[2]:
        logger.removeHandler(other)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield handler.guards
    finally:
        logger.removeHandler(handler)
        for other in saved[2]:
            logger.addHandler(other)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def is_symbolic(dim: Any) -> bool:
    """Whether a traced size is symbolic (a SymInt with free symbols; a SymInt the trace pinned to a
    number counts as static)."""
    return isinstance(dim, torch.SymInt) and bool(dim.node.expr.free_symbols)


def _requested(value: Any, spec: Any) -> list[set[int]]:
    """Per tensor leaf of ``value`` (flatten order), the axes ``spec`` marks dynamic."""
    if isinstance(value, torch.Tensor):
        if spec is None:
            return [set()]
        if isinstance(spec, dict):
            return [set(spec)]
        return [{i for i, d in enumerate(spec) if d is not None}]
    if isinstance(value, dict) and type(value) not in pytree.SUPPORTED_NODES or type(value) is dict:
        return sum((_requested(v, spec.get(k) if isinstance(spec, dict) else None) for k, v in value.items()), [])
    if type(value) in (list, tuple):
        specs = spec if isinstance(spec, (list, tuple)) else [None] * len(value)
        return sum((_requested(v, s) for v, s in zip(value, specs)), [])
    node = pytree.SUPPORTED_NODES.get(type(value))
    if node is not None:
        children, _ = node.flatten_fn(value)
        specs = spec if isinstance(spec, (list, tuple)) else [None] * len(children)
        return sum((_requested(c, s) for c, s in zip(children, specs)), [])
    return []


def _bound(value: Any) -> int | None:
    try:
        return int(value)
    except Exception:  # noqa: BLE001 - int_oo and sympy's oo do not convert
        return None


class _SizeProbe:
    """Asks an exported program whether it accepts other sizes of its symbolic axes, without running
    it: the range constraints, then the input guards of ``ep.module()`` called on empty tensors of
    the probed shapes (every axis sharing a symbol takes the probed size, other symbols keep their
    example size)."""

    def __init__(self, exported_program: torch.export.ExportedProgram, inputs: dict[str, Any]):
        self.program = exported_program
        user = exported_program.graph_signature.user_inputs
        by_name = {n.name: n for n in exported_program.graph.nodes if n.op == "placeholder"}
        self.metas = [by_name[name].meta.get("val") for name in user if name in by_name]
        self.leaves = pytree.tree_leaves(inputs)
        self.values: dict[sympy.Symbol, int] = {}
        self.usable = len(self.metas) == len(self.leaves)
        if self.usable:
            for meta, leaf in zip(self.metas, self.leaves):
                if isinstance(meta, torch.Tensor) and isinstance(leaf, torch.Tensor) and meta.dim() == leaf.dim():
                    for dim, actual in zip(meta.shape, leaf.shape):
                        if isinstance(dim, torch.SymInt) and isinstance(dim.node.expr, sympy.Symbol):
                            self.values[dim.node.expr] = int(actual)
        self._guards: Any = False
        self._probed: set[sympy.Symbol] = set()

    def _guards_fn(self) -> Any:
        """The program's input-guard check (``ep.module()._guards_fn``), or None.

        ``ExportedProgram.module()`` leaves the check out when any caller's file path contains
        "executorch" (``torch.export._unlift._ok_to_generate_guards_fn`` walks the stack), which our
        ExecuTorch exporter's own path does; unlifting in a thread of its own starts from an empty
        stack, so every backend gets the same check.
        """
        if self._guards is False:
            found: list[Any] = [None]

            def unlift() -> None:
                try:
                    found[0] = getattr(self.program.module(), "_guards_fn", None)
                except Exception:  # noqa: BLE001 - a program that cannot be unlifted is judged on its placeholders alone
                    found[0] = None

            worker = threading.Thread(target=unlift, name="hfx-unlift")
            worker.start()
            worker.join()
            self._guards = found[0]
        return self._guards

    def range(self, symbol: sympy.Symbol) -> tuple[int, int | None]:
        bounds = self.program.range_constraints.get(symbol)
        if bounds is None:
            return 0, None
        return _bound(bounds.lower) or 0, _bound(bounds.upper)

    def _check(self, values: dict[sympy.Symbol, int], label: str) -> str | None:
        for symbol, size in values.items():
            low, high = self.range(symbol)
            if size < low or (high is not None and size > high):
                return f"{label} in [{low}, {'inf' if high is None else high}]" if symbol in self._probed else f"a tied size in [{low}, {high}]"
        guards = self._guards_fn()
        if guards is None:
            return None
        flat = []
        for meta, leaf in zip(self.metas, self.leaves):
            if isinstance(meta, torch.Tensor):
                shape = [int(d.node.expr.xreplace(values)) if isinstance(d, torch.SymInt) else int(d) for d in meta.shape]
                if any(d < 0 for d in shape):
                    return f"{label}: a tied size below 0"
                flat.append(torch.empty(shape, dtype=meta.dtype))
            elif isinstance(meta, torch.SymInt):
                flat.append(int(meta.node.expr.xreplace(values)))
            else:
                flat.append(leaf)
        try:
            guards(*flat)
        except Exception as error:  # noqa: BLE001 - the guard check raises AssertionError or RuntimeError
            text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return text.removeprefix("Guard failed:").strip()
        return None

    def refusal(self, symbol: sympy.Symbol, size: int, label: str) -> str | None:
        """None when the program accepts ``size`` on ``symbol``'s axes, else the check that refuses it.

        Sizes the program ties to this one (an attention mask as long as the ids, a mask as long as
        the cache plus the new tokens) may move with it: the size is accepted when it passes alone,
        with every size of the same example value moved to it, or with any one other size moved by
        the same amount."""
        self._probed = {symbol}
        example = self.values.get(symbol, size)
        moves: list[dict[sympy.Symbol, int]] = [{symbol: size}]
        same = {t: size for t, v in self.values.items() if v == example and t != symbol}
        if same:
            moves.append({symbol: size, **same})
        moves += [{symbol: size, t: v + size - example} for t, v in self.values.items() if t != symbol and v + size - example >= 0]
        first = None
        for move in moves:
            values = dict(self.values)
            values.update(move)
            refused = self._check(values, label)
            if refused is None:
                return None
            first = first or refused
        return first


def _source_of(symbol: sympy.Symbol, guards: dict[str, str] | None) -> str | None:
    """The source line torch logged for the first guard on ``symbol`` that is not a plain bound."""
    if not guards:
        return None
    pattern = re.compile(rf"\b{re.escape(str(symbol))}\b")
    matches = [(expr, loc) for expr, loc in guards.items() if pattern.search(expr) and loc]
    for expr, loc in matches:
        if expr.startswith(("Eq(", "Ne(")):
            return loc
    return matches[0][1] if matches else None


def axis_report(
    exported_program: torch.export.ExportedProgram,
    inputs: dict[str, Any],
    dynamic_shapes: Any,
    guards: dict[str, str] | None = None,
) -> tuple[list[StaticAxis], list[ConstrainedAxis]]:
    """:func:`static_axes` and :func:`constrained_axes` in one pass (the program is unlifted once)."""
    names_and_tensors = tensor_leaves(inputs)
    requested = _requested(inputs, dynamic_shapes)
    placeholders = [
        node
        for node in exported_program.graph.nodes
        if node.op == "placeholder" and node.name in set(exported_program.graph_signature.user_inputs)
    ]
    tensor_placeholders = [n for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)]
    probe: _SizeProbe | None = None
    static: list[StaticAxis] = []
    constrained: list[ConstrainedAxis] = []
    for (name, tensor), axes, node in zip(names_and_tensors, requested, tensor_placeholders):
        shape = node.meta["val"].shape
        for axis in sorted(axes):
            if axis >= len(shape):
                continue
            dim = shape[axis]
            if not is_symbolic(dim):
                static.append(StaticAxis(name, axis, int(dim)))
                continue
            if not isinstance(dim.node.expr, sympy.Symbol) or axis >= tensor.dim():
                continue
            probe = probe or _SizeProbe(exported_program, inputs)
            symbol, size = dim.node.expr, int(tensor.shape[axis])
            label = f"{name}.size()[{axis}]"
            if not probe.usable or probe.refusal(symbol, size, label) is not None:
                continue  # the probe cannot rebuild the example itself: judge by the placeholder alone
            other = probe.refusal(symbol, 1 if size != 1 else 2, label)
            larger = probe.refusal(symbol, size + 1, label)
            if other is not None and larger is not None:
                static.append(StaticAxis(name, axis, size, guard=larger, source=_source_of(symbol, guards)))
            elif size != 1 and other is not None:
                low, high = probe.range(symbol)
                constrained.append(ConstrainedAxis(name, axis, size, low, high, guard=other, source=_source_of(symbol, guards)))
    return static, constrained


def static_axes(
    exported_program: torch.export.ExportedProgram,
    inputs: dict[str, Any],
    dynamic_shapes: Any,
    guards: dict[str, str] | None = None,
) -> list[StaticAxis]:
    """Every axis ``dynamic_shapes`` asked to be dynamic that the exported program fixed to one size:
    its placeholder shows a number, or it kept a symbol that an input guard or its range pins to the
    example's size (then ``guard`` names the check, and ``source`` the model line from ``guards``, the
    dict :func:`recorded_guards` filled during the trace).
    """
    return axis_report(exported_program, inputs, dynamic_shapes, guards)[0]


def constrained_axes(
    exported_program: torch.export.ExportedProgram,
    inputs: dict[str, Any],
    dynamic_shapes: Any,
    guards: dict[str, str] | None = None,
) -> list[ConstrainedAxis]:
    """Every axis asked to be dynamic that stayed symbolic but on which the program refuses size 1
    (a guard such as ``x.size()[0] != 1``, which size-oblivious tracing adds where a model branches on
    a size being 1, or a range starting above 1)."""
    return axis_report(exported_program, inputs, dynamic_shapes, guards)[1]
