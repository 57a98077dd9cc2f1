"""The registry's promises: install and restore, multi-path factories, torch-op paths, unresolved
paths, scopes, interrupts, threads, FX node fixes over nested subgraphs, program fixes."""

import re
import threading
import time
import warnings

import _patch_targets as targets
import pytest
import torch

from hf_exporters import registry
from hf_exporters.registry import (
    UnresolvedPatchWarning,
    apply_fx_node_fixes,
    apply_fx_program_fixes,
    apply_patches,
    register_fx_node_fix,
    register_fx_program_fix,
    register_patch,
)

T = "_patch_targets"


@pytest.fixture
def clean_registry():
    before = list(registry._REGISTRY)
    yield
    registry._REGISTRY[:] = before


def test_patch_installed_inside_and_restored_after(clean_registry):
    original = targets.greet
    register_patch("t.basic", f"{T}.greet")(lambda orig: lambda name: orig(name).upper())
    with apply_patches("t.basic") as installed:
        assert targets.greet("x") == "HELLO X"
        assert installed == [f"{T}.greet"]
    assert targets.greet is original


def test_restored_when_the_block_raises(clean_registry):
    original = Speaker_say = targets.Speaker.say
    register_patch("t.raise", f"{T}.Speaker.say")(lambda orig: lambda self, w: "patched")
    with pytest.raises(RuntimeError, match="boom"):
        with apply_patches("t.raise"):
            assert targets.Speaker().say("a") == "patched"
            raise RuntimeError("boom")
    assert targets.Speaker.say is original is Speaker_say
    assert targets.Speaker().say("a") == "a"


def test_restored_on_keyboard_interrupt(clean_registry):
    original = targets.greet
    register_patch("t.kbd", f"{T}.greet")(lambda orig: lambda name: "patched")
    with pytest.raises(KeyboardInterrupt):
        with apply_patches("t.kbd"):
            raise KeyboardInterrupt
    assert targets.greet is original


def test_one_factory_several_paths(clean_registry):
    calls = []

    def factory(orig):
        calls.append(orig.__name__)
        return lambda *a: f"wrapped {orig(*a)}"

    register_patch("t.multi", f"{T}.greet", f"{T}.shout")(factory)
    with apply_patches("t.multi"):
        assert targets.greet("a") == "wrapped hello a"
        assert targets.shout("a") == "wrapped HEY a"
    assert calls == ["greet", "shout"]
    assert targets.greet("a") == "hello a" and targets.shout("a") == "HEY a"


def test_torch_op_paths(clean_registry):
    where, pad = torch.where, torch.nn.functional.pad
    # transformers.exporters restores a patched inherited method by setting it on torch.Tensor itself (the same C
    # method): after an upstream export in this process, start again from the class as torch defines it
    if vars(torch.Tensor).get("unsqueeze") is torch._C.TensorBase.unsqueeze:
        delattr(torch.Tensor, "unsqueeze")
    assert "unsqueeze" not in vars(torch.Tensor)
    seen = []

    def factory(orig):
        def replacement(*args, **kwargs):
            seen.append(orig.__name__)
            return orig(*args, **kwargs)

        return replacement

    register_patch("t.torch", "torch.where", "torch.nn.functional.pad", "torch.Tensor.unsqueeze")(factory)
    x = torch.ones(2)
    with apply_patches("t.torch"):
        torch.where(x > 0, x, x)
        torch.nn.functional.pad(x, (1, 1))
        x.unsqueeze(0)
    assert seen == ["where", "pad", "unsqueeze"]
    assert torch.where is where and torch.nn.functional.pad is pad
    # the Tensor method was inherited from the C base class: restoring removes the override
    assert "unsqueeze" not in vars(torch.Tensor)
    assert x.unsqueeze(0).shape == (1, 2)


def test_inherited_method_patched_on_subclass_only(clean_registry):
    register_patch("t.inherit", f"{T}.LoudSpeaker.say")(lambda orig: lambda self, w: w.upper())
    with apply_patches("t.inherit"):
        assert targets.LoudSpeaker().say("a") == "A"
        assert targets.Speaker().say("a") == "a"
    assert "say" not in vars(targets.LoudSpeaker)


def test_static_and_class_methods_keep_their_kind(clean_registry):
    register_patch("t.kinds", f"{T}.Speaker.static_say")(lambda orig: lambda w: orig(w) * 2)
    register_patch("t.kinds", f"{T}.Speaker.class_say")(lambda orig: lambda cls, w: f"patched {cls.__name__}:{w}")
    with apply_patches("t.kinds"):
        assert targets.Speaker.static_say("a") == "aa"
        assert targets.Speaker().static_say("b") == "bb"
        assert targets.LoudSpeaker.class_say("c") == "patched LoudSpeaker:c"
    assert isinstance(vars(targets.Speaker)["static_say"], staticmethod)
    assert isinstance(vars(targets.Speaker)["class_say"], classmethod)
    assert targets.LoudSpeaker.class_say("c") == "LoudSpeaker:c"


def test_a_replacement_given_as_staticmethod_or_classmethod_is_recorded_when_called(clean_registry):
    """A factory may return ``staticmethod(f)`` itself (Cosmos3 Edge's grid resize does): the call is
    recorded as fired like a plain function's, and the attribute keeps its kind while patched."""

    def static_factory(orig):
        return staticmethod(lambda w: orig(w) + "!")

    def class_factory(orig):
        return classmethod(lambda cls, w: f"{cls.__name__}?{w}")

    register_patch("t.wrapped", f"{T}.Speaker.static_say")(static_factory)
    register_patch("t.wrapped", f"{T}.Speaker.class_say")(class_factory)
    with registry.recording_fired() as fired, apply_patches("t.wrapped"):
        assert isinstance(vars(targets.Speaker)["static_say"], staticmethod)
        assert isinstance(vars(targets.Speaker)["class_say"], classmethod)
        assert fired == []
        assert targets.Speaker.static_say("a") == "a!"
        assert [w.func for w in fired] == [static_factory]
        assert targets.LoudSpeaker.class_say("b") == "LoudSpeaker?b"
    assert [w.func for w in fired] == [static_factory, class_factory]
    assert targets.Speaker.static_say("a") == "a"


def test_unresolved_path_is_skipped_with_one_warning(clean_registry):
    register_patch("t.missing", f"{T}.NoSuchClass.method", "no_such_package_xyz.f")(lambda orig: orig)
    register_patch("t.missing", f"{T}.greet")(lambda orig: lambda name: "patched")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with apply_patches("t.missing") as installed:
                assert targets.greet("a") == "patched"
                assert installed == [f"{T}.greet"]
    messages = [str(w.message) for w in caught if issubclass(w.category, UnresolvedPatchWarning)]
    assert messages == [
        f"patch path '{T}.NoSuchClass.method' does not resolve in the installed versions; the patch is skipped",
        "patch path 'no_such_package_xyz.f' does not resolve in the installed versions; the patch is skipped",
    ]


def test_loaded_only_patch_waits_for_its_module(clean_registry, monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "_lazy_targets", raising=False)
    register_patch("t.lazy", "_lazy_targets.Tower.forward", loaded_only=True)(lambda orig: lambda self, x: x + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with apply_patches("t.lazy") as installed:
            assert installed == []
    assert "_lazy_targets" not in sys.modules  # not imported by the registry
    assert [w for w in caught if issubclass(w.category, UnresolvedPatchWarning)] == []
    import _lazy_targets

    with apply_patches("t.lazy") as installed:
        assert installed == ["Tower.forward"]
        assert _lazy_targets.Tower().forward(1) == 2
    assert _lazy_targets.Tower().forward(1) == 1
    assert registry._module_loaded("_lazy_targets.Tower.forward") and not registry._module_loaded("json.tool.main")


def test_register_patch_refuses_bad_paths():
    with pytest.raises(ValueError, match="needs at least one dotted path"):
        register_patch("t.bad")
    with pytest.raises(ValueError, match="'where' is not a dotted path"):
        register_patch("t.bad", "where")
    with pytest.raises(ValueError, match=re.escape("'pkg.mod.len*' has a wildcard in its attribute; only the owner may hold one")):
        register_patch("t.bad", "pkg.mod.len*")


def test_wildcard_path_shadows_a_builtin_in_each_loaded_matching_module(clean_registry, monkeypatch):
    """``pkg.*.modeling_*.len`` installs a module global ``len`` in every loaded module whose name
    matches (``*`` within one segment), seen by that module's code only, and deletes it afterwards;
    a module's own ``len`` is the original it is given, and restored as it was."""
    import sys
    import types

    code = "def count(x):\n    return len(x)\n"
    modules = {}
    for name in ("_wild.a.modeling_a", "_wild.b.modeling_b", "_wild.a.config_a", "_wild.a.b.modeling_c"):
        module = types.ModuleType(name)
        exec(code, vars(module))
        modules[name] = module
        monkeypatch.setitem(sys.modules, name, module)
    own = modules["_wild.b.modeling_b"]
    own.len = lambda x: -1  # a module that defines its own len
    seen = []
    register_patch("t.wild", "_wild.*.modeling_*.len")(lambda orig: seen.append(orig) or (lambda x: 2 * orig(x)))
    with apply_patches("t.wild") as installed:
        assert installed == ["_wild.a.modeling_a.len", "_wild.b.modeling_b.len"]
        assert modules["_wild.a.modeling_a"].count([1, 2, 3]) == 6
        assert own.count([1, 2, 3]) == -2
        assert modules["_wild.a.config_a"].count([1, 2, 3]) == 3  # not a modeling_* module
        assert modules["_wild.a.b.modeling_c"].count([1, 2, 3]) == 3  # * does not cross a dot
        assert len([1, 2, 3]) == 3  # builtins untouched
    assert seen[0] is len and seen[1] is not len
    assert "len" not in vars(modules["_wild.a.modeling_a"])
    assert modules["_wild.a.modeling_a"].count([1, 2, 3]) == 3 and own.count([1]) == -1


def test_scoped_backends(clean_registry):
    register_patch("t.scope", f"{T}.greet")(lambda orig: lambda name: "parent")
    register_patch("t.scope.child", f"{T}.shout")(lambda orig: lambda name: "child")
    with apply_patches("t.scope.child"):
        assert targets.greet("a") == "parent" and targets.shout("a") == "child"
    with apply_patches("t.scope"):
        assert targets.greet("a") == "parent" and targets.shout("a") == "HEY a"


def test_select_filters_paths(clean_registry):
    register_patch("t.select", f"{T}.greet", f"{T}.shout")(lambda orig: lambda name: "patched")
    with apply_patches("t.select", select=lambda path: path.endswith("shout")):
        assert targets.greet("a") == "hello a" and targets.shout("a") == "patched"


def test_threads_never_see_each_other_half_patched(clean_registry):
    register_patch("t.thread.a", f"{T}.greet", f"{T}.shout")(lambda orig: lambda name: "A")
    register_patch("t.thread.b", f"{T}.greet", f"{T}.shout")(lambda orig: lambda name: "B")
    seen = {"a": set(), "b": set()}
    intervals = []
    start = threading.Barrier(2)

    def worker(tag):
        start.wait()
        for _ in range(5):
            with apply_patches(f"t.thread.{tag}"):
                begin = time.perf_counter()
                for _ in range(20):
                    seen[tag].add((targets.greet("x"), targets.shout("x")))
                    time.sleep(0.0005)
                intervals.append((begin, time.perf_counter()))

    threads = [threading.Thread(target=worker, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"a": {("A", "A")}, "b": {("B", "B")}}
    intervals.sort()
    assert all(end <= next_begin for (_, end), (next_begin, _) in zip(intervals, intervals[1:]))
    assert targets.greet("x") == "hello x"


class _Branchy(torch.nn.Module):
    def forward(self, x):
        def true_fn(x):
            return torch.sin(x) + 1

        def false_fn(x):
            return torch.sin(x) - 1

        return torch.cond(x.sum() > 0, true_fn, false_fn, (x,)) + torch.sin(x)


def test_fx_node_fix_walks_nested_subgraphs_and_cleans_up(clean_registry):
    program = torch.export.export(_Branchy(), (torch.randn(4),))

    @register_fx_node_fix("t.fx")
    def _fix_sin_to_cos(gm, node):
        if node.target is not torch.ops.aten.sin.default:
            return False
        with gm.graph.inserting_before(node):
            dead = gm.graph.call_function(torch.ops.aten.neg.default, node.args)  # unused: DCE removes it
            new = gm.graph.call_function(torch.ops.aten.cos.default, node.args)
        assert dead is not None
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        return True

    consumed = apply_fx_node_fixes("t.fx", program.graph_module)
    assert consumed == 3  # one sin in the main graph, one in each branch
    targets_left = [n.target for gm in program.graph_module.modules() if isinstance(gm, torch.fx.GraphModule) for n in gm.graph.nodes]
    assert torch.ops.aten.sin.default not in targets_left
    assert torch.ops.aten.neg.default not in targets_left
    x = torch.randn(4).abs() + 0.1
    assert torch.allclose(program.module()(x), torch.cos(x) + 1 + torch.cos(x))


def test_first_fix_that_consumes_a_node_wins(clean_registry):
    program = torch.export.export(_Branchy(), (torch.randn(4),))
    calls = []
    register_fx_node_fix("t.order")(lambda gm, node: calls.append("first") or node.target is torch.ops.aten.sin.default)
    register_fx_node_fix("t.order")(lambda gm, node: calls.append("second") or False)
    apply_fx_node_fixes("t.order", program.graph_module)
    n_nodes = sum(
        1
        for gm in program.graph_module.modules()
        if isinstance(gm, torch.fx.GraphModule)
        for n in gm.graph.nodes
        if n.op == "call_function"
    )
    assert calls.count("first") == n_nodes
    assert calls.count("second") == n_nodes - 3


def test_fx_program_fix_gets_the_program(clean_registry):
    program = torch.export.export(_Branchy(), (torch.randn(4),))
    got = []
    register_fx_program_fix("t.prog")(lambda ep: got.append(ep))
    assert apply_fx_program_fixes("t.prog", program) == 1
    assert got == [program]


# ── Stages ───────────────────────────────────────────────────────────────────


@pytest.fixture
def two_patch_stages(monkeypatch):
    """A backend ``t2`` whose exporter applies patches in two stages."""
    monkeypatch.setitem(registry.STAGES, "t2", {"Stage 1: Early": ("patch",), "Stage 2: Late": ("patch",)})


def test_a_patch_carries_the_stage_it_is_registered_for(clean_registry, two_patch_stages):
    register_patch("t2.scope", f"{T}.greet", stage="Stage 1: Early")(lambda orig: lambda name: "early")
    register_patch("t2", f"{T}.shout", stage="Stage 2: Late")(lambda orig: lambda name: "late")
    assert [(w.target, w.stage) for w in registry.list_workarounds("t2.scope")] == [
        (f"{T}.greet", "Stage 1: Early"),
        (f"{T}.shout", "Stage 2: Late"),
    ]
    assert [w.target for w in registry.list_workarounds("t2.scope", stage="Stage 2: Late")] == [f"{T}.shout"]
    with apply_patches("t2.scope", stage="Stage 1: Early") as installed:
        assert installed == [f"{T}.greet"]
        assert targets.greet("a") == "early" and targets.shout("a") == "HEY a"
    with apply_patches("t2.scope", stage="Stage 2: Late") as installed:
        assert installed == [f"{T}.shout"]
    with apply_patches("t2.scope") as installed:  # no stage: every one
        assert installed == [f"{T}.greet", f"{T}.shout"]


def test_a_stage_is_required_where_the_backend_has_several(clean_registry, two_patch_stages):
    with pytest.raises(ValueError, match=re.escape("backend 't2' applies a patch in 2 stages ('Stage 1: Early', 'Stage 2: Late'); pass stage=")):
        register_patch("t2", f"{T}.greet")
    with pytest.raises(ValueError, match=re.escape("'Stage 3: Typo' is not a stage of backend 't2' that applies a patch")):
        register_patch("t2", f"{T}.greet", stage="Stage 3: Typo")
    with pytest.raises(ValueError, match=re.escape("backend 't2' has no stage 'Stage 3: Typo'")):
        with apply_patches("t2", stage="Stage 3: Typo"):
            pass
    assert [w for w in registry.list_workarounds() if w.backend == "t2"] == []


def test_the_one_stage_of_a_kind_is_the_default(clean_registry):
    register_patch("dynamo", f"{T}.greet")(lambda orig: orig)
    register_fx_node_fix("onnx")(lambda gm, node: False)
    register_fx_node_fix("executorch.xnnpack")(lambda gm, node: False)
    dynamo_patch, onnx_fix, executorch_fix = registry._REGISTRY[-3:]
    assert dynamo_patch.stage == "Stage 2: Model patches"
    assert onnx_fix.stage == "Stage 3: FX node fixes"
    assert executorch_fix.stage == "Stage 5: FX node fixes"
    with pytest.raises(ValueError, match=re.escape("backend 'onnx' applies a patch in 2 stages")):
        register_patch("onnx", f"{T}.greet")
    with pytest.raises(ValueError, match=re.escape("backend 'dynamo' applies a fx_node_fix in no stage")):
        register_fx_node_fix("dynamo")(lambda gm, node: False)
    assert registry.resolve_stage("patch", "t.own") == "unused (patch)"  # a scope no exporter applies


def _fast_tier_test_text() -> str:
    """The source of every test function and class of tests/test_*.py not marked ``canary`` or ``slow``, and
    of each module-level constant such a test reads (a table of cases): what ``make test`` runs."""
    import ast
    from pathlib import Path

    def marked(node: ast.AST) -> bool:
        return any(re.search(r"mark\.(canary|slow)\b", ast.unparse(d)) for d in getattr(node, "decorator_list", []))

    pieces = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        source = path.read_text()
        tree = ast.parse(source)
        # ast.unparse: code and docstrings, not comments (a comment naming a workaround tests nothing)
        tests = [ast.unparse(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not marked(n)]
        pieces += tests
        body = "\n".join(tests)
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and re.search(rf"\b{t.id}\b", body) for t in node.targets):
                pieces.append(ast.unparse(node))
    return "\n".join(pieces)


def test_every_workaround_is_named_by_a_fast_tier_test():
    """A workaround's smallest test names it (refused without it, fired, parity, or the function itself
    called): a new workaround without one fails here, naming it."""
    import hf_exporters.workarounds  # noqa: F401  (registers them all)

    text = _fast_tier_test_text()
    names = {w.name for w in registry.list_workarounds()}
    assert len(names) > 100
    # the name itself, or a test named for it (``_fix_x`` -> ``test_fix_x``)
    named = {name for name in names if re.search(rf"(?<![A-Za-z0-9_])(test)?{name}(?![A-Za-z0-9_])", text)}
    assert sorted(names - named) == []
