"""Dynamic shapes: ``Dim.AUTO`` on every axis, and the report of axes that ended static.

``torch.export`` with ``Dim.AUTO`` keeps an axis symbolic only when the trace allows it: a size of
0 or 1, a comparison with a constant or an equality with another static size specialises it, and
the exported program then refuses every other size. That is silent unless someone looks, so after
every dynamic export :func:`static_axes` lists each axis that was asked to be dynamic and ended
static.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import ConstantArgument, OutputKind

__all__ = ["StaticAxis", "auto_dynamic_shapes", "clone_tree", "is_symbolic", "static_axes", "tensor_leaves"]


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


def tensor_leaves(inputs: Any) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor in ``inputs``, in the order ``torch.export`` flattens them.

    Names join the pytree key path with ``_`` (``past_key_values_0``), as torch.export names inputs.
    """
    flat, _ = pytree.tree_flatten_with_path(inputs)
    out = []
    for path, leaf in flat:
        if isinstance(leaf, torch.Tensor):
            out.append((_key_name(path), leaf))
    return out


@dataclasses.dataclass(frozen=True)
class StaticAxis:
    """An input axis that was asked to be dynamic and was specialised to ``size`` by the trace."""

    input: str
    axis: int
    size: int

    def __str__(self) -> str:
        return f"{self.input}[axis {self.axis}] = {self.size}"


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


def static_axes(exported_program: torch.export.ExportedProgram, inputs: dict[str, Any], dynamic_shapes: Any) -> list[StaticAxis]:
    """Every axis ``dynamic_shapes`` asked to be dynamic that the exported program fixed to one size."""
    names_and_tensors = tensor_leaves(inputs)
    requested = _requested(inputs, dynamic_shapes)
    placeholders = [
        node
        for node in exported_program.graph.nodes
        if node.op == "placeholder" and node.name in set(exported_program.graph_signature.user_inputs)
    ]
    tensor_placeholders = [n for n in placeholders if isinstance(n.meta.get("val"), torch.Tensor)]
    found = []
    for (name, _), axes, node in zip(names_and_tensors, requested, tensor_placeholders):
        shape = node.meta["val"].shape
        for axis in sorted(axes):
            if axis < len(shape) and not is_symbolic(shape[axis]):
                found.append(StaticAxis(name, axis, int(shape[axis])))
    return found
