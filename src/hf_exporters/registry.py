"""The one registry of export workarounds.

A workaround is either

* a **patch**: reversible. ``register_patch(backend, *dotted_paths)`` decorates a factory
  ``factory(original) -> replacement``; :func:`apply_patches` swaps each path's attribute for the
  replacement while a block runs and restores the original afterwards, whatever happens in the block;
* a **fix**: a rewrite of the traced program, not reverted. ``register_fx_node_fix(backend)``
  registers ``fix(graph_module, node) -> bool``; ``register_fx_program_fix(backend)`` registers
  ``fix(exported_program) -> bool | None`` (False: the program needed nothing).

Backend-specific tables live here too: ONNX translations (aten op -> onnxscript function, passed as
torch.onnx's custom translation table), ONNX IR fixes (rewrites on the finished ``onnx_ir`` model)
and ExecuTorch backend preparers (``prepare_for_<name>(model, inputs) -> (model, inputs,
partitioners)``).

Backends are dotted scopes: a patch registered for ``"executorch"`` is applied by
``apply_patches("executorch.xnnpack")`` too; one registered for ``"executorch.xnnpack"`` only there.

Every workaround is applied in one exporter stage, declared when it is registered and kept on its
:class:`Workaround` (``stage``): ``register_patch(..., stage="Stage 2: ONNX patches")``, or, where the
backend's exporter applies that kind of workaround in one stage only, that stage. :data:`STAGES` lists
the stages of each backend. ``hf-exporters patches`` shows that stage, and the exporters select what a
stage applies by it (``apply_patches("onnx", stage="Stage 2: ONNX patches")``).

Every workaround's docstring names the upstream report it works around (a line ``Upstream: ...``)
and when it can go (a line ``Remove when: ...``); ``hf-exporters patches`` lists both, and a test
refuses a workaround without them.

What fired: :func:`recording_fired` collects, for one export, the workarounds that acted: a patch
whose replacement was called, an FX node fix that consumed a node, a program fix that changed the
program (or did not say), and what the exporters report through :func:`record_fired` (ONNX IR fixes
that changed nodes, translations whose op the lowered graph holds).

Thread safety: patches swap process-wide attributes (``torch.where``, a model class's method), so
two exports in different threads would see each other's patches. :func:`export_lock` is one
process-wide re-entrant lock; :func:`apply_patches` holds it for its whole block, and the exporters
hold it for a whole export, so exports in concurrent threads run their patched regions one at a time.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import functools
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
    "STAGES",
    "UnresolvedPatchWarning",
    "Workaround",
    "apply_fx_node_fixes",
    "apply_fx_program_fixes",
    "apply_patches",
    "export_lock",
    "list_workarounds",
    "record_fired",
    "recording_fired",
    "models_line_names",
    "register_executorch_backend",
    "register_fx_node_fix",
    "register_fx_program_fix",
    "register_onnx_ir_fix",
    "register_onnx_translation",
    "register_patch",
    "resolve_dotted_path",
    "resolve_stage",
]


class UnresolvedPatchWarning(UserWarning):
    """A registered patch path does not exist in the installed library versions; the patch is skipped."""


#: The exporter stages that apply workarounds, by backend root, each with the kinds of workaround it
#: applies. Titles are those of the exporters' ``# ── Stage N: Title ──`` blocks and of
#: docs/extending.md; ``"load"`` is :func:`~hf_exporters.exporters.dynamo.load_exported_program`.
STAGES: dict[str, dict[str, tuple[str, ...]]] = {
    "dynamo": {
        "Stage 2: Model patches": ("patch",),
    },
    "onnx": {
        "Stage 1: Torch patches": ("patch",),
        "Stage 2: ONNX patches": ("patch",),
        "Stage 3: FX node fixes": ("fx_node_fix",),
        "Stage 4: ONNX translations": ("onnx_translation",),
        "Stage 5: ONNX IR fixes": ("onnx_ir_fix",),
    },
    "executorch": {
        "Stage 1: Backend preparation": ("backend_prepare",),
        "Stage 2: Torch patches": ("patch",),
        "Stage 3: ExecuTorch patches": ("patch",),
        "Stage 4: FX program fixes": ("fx_program_fix",),
        "Stage 5: FX node fixes": ("fx_node_fix",),
    },
    "load": {
        "Loading: torch.export.load": ("patch",),
    },
}


def resolve_stage(kind: str, backend: str, stage: str | None = None) -> str:
    """The stage that applies a workaround of ``kind`` registered for ``backend``: ``stage`` when
    given, else the one stage of the backend's exporter that applies that kind (:data:`STAGES`).

    A backend outside :data:`STAGES` (a test's own scope) takes ``stage`` as given, or
    ``"unused (<kind>)"``: no exporter applies it.

    Raises:
        ValueError: ``stage`` is not a stage of the backend that applies ``kind``, or no ``stage`` is
            given and the backend applies ``kind`` in several stages (or in none).
    """
    stages = STAGES.get(backend.split(".")[0])
    if stages is None:
        return stage if stage is not None else f"unused ({kind})"
    applying = [title for title, kinds in stages.items() if kind in kinds]
    if stage is not None:
        if stage not in applying:
            raise ValueError(
                f"{stage!r} is not a stage of backend {backend!r} that applies a {kind}; its stages that do: "
                + (", ".join(repr(t) for t in applying) or "none")
            )
        return stage
    if len(applying) != 1:
        raise ValueError(
            f"backend {backend!r} applies a {kind} in "
            + (f"{len(applying)} stages ({', '.join(repr(t) for t in applying)}); pass stage=" if applying else "no stage")
        )
    return applying[0]


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
        stage: the exporter stage that applies it, as titled in ``docs/extending.md``; declared at
            registration (or the backend's one stage for this kind, see :func:`resolve_stage`).
    """

    kind: str
    backend: str
    target: str
    func: Callable[..., Any]
    loaded_only: bool = False
    stage: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage", resolve_stage(self.kind, self.backend, self.stage))

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
    def models(self) -> str | None:
        """The ``Models:`` line of the docstring (``Known to hit:`` in older ones): the model classes
        known to need this workaround, or None."""
        return _doc_field(self.func, "Models") or _doc_field(self.func, "Known to hit")

    def names_model(self, model_class: str) -> bool:
        """Whether the ``Models:`` line names ``model_class`` (see :func:`models_line_names`)."""
        return models_line_names(self.models, model_class)


#: a class name's head, cut off to get its family: ``BertForMaskedLM`` -> ``Bert``, ``GPT2LMHeadModel`` -> ``GPT2``
_HEAD = re.compile(r"(For[A-Z]\w*|LMHeadModel|Model)$")
#: what may follow a family's name in the name of one of its sub-models (``Qwen3VLVisionModel``)
_PARTS = ("vision", "text", "audio", "speech", "encoder", "decoder")
#: first words of a ``Models:`` line that is about every model (``every model exported with ...``)
_UNIVERSAL = ("every", "all", "any")


def _name_key(name: str) -> str:
    """``name`` lowercased without ``-``, ``_``, ``.`` (``Qwen2.5-VL`` and ``Qwen2_5_VL`` -> ``qwen25vl``)."""
    return re.sub(r"[^0-9a-z]", "", name.lower())


def _family_key(name: str) -> str:
    """The key of ``name`` without its head (``Qwen2_5_VLForConditionalGeneration`` -> ``qwen25vl``)."""
    return _name_key(_HEAD.sub("", name) or name)


def models_line_names(models: str | None, model_class: str) -> bool:
    """Whether a docstring's ``Models:`` line (``models``) names the model class ``model_class``.

    The line is cut into names at spaces, commas, semicolons, colons, slashes and parentheses
    (backticks, a final ``.`` and a possessive ``'s`` dropped); names compare without case and
    without ``-``, ``_`` and ``.``. A name matches when it is ``model_class``; or when it names the
    class's family, the class name without its head (``Model``, ``LMHeadModel``, ``For...``): ``Bert``
    or ``BertModel`` for ``BertForMaskedLM``, ``Qwen2.5-VL`` for ``Qwen2_5_VLForConditionalGeneration``;
    or one of the family's sub-models, the family followed by ``Vision``, ``Text``, ``Audio``,
    ``Speech``, ``Encoder`` or ``Decoder`` (``Kimi_K25VisionModel`` for
    ``Kimi_K25ForConditionalGeneration``). A line whose first word is ``every``, ``all`` or ``any``
    (``every model exported with dynamic=True``) names every class.
    """
    if not models:
        return False
    names = [re.sub(r"(\.|'s)+$", "", name) for name in re.split(r"[\s,;:/()]+", models.replace("`", "")) if name]
    names = [name for name in names if name.strip("-.")]
    if names and names[0].lower() in _UNIVERSAL:
        return True
    exact, family = _name_key(model_class), _family_key(model_class)
    for name in names:
        key, its_family = _name_key(name), _family_key(name)
        if key == exact or (family and its_family == family):
            return True
        if family and its_family.startswith(family) and its_family[len(family) :].startswith(_PARTS):
            return True
    return False


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


_REGISTRY: list[Workaround] = []
_ONNX_TRANSLATIONS: dict[str, list[tuple[Any, Callable[..., Any]]]] = {}
_BACKEND_PREPARE: dict[str, Callable[..., Any]] = {}
_LOCK = threading.RLock()
_WARNED_PATHS: set[str] = set()


def _scopes(backend: str) -> list[str]:
    """``"executorch.xnnpack"`` -> ``["executorch", "executorch.xnnpack"]``."""
    parts = backend.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _check_stage(backend: str, stage: str | None) -> None:
    """Refuse a ``stage`` that the backend's exporter does not have (a typo would select nothing)."""
    stages = STAGES.get(backend.split(".")[0])
    if stage is not None and stages is not None and stage not in stages:
        raise ValueError(f"backend {backend!r} has no stage {stage!r}; its stages: {', '.join(repr(t) for t in stages)}")


def _select(kind: str, backend: str, stage: str | None = None) -> list[Workaround]:
    """The workarounds of ``kind`` registered for ``backend`` or a parent scope (and declared for
    ``stage`` when given), in registration order: what an exporter applies."""
    _check_stage(backend, stage)
    scopes = set(_scopes(backend))
    return [w for w in _REGISTRY if w.kind == kind and w.backend in scopes and (stage is None or w.stage == stage)]


def list_workarounds(backend: str | None = None, stage: str | None = None) -> list[Workaround]:
    """Every registered workaround (for ``backend`` and its parent scopes when given; declared for
    ``stage`` when given), in registration order.

    Importing :mod:`hf_exporters` registers the built-in ones.
    """
    if backend is not None:
        _check_stage(backend, stage)
    scopes = set(_scopes(backend)) if backend is not None else None
    return [w for w in _REGISTRY if (scopes is None or w.backend in scopes) and (stage is None or w.stage == stage)]


@contextlib.contextmanager
def export_lock() -> Iterator[None]:
    """Hold the process-wide lock that serialises patched regions across threads (re-entrant)."""
    with _LOCK:
        yield


# ── What fired ───────────────────────────────────────────────────────────────

#: the open :func:`recording_fired` lists, outermost first (an export nested in another records in both)
_RECORDERS: list[list[Workaround]] = []


@contextlib.contextmanager
def recording_fired() -> Iterator[list[Workaround]]:
    """Collect the workarounds that act while the block runs, in the order they first act (each once).

    Yields the list, filled as the block runs: patches whose replacement was called, FX node fixes
    that consumed a node, program fixes that changed the program (or returned None), and whatever the
    exporters pass to :func:`record_fired`. Blocks nest: a workaround is recorded in every open one.
    A replacement called while TorchDynamo traces it (``strict=True``) is not recorded.
    """
    fired: list[Workaround] = []
    _RECORDERS.append(fired)
    try:
        yield fired
    finally:
        for index in range(len(_RECORDERS) - 1, -1, -1):
            if _RECORDERS[index] is fired:
                del _RECORDERS[index]
                break


def record_fired(workaround: Workaround) -> None:
    """Record ``workaround`` as having acted, in every open :func:`recording_fired` block."""
    for fired in _RECORDERS:
        if not any(w is workaround for w in fired):
            fired.append(workaround)


def _dynamo_tracing() -> bool:
    import torch

    return torch.compiler.is_dynamo_compiling()


def _recorded(replacement: Any, workaround: Workaround) -> Any:
    """``replacement`` (a patch's) wrapped so that a call records ``workaround``; a ``staticmethod`` or
    ``classmethod`` is wrapped inside and rewrapped; any other replacement that is not a plain function
    (a class, a property, a constant) is returned as it is."""
    if isinstance(replacement, (staticmethod, classmethod)):
        return type(replacement)(_recorded(replacement.__func__, workaround))
    if not inspect.isfunction(replacement):
        return replacement

    @functools.wraps(replacement)
    def called(*args: Any, **kwargs: Any) -> Any:
        if _RECORDERS and not _dynamo_tracing():
            record_fired(workaround)
        return replacement(*args, **kwargs)

    return called


# ── Patches ──────────────────────────────────────────────────────────────────


def register_patch(
    backend: str, *dotted_paths: str, stage: str | None = None, loaded_only: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``factory(original) -> replacement`` for every path in ``dotted_paths``, applied in
    ``stage`` of the backend's exporter.

    ``stage`` is a title of :data:`STAGES` (``"Stage 1: Torch patches"``, ``"Stage 2: ONNX patches"``);
    it may be left out where the backend applies patches in one stage only (``dynamo``, ``load``).

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
        ValueError: no path given, a path without a dot, a wildcard in the attribute, or a ``stage``
            that is not one of the backend's patch stages (or none given where it has several).
    """
    stage = resolve_stage("patch", backend, stage)
    if not dotted_paths:
        raise ValueError("register_patch needs at least one dotted path")
    for path in dotted_paths:
        if "." not in path:
            raise ValueError(f"register_patch: {path!r} is not a dotted path (owner.attribute)")
        if "*" in path.rpartition(".")[2]:
            raise ValueError(f"register_patch: {path!r} has a wildcard in its attribute; only the owner may hold one")

    def decorator(factory: Callable[..., Any]) -> Callable[..., Any]:
        for path in dotted_paths:
            _REGISTRY.append(Workaround("patch", backend, path, factory, loaded_only or "*" in path, stage))
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


def _install(path: str, workaround: Workaround) -> _Installed | None:
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
    replacement = _recorded(workaround.func(original), workaround)
    if inspect.isclass(owner):
        raw = inspect.getattr_static(owner, attribute)
        if isinstance(raw, staticmethod):
            replacement = staticmethod(replacement)
        elif isinstance(raw, classmethod):
            replacement = classmethod(replacement)
    setattr(owner, attribute, replacement)
    return installed


@contextlib.contextmanager
def apply_patches(
    backend: str, select: Callable[[str], bool] | None = None, *, stage: str | None = None
) -> Iterator[list[str]]:
    """Install every patch registered for ``backend`` (and its parent scopes) while the block runs;
    with ``stage``, only those declared for that stage (an exporter applies each stage's patches in
    that stage).

    Yields the list of installed paths. Originals are restored in reverse order when the block
    ends, raises, or is interrupted (``KeyboardInterrupt`` included). A path that does not resolve
    in the installed versions is skipped with one :class:`UnresolvedPatchWarning` naming it.
    ``select``, when given, keeps only the paths for which it returns True.

    Holds the process-wide :func:`export_lock` for the whole block.

    Raises:
        ValueError: ``stage`` is not a stage of the backend's exporter.
    """
    with _LOCK:
        installed: list[_Installed] = []
        try:
            for workaround in _select("patch", backend, stage):
                if select is not None and not select(workaround.target):
                    continue
                if "*" in workaround.target:
                    attribute = workaround.target.rpartition(".")[2]
                    for path in _loaded_matches(workaround.target):
                        module = sys.modules.get(path.rpartition(".")[0])
                        if not inspect.ismodule(module) or not (hasattr(module, attribute) or hasattr(builtins, attribute)):
                            continue  # a placeholder entry, or a module without the attribute: nothing to patch
                        done = _install(path, workaround)
                        if done is not None:
                            installed.append(done)
                    continue
                if workaround.loaded_only and not _module_loaded(workaround.target):
                    continue
                done = _install(workaround.target, workaround)
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
    """Register ``fix(exported_program) -> bool | None`` for ``backend``: a repair that needs the whole
    program (range constraints, the graph signature, the state dict). It returns False when it left
    the program as it was, True when it changed it (None counts as changed: it is recorded as fired)."""

    def decorator(fix: Callable[..., None]) -> Callable[..., None]:
        _REGISTRY.append(Workaround("fx_program_fix", backend, fix.__name__, fix))
        return fix

    return decorator


def _graph_modules(root: Any) -> list[Any]:
    import torch.fx

    return [m for m in root.modules() if isinstance(m, torch.fx.GraphModule)]


def apply_fx_node_fixes(backend: str, graph_module: Any, stage: str | None = None) -> int:
    """Offer every ``call_function`` node of ``graph_module`` and its nested subgraphs to the fixes
    registered for ``backend`` (declared for ``stage`` when given), then eliminate dead code and
    recompile each graph.

    Returns the number of nodes a fix consumed; a fix that consumed one is recorded as fired
    (:func:`recording_fired`).
    """
    fixes = _select("fx_node_fix", backend, stage)
    consumed = 0
    for gm in _graph_modules(graph_module):
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.graph is not gm.graph or getattr(node, "_erased", False):
                continue  # a node an earlier fix erased is not offered
            for fix in fixes:
                if fix.func(gm, node):
                    consumed += 1
                    record_fired(fix)
                    break
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return consumed


def apply_fx_program_fixes(backend: str, exported_program: Any, stage: str | None = None) -> int:
    """Run every program fix registered for ``backend`` (declared for ``stage`` when given) on
    ``exported_program`` (in place).

    Returns how many fixes ran. A fix that did not return False is recorded as fired
    (:func:`recording_fired`)."""
    fixes = _select("fx_program_fix", backend, stage)
    for fix in fixes:
        if fix.func(exported_program) is not False:
            record_fired(fix)
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


def onnx_translations(stage: str | None = None) -> list[tuple[Any, Workaround]]:
    """``(torch op overload, its translation's Workaround)`` for every ONNX translation declared for
    ``stage`` (when given) whose op resolves in the loaded libraries, in registration order."""
    import torch

    found = []
    for workaround in _select("onnx_translation", "onnx", stage):
        namespace, _, rest = workaround.target.partition("::")
        name, _, overload = rest.partition(".")
        try:
            if namespace == "_operator":
                op = getattr(operator, name)
            else:
                op = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
        except (AttributeError, RuntimeError):
            continue  # the op's library is not loaded, so no traced node can use it
        found.append((op, workaround))
    return found


def onnx_translation_table(stage: str | None = None) -> dict[Any, Callable[..., Any] | list[Callable[..., Any]]]:
    """torch.onnx's ``custom_translation_table``: ``{torch op overload: onnxscript function(s)}``, of
    the translations declared for ``stage`` when given.

    Several functions for one op are passed as a list: torch.onnx dispatches on input types.
    """
    table: dict[Any, list[Callable[..., Any]]] = {}
    for op, workaround in onnx_translations(stage):
        table.setdefault(op, []).append(workaround.func)
    return {op: funcs[0] if len(funcs) == 1 else funcs for op, funcs in table.items()}


def register_onnx_ir_fix(func: Callable[..., int]) -> Callable[..., int]:
    """Register ``fix(graph_or_function) -> int`` (the number of nodes it changed), run on the main
    graph and every function of the finished ``onnx_ir`` model."""
    _REGISTRY.append(Workaround("onnx_ir_fix", "onnx", func.__name__, func))
    return func


def onnx_ir_fixes(stage: str | None = None) -> list[Workaround]:
    """The registered ONNX IR fixes (declared for ``stage`` when given), in registration order; each
    one's ``func`` is the fix."""
    return _select("onnx_ir_fix", "onnx", stage)


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
