"""Patches for loading a saved program (``register_patch("load.pt2", ...)``), applied by
:func:`hf_exporters.exporters.dynamo.load_exported_program` around ``torch.export.load``.

Loading is not an export stage: these change how fast a ``model.pt2`` is read back, never what it
holds.
"""

from __future__ import annotations

import functools
from typing import Any

from ...registry import register_patch


@register_patch("load.pt2", "torch._export.serde.serialize.GraphModuleDeserializer._parse_sym_expr")
def _patch_parse_each_size_expression_once(original: Any) -> Any:
    """Parse each symbolic size expression of a saved program once per load, not once per use.

    Pattern: loading a program exported with dynamic axes. Every tensor's saved metadata holds its
    sizes and strides as expression strings (``s27``, ``s27*s53``, ``((s53 + 63)//64)``), and the
    deserializer turns each occurrence into sympy with ``sympy.sympify`` (Python's tokenizer and
    ``eval``), then walks its sub-expressions, printing each one again. The same few dozen expressions
    recur over thousands of nodes: Qwen3.5-MoE's tiny text model (1,292 nodes, 6,261 sizes) took 39 s
    to load, more than its export. The result of a parse depends only on the string (or
    sub-expression) and the hint, and its effects on the loader (the symbol cache, the hint and value
    range recorded in the shape environment) are the same each time (only the creation traceback kept
    for a symbol, debug output, is the first one instead of the last), so the patch keeps each
    deserializer's results by ``(expression, hint)`` and returns the kept symbol on a repeat.
    Models: every program exported with dynamic axes (Qwen3_5MoeTextModel: load 39 s -> 12 s).
    Upstream: pytorch/pytorch#196452 (``torch.export.load`` repeats work per node; that report covers
        the schema lookups, the same holds for size expressions)
    Remove when: torch's deserializer caches parsed size expressions.
    """

    @functools.wraps(original)
    def parse(self: Any, expr_str: Any, hint: Any = None) -> Any:
        cache = self.__dict__.setdefault("_hf_exporters_parsed", {})
        key = (expr_str, hint, type(hint))
        if key not in cache:
            cache[key] = original(self, expr_str, hint)
        return cache[key]

    return parse


@register_patch("load.pt2", "torch._export.serde.serialize.typing")
def _patch_schema_type_hints_once(original: Any) -> Any:
    """Look up each schema class's field types once per load, not once per decoded object.

    Pattern: loading a large program. The deserializer turns the saved JSON into schema dataclasses
    with ``_dict_to_dataclass``, which calls ``typing.get_type_hints`` on the schema class for every
    object it builds (one per node, argument, tensor meta, size...), and each call evaluates the
    class's string annotations again: xLSTM's tiny model (19,599 nodes, 329,397 calls) spent 28 s of a
    51 s load there. The hints of a schema class are fixed (the schema module is not edited while a
    program loads), so the serializer module's ``typing`` is replaced for the load by a view of
    ``typing`` whose ``get_type_hints`` keeps its result per (class, namespace).
    Models: every program, most for large graphs (xLSTMModel, .pt2 static).
    Upstream: pytorch/pytorch#196452 (``torch.export.load`` repeats the schema lookups per node)
    Remove when: torch's deserializer caches the schema classes' type hints.
    """
    import types

    hints: dict[tuple[Any, int], Any] = {}

    def get_type_hints(obj: Any, globalns: Any = None, localns: Any = None, include_extras: bool = False) -> Any:
        if localns is not None or include_extras or not isinstance(obj, type):
            return original.get_type_hints(obj, globalns, localns, include_extras)
        key = (obj, id(globalns))
        if key not in hints:
            hints[key] = original.get_type_hints(obj, globalns)
        return hints[key]

    view = types.ModuleType(original.__name__, original.__doc__)
    view.__dict__.update({k: v for k, v in vars(original).items() if not k.startswith("__")})
    view.get_type_hints = get_type_hints
    return view
