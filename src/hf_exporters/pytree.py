"""Pytree registration of transformers caches and model outputs, by reflection.

``torch.export`` only traces through containers it knows how to flatten. transformers registers its
``ModelOutput`` classes itself; its ``Cache`` classes are not registered. :func:`register_model_pytrees`
registers every ``Cache`` subclass, every class named ``*Cache`` in the model's module, and every
``ModelOutput`` or cache met in the inputs, with one generic flatten: tensors found in the object's
attributes (recursively through lists, tuples, dicts and nested objects, cache layers included) become
the leaves, and everything else (ints, bools, dtypes, devices, classes) is kept in the context.

The context is a tree of plain tuples (tags, constants, class objects, dtypes, devices): hashable,
compared by value in the program's input and output specs, and built without ``json``, so Dynamo can
trace the flatten (``strict=True`` exports). ``torch.export.save`` writes it as JSON through the
registration's ``to_dumpable_context`` hook and ``load`` reads it back (contexts written as JSON by
earlier versions of this module load too).

Two kinds of ints are not kept in the context: under a dynamic trace they are symbolic (a ``SymInt``
cannot be a constant of the spec, and a constant would pin the size):

* a running length of a layer (:data:`LENGTH_ATTRIBUTES`: a sliding-window layer's
  ``cumulative_length``, a compressor's ``entry_count``, ...) is carried as a tensor leaf holding no
  data, an empty int64 tensor of shape ``(length, 0)``, and read back from the leaf's first size on
  unflatten. A size is what ``torch.export`` keeps symbolic and guards on: a cache taken as an input
  gives its layers a Python int (static export) or a size symbol (dynamic), so a layer that branches
  on its length (a sliding-window layer's mask sizes) traces as it does on any input size, and a
  program returning the cache returns the length as that leaf's size;
* an int equal to a size of a tensor beside it (:data:`SIZE_ATTRIBUTES`: a static layer's
  ``batch_size``, ``num_heads``, head sizes) is not carried at all: unflatten reads it from the tensor.

Extension point: :func:`register_pytree_type` registers any other class with the same generic
flatten, for a type reflection cannot reach (a container defined outside transformers).
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import threading
import weakref
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = [
    "LENGTH_ATTRIBUTES",
    "SIZE_ATTRIBUTES",
    "dump_context",
    "flatten_object",
    "load_context",
    "register_model_pytrees",
    "register_pytree_type",
    "unflatten_object",
]

#: Attributes holding a running length (tokens or entries seen so far), carried as the first size of an
#: empty ``(length, 0)`` int64 tensor leaf: an int under one of these names, or each int of a dict or
#: list under one of these names.
LENGTH_ATTRIBUTES = frozenset(
    {
        "cumulative_length",  # DynamicSlidingWindowLayer (chunked attention too), BaseQuantizedLayer; a tensor in StaticLayer
        "cumulative_length_int",  # StaticSlidingWindowLayer
        "prefill_length",  # UnlimitedOcr reference sliding-window layers (None until the first update)
        "prefill_cumulative_length",
        "entry_count",  # DeepseekV4 compressor layers: {entry name: compressed entries emitted}
    }
)

#: Attributes equal to a size of a tensor attribute of the same object, ``name -> (tensor attribute,
#: dim)``; read from that tensor on unflatten (StaticLayer and its subclasses set them at allocation).
SIZE_ATTRIBUTES = {
    "batch_size": ("keys", 0),
    "num_heads": ("keys", 1),
    "k_head_dim": ("keys", -1),
    "v_head_dim": ("values", -1),
}

# Context tags. A context is a tuple whose first item is one of these:
_TENSOR = ("T",)  # the next leaf
_LENGTH = ("N",)  # the next leaf, an empty (length, 0) tensor standing for the int length
# ("=", constant)                      None, bool, int, float or str
# ("dtype", torch.dtype) / ("device", torch.device) / ("type", class) / ("enum", member)
# ("list", (ctx, ...)) / ("tuple", (ctx, ...))
# ("dict", ((key, ctx), ...))           keys: str, int, bool or None
# ("obj", class, ((attribute, ctx), ...))
# ("size", tensor attribute, dim)       an int read from a tensor attribute of the enclosing object
_FORMAT = "hf_exporters.pytree/2"


def _type_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _type_from_path(path: str) -> type:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)


# The length leaves handed out for an object outside a trace, ``owner -> {key: leaf}``: flattening
# the same object twice gives the same leaf while its length is unchanged. torch.export flattens its
# inputs more than once and matches ``dynamic_shapes`` to the leaves by identity: a new leaf at each
# flatten would leave the length static.
_length_leaves: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_length_leaves_lock = threading.Lock()


def _length_leaf(value: Any, owner: Any, key: tuple) -> torch.Tensor:
    """A running length as a leaf: an empty int64 tensor of shape ``(value, 0)`` (traced as a graph
    value of symbolic size when ``value`` is symbolic)."""
    if type(value) is not int or torch.compiler.is_compiling():  # symbolic, or inside a trace (Dynamo or torch.export)
        return torch.empty((value, 0), dtype=torch.int64)
    with _length_leaves_lock:
        try:
            known = _length_leaves.setdefault(owner, {})
        except TypeError:  # an object that cannot be weakly referenced or hashed: a new leaf each time
            return torch.empty((value, 0), dtype=torch.int64)
        leaf = known.get(key)
        if leaf is None or leaf.shape[0] != value:
            leaf = known[key] = torch.empty((value, 0), dtype=torch.int64)
        return leaf


def _length_value(leaf: Any) -> Any:
    """The length a leaf stands for: its first size (a Python int, or a size symbol in a trace), or
    ``leaf`` itself when it is already an int."""
    return leaf.shape[0] if isinstance(leaf, torch.Tensor) else leaf


def _constant(value: Any, where: str) -> Any:
    """The constant a symbolic scalar has been specialised to; a symbolic one cannot be in a context."""
    node = value.node
    if isinstance(value, torch.SymBool):
        constant = node.maybe_as_bool()
    elif isinstance(value, torch.SymFloat):
        constant = node.maybe_as_float()
    else:
        constant = node.maybe_as_int()
    if constant is None:
        raise TypeError(
            f"cannot flatten the symbolic {type(value).__name__} {value} at {where} of a pytree-registered object: "
            "a running length belongs in hf_exporters.pytree.LENGTH_ATTRIBUTES, a tensor size in SIZE_ATTRIBUTES"
        )
    return constant


def _same_size(value: Any, size: Any) -> bool:
    if isinstance(value, int) and isinstance(size, int):
        return value == size
    return True  # symbolic: the layer set one from the other (an equality test would add a guard)


def _encode(value: Any, leaves: list[torch.Tensor], where: str, length: tuple | None = None) -> tuple:
    """The context of ``value``, its tensors appended to ``leaves``. ``length`` is ``(owner, key)``
    when ``value`` sits under a running-length attribute of ``owner``."""
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return _TENSOR
    if length is not None and _is_int(value):
        leaves.append(_length_leaf(value, *length))
        return _LENGTH
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        value = _constant(value, where)
    if isinstance(value, enum.Enum):
        return ("enum", value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("=", value)
    if isinstance(value, torch.dtype):
        return ("dtype", value)
    if isinstance(value, torch.device):
        return ("device", value)
    if isinstance(value, type):
        return ("type", value)
    if type(value) in (list, tuple):
        items = tuple(
            _encode(v, leaves, f"{where}[{i}]", None if length is None else (length[0], (*length[1], i)))
            for i, v in enumerate(value)
        )
        return (type(value).__name__, items)
    if type(value) is dict and all(k is None or type(k) in (str, int, bool) for k in value):
        items = tuple(
            (k, _encode(v, leaves, f"{where}[{k!r}]", None if length is None else (length[0], (*length[1], k))))
            for k, v in value.items()
        )
        return ("dict", items)
    if hasattr(value, "__dict__") and not callable(value):
        return _encode_object(value, leaves, where)
    raise TypeError(f"cannot flatten a {type(value).__qualname__} found inside a pytree-registered object (at {where})")


def _encode_object(obj: Any, leaves: list[torch.Tensor], where: str) -> tuple:
    state = obj.__dict__
    fields = []
    for name, value in state.items():
        rule = SIZE_ATTRIBUTES.get(name)
        if rule is not None and _is_int(value):
            source = state.get(rule[0])
            if isinstance(source, torch.Tensor) and source.dim() > 0 and _same_size(value, source.shape[rule[1]]):
                fields.append((name, ("size", rule[0], rule[1])))
                continue
        length = (obj, (name,)) if name in LENGTH_ATTRIBUTES else None
        fields.append((name, _encode(value, leaves, f"{where}.{name}", length)))
    return ("obj", type(obj), tuple(fields))


def _decode(ctx: tuple, leaves: list[Any], pos: list[int]) -> Any:
    tag = ctx[0]
    if tag == "T" or tag == "N":
        value = leaves[pos[0]]
        pos[0] += 1
        return value if tag == "T" else _length_value(value)
    if tag in ("=", "dtype", "device", "type", "enum"):
        return ctx[1]
    if tag == "list":
        return [_decode(c, leaves, pos) for c in ctx[1]]
    if tag == "tuple":
        return tuple(_decode(c, leaves, pos) for c in ctx[1])
    if tag == "dict":
        return {k: _decode(c, leaves, pos) for k, c in ctx[1]}
    if tag == "obj":
        cls = ctx[1]
        instance = cls.__new__(cls)
        state = instance.__dict__
        sized = []
        for name, c in ctx[2]:
            if c[0] == "size":
                state[name] = None  # keeps the attribute order, so a second flatten gives the same context
                sized.append((name, c[1], c[2]))
            else:
                state[name] = _decode(c, leaves, pos)
        for name, source, dim in sized:
            # ExecuTorch's emitter and the ONNX output naming unflatten placeholder leaves (ints, 0-d tensors)
            value = state[source]
            state[name] = value.shape[dim] if isinstance(value, torch.Tensor) and dim < value.dim() else None
        return instance
    raise ValueError(f"unknown pytree context tag {tag!r}")


def flatten_object(obj: Any) -> tuple[list[torch.Tensor], tuple]:
    """Tensors held by ``obj`` (depth first, attribute order; a running length as an empty ``(length, 0)`` tensor)
    and a context of plain tuples for everything else."""
    leaves: list[torch.Tensor] = []
    context = _encode_object(obj, leaves, type(obj).__name__)
    return leaves, context


def unflatten_object(leaves: Any, context: tuple) -> Any:
    """Rebuild the object :func:`flatten_object` flattened, with ``leaves`` in place of its tensors."""
    return _decode(context, list(leaves), [0])


def _flatten_with_keys(obj: Any):
    leaves, context = flatten_object(obj)
    return [(pytree.SequenceKey(i), leaf) for i, leaf in enumerate(leaves)], context


def _dumpable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_dumpable(v) for v in value]
    if isinstance(value, type):
        return {"class": _type_path(value)}
    if isinstance(value, enum.Enum):
        return {"enum": _type_path(type(value)), "name": value.name}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    return value


def _undumpable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_undumpable(v) for v in value)
    if isinstance(value, dict):
        if "class" in value:
            return _type_from_path(value["class"])
        if "enum" in value:
            return _type_from_path(value["enum"])[value["name"]]
        if "dtype" in value:
            return getattr(torch, value["dtype"])
        if "device" in value:
            return torch.device(value["device"])
        raise ValueError(f"unknown entry {value!r} in a saved pytree context")
    return value


def _from_legacy(enc: dict) -> tuple:
    """A context as JSON-encoded by the first version of this module (``{"t": tag, ...}``)."""
    kind = enc["t"]
    if kind == "leaf":
        return _TENSOR
    if kind == "lit":
        return ("=", enc["v"])
    if kind == "enum":
        return ("enum", _type_from_path(enc["c"])(enc["v"]))
    if kind == "dtype":
        return ("dtype", getattr(torch, enc["v"]))
    if kind == "device":
        return ("device", torch.device(enc["v"]))
    if kind == "type":
        return ("type", _type_from_path(enc["v"]))
    if kind in ("list", "tuple"):
        return (kind, tuple(_from_legacy(c) for c in enc["v"]))
    if kind == "dict":
        return ("dict", tuple((k, _from_legacy(c)) for k, c in enc["v"]))
    if kind == "obj":
        return ("obj", _type_from_path(enc["c"]), tuple((k, _from_legacy(c)) for k, c in enc["v"]))
    raise ValueError(f"unknown pytree context tag {kind!r}")


def dump_context(context: tuple) -> str:
    """``to_dumpable_context`` of the generic registration: the context as JSON (classes by import path)."""
    return json.dumps({"format": _FORMAT, "context": _dumpable(context)})


def load_context(dumped: str) -> tuple:
    """``from_dumpable_context``: the context :func:`dump_context` wrote (or a first-version JSON context)."""
    data = json.loads(dumped)
    if isinstance(data, dict) and data.get("format") == _FORMAT:
        return _undumpable(data["context"])
    return _from_legacy({"t": "obj", **data})


def register_pytree_type(cls: type) -> bool:
    """Register ``cls`` as a pytree node with the generic object flatten. Returns False when it was
    already registered (by us or by its library)."""
    if cls in pytree.SUPPORTED_NODES:
        return False
    if issubclass(cls, dict):  # a ModelOutput transformers did not register: its fields are its items
        pytree.register_pytree_node(
            cls,
            lambda out: (list(out.values()), tuple(out.keys())),
            lambda values, keys: cls(**dict(zip(keys, values))),
            serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
            flatten_with_keys_fn=lambda out: ([(pytree.MappingKey(k), v) for k, v in out.items()], tuple(out.keys())),
            to_dumpable_context=lambda keys: json.dumps(list(keys)),
            from_dumpable_context=lambda dumped: tuple(json.loads(dumped)),
        )
        return True
    pytree.register_pytree_node(
        cls,
        flatten_object,
        unflatten_object,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        flatten_with_keys_fn=_flatten_with_keys,
        to_dumpable_context=dump_context,
        from_dumpable_context=load_context,
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
