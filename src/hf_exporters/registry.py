"""The one registry of export workarounds.

A workaround is either

* a **patch**: reversible. ``register_patch(backend, *dotted_paths)`` decorates a factory
  ``factory(original) -> replacement``; :func:`apply_patches` swaps each path's attribute for the
  replacement while a block runs and restores the original afterwards, whatever happens in the block;
* a **fix**: a rewrite of the traced program, not reverted. ``register_fx_node_fix(backend)``
  registers ``fix(graph_module, node) -> bool``; ``register_fx_program_fix(backend)`` registers
  ``fix(exported_program) -> None``.

Backend-specific tables live here too: ONNX translations (aten op -> onnxscript function, passed as
torch.onnx's custom translation table), ONNX IR fixes (rewrites on the finished ``onnx_ir`` model)
and ExecuTorch backend preparers (``prepare_for_<name>(model, inputs) -> (model, inputs,
partitioners)``).

Backends are dotted scopes: a patch registered for ``"executorch"`` is applied by
``apply_patches("executorch.xnnpack")`` too; one registered for ``"executorch.xnnpack"`` only there.

Every workaround's docstring names the upstream report it works around (a line ``Upstream: ...``)
and when it can go (a line ``Remove when: ...``); ``hf-exporters patches`` lists both, and a test
refuses a workaround without them.

Thread safety: patches swap process-wide attributes (``torch.where``, a model class's method), so
two exports in different threads would see each other's patches. :func:`export_lock` is one
process-wide re-entrant lock; :func:`apply_patches` holds it for its whole block, and the exporters
hold it for a whole export, so exports in concurrent threads run their patched regions one at a time.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import importlib
import inspect
import operator
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "UnresolvedPatchWarning",
    "Workaround",
    "apply_fx_node_fixes",
    "apply_fx_program_fixes",
    "apply_patches",
    "export_lock",
    "list_workarounds",
    "register_executorch_backend",
    "register_fx_node_fix",
    "register_fx_program_fix",
    "register_onnx_ir_fix",
    "register_onnx_translation",
    "register_patch",
    "resolve_dotted_path",
]


class UnresolvedPatchWarning(UserWarning):
    """A registered patch path does not exist in the installed library versions; the patch is skipped."""


@dataclasses.dataclass(frozen=True)
class Workaround:
    """One registered patch or fix.

    Attributes:
        kind: ``"patch"``, ``"fx_node_fix"``, ``"fx_program_fix"``, ``"onnx_translation"``,
            ``"onnx_ir_fix"`` or ``"backend_prepare"``.
        backend: the dotted backend scope it was registered for (``"onnx"``, ``"executorch.xnnpack"``).
        target: what it acts on: a dotted path for a patch, an aten op for a translation, the function's
            name for a fix.
        func: the registered callable (a patch's factory, a fix, a translation).
        loaded_only: for a patch, install it only where the module its path starts in is already
            imported (a model method needs no patch while its modeling file was never loaded).
    """

    kind: str
    backend: str
    target: str
    func: Callable[..., Any]
    loaded_only: bool = False

    @property
    def name(self) -> str:
        return self.func.__name__

    @property
    def upstream(self) -> str | None:
        """The ``Upstream:`` line of the docstring (the report this works around), or None."""
        return _doc_field(self.func, "Upstream")

    @property
    def remove_when(self) -> str | None:
        """The ``Remove when:`` line of the docstring, or None."""
        return _doc_field(self.func, "Remove when")

    @property
    def stage(self) -> str:
        """The exporter stage that applies this workaround, as titled in ``docs/extending.md``."""
        return stage_of(self.kind, self.backend, self.target)


def _doc_field(func: Callable[..., Any], field: str) -> str | None:
    """The text after ``field:`` in ``func``'s docstring, with its continuation lines (up to a blank
    line or the next ``Name:`` line)."""
    lines = (inspect.getdoc(func) or "").splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"{field}:"):
            parts = [line[len(field) + 1 :].strip()]
            for more in lines[i + 1 :]:
                if not more.strip() or re.match(r"^[A-Z][A-Za-z ]{0,20}:\s", more):
                    break
                parts.append(more.strip())
            return " ".join(p for p in parts if p) or None
    return None


def stage_of(kind: str, backend: str, target: str) -> str:
    """The stage title (``"Stage N: ..."``) that applies a workaround of ``kind`` for ``backend``; for
    the ``"load"`` scopes, the loader that applies it (``load.pt2``: ``load_exported_program``)."""
    root = backend.split(".")[0]
    if root == "dynamo":
        return {"patch": "Stage 2: Model patches"}.get(kind, f"unused ({kind})")
    if root == "onnx":
        if kind == "patch":
            return "Stage 2: ONNX patches" if target.startswith("torch.onnx.") else "Stage 1: Torch patches"
        return {
            "fx_node_fix": "Stage 3: FX node fixes",
            "onnx_translation": "Stage 4: ONNX translations",
            "onnx_ir_fix": "Stage 5: ONNX IR fixes",
        }.get(kind, f"unused ({kind})")
    if root == "executorch":
        if kind == "patch":
            return "Stage 3: ExecuTorch patches" if target.startswith("executorch.") else "Stage 2: Torch patches"
        return {
            "backend_prepare": "Stage 1: Backend preparation",
            "fx_program_fix": "Stage 4: FX program fixes",
            "fx_node_fix": "Stage 5: FX node fixes",
        }.get(kind, f"unused ({kind})")
    if root == "load":
        return {"patch": "Loading: torch.export.load"}.get(kind, f"unused ({kind})")
    return f"unused ({kind})"


_REGISTRY: list[Workaround] = []
_ONNX_TRANSLATIONS: dict[str, list[tuple[Any, Callable[..., Any]]]] = {}
_BACKEND_PREPARE: dict[str, Callable[..., Any]] = {}
_LOCK = threading.RLock()
_WARNED_PATHS: set[str] = set()


def _scopes(backend: str) -> list[str]:
    """``"executorch.xnnpack"`` -> ``["executorch", "executorch.xnnpack"]``."""
    parts = backend.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _select(kind: str, backend: str) -> list[Workaround]:
    scopes = set(_scopes(backend))
    return [w for w in _REGISTRY if w.kind == kind and w.backend in scopes]


def list_workarounds(backend: str | None = None) -> list[Workaround]:
    """Every registered workaround (for ``backend`` and its parent scopes when given), in registration order.

    Importing :mod:`hf_exporters` registers the built-in ones.
    """
    if backend is None:
        return list(_REGISTRY)
    scopes = set(_scopes(backend))
    return [w for w in _REGISTRY if w.backend in scopes]


@contextlib.contextmanager
def export_lock() -> Iterator[None]:
    """Hold the process-wide lock that serialises patched regions across threads (re-entrant)."""
    with _LOCK:
        yield


# ── Patches ──────────────────────────────────────────────────────────────────


def register_patch(
    backend: str, *dotted_paths: str, loaded_only: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``factory(original) -> replacement`` for every path in ``dotted_paths``.

    A path names a model class method (``transformers.models.bert.modeling_bert.BertModel.forward``),
    a module function (``transformers.masking_utils.sdpa_mask``) or a torch op (``torch.where``,
    ``torch.nn.functional.pad``, ``torch.Tensor.unsqueeze``). The last segment is the attribute that
    is swapped; what precedes it is imported (modules) or looked up (classes) when the patch is
    applied, not when it is registered.

    ``loaded_only=True`` suits one patch over the same method of many model families: a path is then
    installed only when its modeling module is already imported (the model being exported has loaded
    its own), so an export never imports the other families' modeling files. Such paths are skipped
    silently when their module is not loaded.

    A module path may also name a builtin as its code sees it (``transformers.models.bert.modeling_bert.len``):
    the replacement is then set as a module global that shadows the builtin for that module's code
    only, and is deleted afterwards. The owner of a path may hold ``*`` wildcards
    (``transformers.models.*.modeling_*.len``): the path then stands for every module already
    loaded when :func:`apply_patches` starts whose name matches (``*`` matches within one dotted
    segment, so ``models.*.modeling_*`` does not reach ``models.deprecated.x.modeling_x``), and
    implies ``loaded_only``. A wildcard owner names modules only, never a class: a module without
    the attribute is passed over silently.

    Raises:
        ValueError: no path given, a path without a dot, or a wildcard in the attribute.
    """
    if not dotted_paths:
        raise ValueError("register_patch needs at least one dotted path")
    for path in dotted_paths:
        if "." not in path:
            raise ValueError(f"register_patch: {path!r} is not a dotted path (owner.attribute)")
        if "*" in path.rpartition(".")[2]:
            raise ValueError(f"register_patch: {path!r} has a wildcard in its attribute; only the owner may hold one")

    def decorator(factory: Callable[..., Any]) -> Callable[..., Any]:
        for path in dotted_paths:
            _REGISTRY.append(Workaround("patch", backend, path, factory, loaded_only or "*" in path))
        return factory

    return decorator


def resolve_dotted_path(path: str) -> Any:
    """The object a dotted path names, importing modules along the way.

    Raises:
        ImportError: the leading module cannot be imported.
        AttributeError: a later segment does not exist.
    """
    parts = path.split(".")
    obj: Any = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if inspect.ismodule(obj):
            qualified = ".".join(parts[: i + 1])
            try:
                obj = importlib.import_module(qualified)
                continue
            except ModuleNotFoundError as error:
                if error.name != qualified:  # the submodule exists but one of its own imports failed
                    raise
        obj = getattr(obj, part)
    return obj


class _Installed:
    """One swapped attribute and what restores it."""

    __slots__ = ("owner", "attribute", "had_own", "own_value")

    def __init__(self, owner: Any, attribute: str):
        self.owner = owner
        self.attribute = attribute
        own = vars(owner) if hasattr(owner, "__dict__") else {}
        self.had_own = attribute in own
        self.own_value = own.get(attribute)

    def restore(self) -> None:
        if self.had_own:
            setattr(self.owner, self.attribute, self.own_value)
        else:
            delattr(self.owner, self.attribute)


def _module_loaded(path: str) -> bool:
    """Whether the module that holds ``path``'s owner is imported, without importing anything: the
    owner itself for a module function, the module that defines the class for a method (a package
    imported for its configuration alone does not count)."""
    owner = path.rpartition(".")[0]
    if owner in sys.modules:
        return True
    module, _, name = owner.rpartition(".")
    return module in sys.modules and inspect.isclass(vars(sys.modules[module]).get(name))


def _loaded_matches(path: str) -> list[str]:
    """The paths a wildcard ``path`` stands for: one per loaded module whose name matches its owner."""
    owner, _, attribute = path.rpartition(".")
    pattern = re.compile("".join("[^.]*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", owner)))
    return [f"{name}.{attribute}" for name in sorted(sys.modules) if pattern.fullmatch(name)]


def _install(path: str, factory: Callable[..., Any]) -> _Installed | None:
    owner_path, _, attribute = path.rpartition(".")
    try:
        owner = sys.modules.get(owner_path) or resolve_dotted_path(owner_path)
        try:
            original = getattr(owner, attribute)
        except AttributeError:
            if not (inspect.ismodule(owner) and hasattr(builtins, attribute)):
                raise
            original = getattr(builtins, attribute)  # a builtin as this module's code sees it
    except (ImportError, AttributeError):
        if path not in _WARNED_PATHS:
            _WARNED_PATHS.add(path)
            warnings.warn(
                f"patch path {path!r} does not resolve in the installed versions; the patch is skipped",
                UnresolvedPatchWarning,
                stacklevel=4,
            )
        return None
    installed = _Installed(owner, attribute)
    replacement = factory(original)
    if inspect.isclass(owner):
        raw = inspect.getattr_static(owner, attribute)
        if isinstance(raw, staticmethod):
            replacement = staticmethod(replacement)
        elif isinstance(raw, classmethod):
            replacement = classmethod(replacement)
    setattr(owner, attribute, replacement)
    return installed


@contextlib.contextmanager
def apply_patches(backend: str, select: Callable[[str], bool] | None = None) -> Iterator[list[str]]:
    """Install every patch registered for ``backend`` (and its parent scopes) while the block runs.

    Yields the list of installed paths. Originals are restored in reverse order when the block
    ends, raises, or is interrupted (``KeyboardInterrupt`` included). A path that does not resolve
    in the installed versions is skipped with one :class:`UnresolvedPatchWarning` naming it.
    ``select``, when given, keeps only the paths for which it returns True (an exporter uses it to
    apply torch-op patches and backend-internal patches at different stages).

    Holds the process-wide :func:`export_lock` for the whole block.
    """
    with _LOCK:
        installed: list[_Installed] = []
        try:
            for workaround in _select("patch", backend):
                if select is not None and not select(workaround.target):
                    continue
                if "*" in workaround.target:
                    attribute = workaround.target.rpartition(".")[2]
                    for path in _loaded_matches(workaround.target):
                        module = sys.modules.get(path.rpartition(".")[0])
                        if not inspect.ismodule(module) or not (hasattr(module, attribute) or hasattr(builtins, attribute)):
                            continue  # a placeholder entry, or a module without the attribute: nothing to patch
                        done = _install(path, workaround.func)
                        if done is not None:
                            installed.append(done)
                    continue
                if workaround.loaded_only and not _module_loaded(workaround.target):
                    continue
                done = _install(workaround.target, workaround.func)
                if done is not None:
                    installed.append(done)
            yield [f"{getattr(i.owner, '__name__', type(i.owner).__name__)}.{i.attribute}" for i in installed]
        finally:
            for item in reversed(installed):
                item.restore()


# ── FX fixes ─────────────────────────────────────────────────────────────────


def register_fx_node_fix(backend: str) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    """Register ``fix(graph_module, node) -> bool`` for ``backend``.

    The fix is offered every ``call_function`` node of every graph (nested subgraphs included);
    it returns True when it consumed the node (replaced or erased it), which stops later fixes from
    seeing that node.
    """

    def decorator(fix: Callable[..., bool]) -> Callable[..., bool]:
        _REGISTRY.append(Workaround("fx_node_fix", backend, fix.__name__, fix))
        return fix

    return decorator


def register_fx_program_fix(backend: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register ``fix(exported_program) -> None`` for ``backend``: a repair that needs the whole program
    (range constraints, the graph signature, the state dict)."""

    def decorator(fix: Callable[..., None]) -> Callable[..., None]:
        _REGISTRY.append(Workaround("fx_program_fix", backend, fix.__name__, fix))
        return fix

    return decorator


def _graph_modules(root: Any) -> list[Any]:
    import torch.fx

    return [m for m in root.modules() if isinstance(m, torch.fx.GraphModule)]


def apply_fx_node_fixes(backend: str, graph_module: Any) -> int:
    """Offer every ``call_function`` node of ``graph_module`` and its nested subgraphs to the fixes
    registered for ``backend``, then eliminate dead code and recompile each graph.

    Returns the number of nodes a fix consumed.
    """
    fixes = [w.func for w in _select("fx_node_fix", backend)]
    consumed = 0
    for gm in _graph_modules(graph_module):
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.graph is not gm.graph or getattr(node, "_erased", False):
                continue  # a node an earlier fix erased is not offered
            for fix in fixes:
                if fix(gm, node):
                    consumed += 1
                    break
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return consumed


def apply_fx_program_fixes(backend: str, exported_program: Any) -> int:
    """Run every program fix registered for ``backend`` on ``exported_program`` (in place).

    Returns how many fixes ran."""
    fixes = [w.func for w in _select("fx_program_fix", backend)]
    for fix in fixes:
        fix(exported_program)
    return len(fixes)


# ── ONNX tables ──────────────────────────────────────────────────────────────


def register_onnx_translation(*aten_ops: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register an onnxscript function as the ONNX translation of each aten op overload.

    Ops are named as ``"aten::index_put.default"``; they are resolved to ``torch.ops`` overloads when
    the table is built (:func:`onnx_translation_table`). ``"_operator::floordiv"`` names a Python
    operator on sizes (``operator.floordiv``), as torch.onnx keys them.
    """

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        for op in aten_ops:
            _REGISTRY.append(Workaround("onnx_translation", "onnx", op, func))
        return func

    return decorator


def onnx_translation_table() -> dict[Any, Callable[..., Any] | list[Callable[..., Any]]]:
    """torch.onnx's ``custom_translation_table``: ``{torch op overload: onnxscript function(s)}``.

    Several functions for one op are passed as a list: torch.onnx dispatches on input types.
    """
    import torch

    table: dict[Any, list[Callable[..., Any]]] = {}
    for workaround in _select("onnx_translation", "onnx"):
        namespace, _, rest = workaround.target.partition("::")
        name, _, overload = rest.partition(".")
        try:
            if namespace == "_operator":
                op = getattr(operator, name)
            else:
                op = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
        except (AttributeError, RuntimeError):
            continue  # the op's library is not loaded, so no traced node can use it
        table.setdefault(op, []).append(workaround.func)
    return {op: funcs[0] if len(funcs) == 1 else funcs for op, funcs in table.items()}


def register_onnx_ir_fix(func: Callable[..., int]) -> Callable[..., int]:
    """Register ``fix(graph_or_function) -> int`` (the number of nodes it changed), run on the main
    graph and every function of the finished ``onnx_ir`` model."""
    _REGISTRY.append(Workaround("onnx_ir_fix", "onnx", func.__name__, func))
    return func


def onnx_ir_fixes() -> list[Callable[..., int]]:
    """The registered ONNX IR fixes, in registration order."""
    return [w.func for w in _select("onnx_ir_fix", "onnx")]


# ── ExecuTorch backend preparation ───────────────────────────────────────────


def register_executorch_backend(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``prepare(model, inputs) -> (model, inputs, partitioners)`` for ExecuTorch backend ``name``."""

    def decorator(prepare: Callable[..., Any]) -> Callable[..., Any]:
        _BACKEND_PREPARE[name] = prepare
        _REGISTRY.append(Workaround("backend_prepare", f"executorch.{name}", name, prepare))
        return prepare

    return decorator


def executorch_backends() -> dict[str, Callable[..., Any]]:
    """``{backend name: prepare function}`` for every registered ExecuTorch backend."""
    return dict(_BACKEND_PREPARE)
