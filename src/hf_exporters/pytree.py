"""Pytree registration of transformers caches and model outputs, by reflection.

``torch.export`` only traces through containers it knows how to flatten. transformers registers its
``ModelOutput`` classes itself; its ``Cache`` classes are not registered. :func:`register_model_pytrees`
registers every ``Cache`` subclass, every class named ``*Cache`` in the model's module, and every
``ModelOutput`` or cache met in the inputs, with one generic flatten: tensors found in the object's
attributes (recursively through lists, tuples, dicts and nested objects) become the leaves, and
everything else (ints, bools, dtypes, devices, classes) is kept in a JSON context, so
``torch.export.save`` / ``load`` can write and rebuild the tree.

Extension point: :func:`register_pytree_type` registers any other class with the same generic
flatten, for a type reflection cannot reach (a container defined outside transformers).
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["register_model_pytrees", "register_pytree_type", "flatten_object", "unflatten_object"]


def _type_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _type_from_path(path: str) -> type:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _encode(value: Any, leaves: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return {"t": "leaf"}
    if isinstance(value, enum.Enum):
        return {"t": "enum", "c": _type_path(type(value)), "v": value.value}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"t": "lit", "v": value}
    if isinstance(value, torch.dtype):
        return {"t": "dtype", "v": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"t": "device", "v": str(value)}
    if isinstance(value, type):
        return {"t": "type", "v": _type_path(value)}
    if type(value) in (list, tuple):
        return {"t": type(value).__name__, "v": [_encode(v, leaves) for v in value]}
    if type(value) is dict and all(isinstance(k, str) for k in value):
        return {"t": "dict", "v": [[k, _encode(v, leaves)] for k, v in value.items()]}
    if hasattr(value, "__dict__") and not callable(value):
        return {"t": "obj", "c": _type_path(type(value)), "v": [[k, _encode(v, leaves)] for k, v in vars(value).items()]}
    raise TypeError(f"cannot flatten a {type(value).__qualname__} found inside a pytree-registered object")


def _decode(ctx: Any, leaves: list[Any], pos: list[int]) -> Any:
    kind = ctx["t"]
    if kind == "leaf":
        value = leaves[pos[0]]
        pos[0] += 1
        return value
    if kind == "lit":
        return ctx["v"]
    if kind == "enum":
        return _type_from_path(ctx["c"])(ctx["v"])
    if kind == "dtype":
        return getattr(torch, ctx["v"])
    if kind == "device":
        return torch.device(ctx["v"])
    if kind == "type":
        return _type_from_path(ctx["v"])
    if kind in ("list", "tuple"):
        items = [_decode(c, leaves, pos) for c in ctx["v"]]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _decode(c, leaves, pos) for k, c in ctx["v"]}
    if kind == "obj":
        cls = _type_from_path(ctx["c"])
        instance = cls.__new__(cls)
        for k, c in ctx["v"]:
            instance.__dict__[k] = _decode(c, leaves, pos)
        return instance
    raise ValueError(f"unknown pytree context tag {kind!r}")


def flatten_object(obj: Any) -> tuple[list[torch.Tensor], str]:
    """Tensors held by ``obj`` (depth first, attribute order) and a JSON context for everything else."""
    leaves: list[torch.Tensor] = []
    state = [[k, _encode(v, leaves)] for k, v in vars(obj).items()]
    return leaves, json.dumps({"c": _type_path(type(obj)), "v": state})


def unflatten_object(leaves: Any, context: str) -> Any:
    """Rebuild the object :func:`flatten_object` flattened, with ``leaves`` in place of its tensors."""
    return _decode({"t": "obj", **json.loads(context)}, list(leaves), [0])


def _flatten_with_keys(obj: Any):
    leaves, context = flatten_object(obj)
    return [(pytree.SequenceKey(i), leaf) for i, leaf in enumerate(leaves)], context


def register_pytree_type(cls: type) -> bool:
    """Register ``cls`` as a pytree node with the generic object flatten. Returns False when it was
    already registered (by us or by its library)."""
    if cls in pytree.SUPPORTED_NODES:
        return False
    if issubclass(cls, dict):  # a ModelOutput transformers did not register: its fields are its items
        pytree.register_pytree_node(
            cls,
            lambda out: (list(out.values()), json.dumps(list(out.keys()))),
            lambda values, ctx: cls(**dict(zip(json.loads(ctx), values))),
            serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
            flatten_with_keys_fn=lambda out: (
                [(pytree.MappingKey(k), v) for k, v in out.items()],
                json.dumps(list(out.keys())),
            ),
            to_dumpable_context=lambda ctx: ctx,
            from_dumpable_context=lambda ctx: ctx,
        )
        return True
    pytree.register_pytree_node(
        cls,
        flatten_object,
        unflatten_object,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=_flatten_with_keys,
        to_dumpable_context=lambda ctx: ctx,
        from_dumpable_context=lambda ctx: ctx,
    )
    return True


def _subclasses(cls: type) -> list[type]:
    found, stack = [], [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                stack.append(sub)
    return found


def _met_types(value: Any, seen: set[int] | None = None) -> list[type]:
    """Types of the caches and model outputs found in a (nested) input or output value."""
    from transformers.cache_utils import Cache
    from transformers.utils import ModelOutput

    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    found: list[type] = []
    if isinstance(value, (Cache, ModelOutput)):
        found.append(type(value))
    if isinstance(value, dict):
        for v in value.values():
            found += _met_types(v, seen)
    elif isinstance(value, (list, tuple)):
        for v in value:
            found += _met_types(v, seen)
    return found


def register_model_pytrees(model: Any, *values: Any) -> list[type]:
    """Register every cache and model-output type ``model`` may take or return.

    Covers all ``transformers.cache_utils.Cache`` subclasses, classes named ``*Cache`` defined in the
    model's modeling module, and the cache and ``ModelOutput`` types met in ``values`` (the inputs, or
    outputs of an eager run). Returns the types registered by this call.
    """
    from transformers.cache_utils import Cache

    candidates: list[type] = [Cache, *_subclasses(Cache)]
    module = inspect.getmodule(type(model)) if model is not None else None
    if module is not None:
        candidates += [
            obj
            for _, obj in inspect.getmembers(module, inspect.isclass)
            if obj.__module__ == module.__name__ and obj.__name__.endswith("Cache")
        ]
    for value in values:
        candidates += _met_types(value)
    return [cls for cls in dict.fromkeys(candidates) if register_pytree_type(cls)]


def _caches(value: Any) -> list[Any]:
    from transformers.cache_utils import Cache

    if isinstance(value, Cache):
        return [value]
    if isinstance(value, dict):
        return [c for v in value.values() for c in _caches(v)]
    if isinstance(value, (list, tuple)):
        return [c for v in value for c in _caches(v)]
    return []


def materialize_caches(model: Any, inputs: dict[str, Any]) -> int:
    """Allocate, in place, the tensors of fixed-size cache layers in ``inputs`` that are not yet initialised.

    A ``StaticCache`` allocates its ``(batch, kv_heads, max_cache_len, head_dim)`` tensors lazily, on
    the first forward. Traced that way, the cache tensors are created inside the graph instead of being
    inputs, and the exported program's inputs no longer match the model's. This runs one eager forward
    on a copy of ``inputs`` to learn each layer's shapes and dtypes, then allocates the same (zeroed)
    tensors in the caller's cache, as its first forward would. Layers without ``max_cache_len`` (a
    ``DynamicCache`` grows by concatenation) are left alone.

    Returns the number of layers allocated.
    """
    from .shapes import clone_tree

    pending = [
        (ci, li, layer)
        for ci, cache in enumerate(_caches(inputs))
        for li, layer in enumerate(getattr(cache, "layers", []))
        if hasattr(layer, "max_cache_len") and not getattr(layer, "is_initialized", True)
    ]
    if not pending:
        return 0
    copy = clone_tree(inputs)
    with torch.no_grad():
        model(**copy)
    warmed = _caches(copy)
    for ci, li, layer in pending:
        reference = warmed[ci].layers[li]
        layer.lazy_initialization(reference.keys[:, :, :1], reference.values[:, :, :1])
    return len(pending)
