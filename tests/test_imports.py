"""The package's import structure, read from the source (nothing is imported).

- The graph of module-level imports between modules of ``hf_exporters`` has no cycle: a layer that
  needs a lower one imports it at the top of the file.
- Nor has the graph of every import, function-local ones included: no import hides inside a function
  to dodge a cycle (a function-local import is for deferring a heavy or optional library).
- No module imports a private name (``_x``) from another module of the package: what one module
  uses of another is that module's public interface. A private *module* (``exporters/_common.py``)
  may be imported from inside its own package.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "hf_exporters"
ROOT = Path(__file__).resolve().parents[1] / "src" / PACKAGE


def _modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package (``__init__`` for packages)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _base(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative levels resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    package = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: top-level statements and those in module-level
    ``if``/``try``/``with`` blocks, without ``if TYPE_CHECKING:`` blocks, functions or classes."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += _module_level(node.body)
            found += _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                found += _module_level(block)
        elif isinstance(node, ast.With):
            found += _module_level(node.body)
    return found


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """``(module of the package imported, name taken from it or None)`` for each name ``node`` imports."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names if alias.name in MODULES]
    base = _base(module, node)
    if base not in MODULES:
        return []
    out: list[tuple[str, str | None]] = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.append((sub, None) if sub in MODULES else (base, alias.name))
    return out


def _trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def import_graph(function_local: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports at module level (with ``function_local``: anywhere)."""
    graph: dict[str, set[str]] = {}
    for module, tree in _trees().items():
        nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))] if function_local else _module_level(tree.body)
        graph[module] = {target for node in nodes for target, _ in _targets(module, node) if target != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for succ in sorted(graph.get(node, ())):
            if state.get(succ) == 1:
                return path[path.index(succ) :] + [succ]
            if succ not in state:
                found = visit(succ)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


#: prefixes of registered workaround functions (required by tests/test_docs.py): a workaround two
#: backends need is one function that each backend's module imports and registers (docs/extending.md)
WORKAROUND_PREFIXES = ("_patch_", "_fix_", "_aten_")

#: private names other modules still import, each awaiting its owner's change (make the name public,
#: or move it to a module both use); entries are ``(importing module, name, defining module)``. Do not
#: add to this list: a name another module needs is part of that module's interface.
KNOWN_PRIVATE_IMPORTS = {
    ("hf_exporters.sweep.job", "_resize", "hf_exporters.runtime.compare"),
    ("hf_exporters.sweep.job", "_shapes", "hf_exporters.runtime.compare"),
    ("hf_exporters.workarounds.dynamo.audio", "_packed_positions", "hf_exporters.workarounds._packing"),
    ("hf_exporters.workarounds.dynamo.vision", "_packed_positions", "hf_exporters.workarounds._packing"),
}


def _allowed(module: str, name: str, target: str) -> bool:
    if (module, name, target) in KNOWN_PRIVATE_IMPORTS:
        return True
    workarounds = f"{PACKAGE}.workarounds."
    return module.startswith(workarounds) and target.startswith(workarounds) and name.startswith(WORKAROUND_PREFIXES)


def private_imports() -> list[str]:
    """``file:line: module imports _name from other`` for every import (module-level or not) of a
    private name defined in another module of the package."""
    found = []
    for module, tree in _trees().items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target, name in _targets(module, node):
                if (
                    name
                    and name.startswith("_")
                    and not name.startswith("__")
                    and target != module
                    and not _allowed(module, name, target)
                ):
                    found.append(f"{MODULES[module].relative_to(ROOT.parent)}:{node.lineno}: {module} imports {name} from {target}")
    return found


def test_the_module_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert "hf_exporters.pipeline" in graph and "hf_exporters.errors" in graph["hf_exporters.pipeline"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_function_local_import_hides_a_cycle() -> None:
    cycle = find_cycle(import_graph(function_local=True))
    assert cycle is None, "import cycle through a function-local import: " + " -> ".join(cycle or [])


def test_no_module_imports_a_private_name_of_another() -> None:
    found = private_imports()
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_the_checks_see_a_cycle_and_resolve_relative_imports() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    node = ast.parse("from ..errors import InputError").body[0]
    assert _targets("hf_exporters.exporters.dynamo", node) == [("hf_exporters.errors", "InputError")]
    node = ast.parse("from . import registry").body[0]
    assert _targets("hf_exporters", node) == [("hf_exporters.registry", None)]
