"""Lowering steps skipped where they find nothing to do (workarounds/executorch/lowering_speed.py).

The smallest models that show each: a 1-D convolution, ReLU and projection (XNNPACK's pass pipeline runs
the convolution and activation passes, skips the others), and the same export counted for its
decompositions. The ``.pte`` is the same program with and without the patches.
"""

from __future__ import annotations

import inspect
import threading

import pytest
import torch

pytest.importorskip("executorch.runtime", reason="XNNPACK lowering needs the executorch extra")

from hf_exporters import ExecutorchConfig, ExecutorchExporter, ExportStageError  # noqa: E402
from hf_exporters.runtime.et_runner import ExecutorchRunner  # noqa: E402
from hf_exporters.workarounds.executorch import lowering_speed  # noqa: E402
from workaround_helpers import without_workarounds  # noqa: E402

PASSES = "_patch_xnnpack_passes_skip_absent_operators"
DECOMPOSITION = "_patch_no_third_decomposition_when_nothing_is_left"


class ConvBlock(torch.nn.Module):
    """(B, 4, 16) -> Conv1d -> ReLU -> mean over length -> Linear -> (B, 8)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(4, 6, 3, padding=1)
        self.proj = torch.nn.Linear(6, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.conv(x)).transpose(1, 2)).tanh()


def _inputs() -> dict[str, torch.Tensor]:
    return {"x": torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(1))}


def _export_counting(monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, list[str], int]:
    """The ``.pte`` buffer, the XNNPACK passes that ran, and the number of ``run_decompositions`` calls."""
    from executorch.backends.xnnpack import _passes

    ran: list[str] = []
    decompositions = [0]
    transform = _passes._transform
    decompose = torch.export.ExportedProgram.run_decompositions

    def counting_transform(ep, *passes, **kwargs):
        ran.extend(type(p).__name__ for p in passes)
        return transform(ep, *passes, **kwargs)

    def counting_decompose(self, *args, **kwargs):
        decompositions[0] += 1
        return decompose(self, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(_passes, "_transform", counting_transform)  # the Stage 3 patch wraps this one
        patched.setattr(torch.export.ExportedProgram, "run_decompositions", counting_decompose)
        manager = ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig())
        buffer = manager.buffer
    return buffer, ran, decompositions[0]


def _conv_block_pte() -> bytes:
    return ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig()).buffer


def _check_parity(buffer: bytes) -> None:
    model = ConvBlock().eval()
    with torch.no_grad():
        want = model(**_inputs())
    got = ExecutorchRunner(buffer)(_inputs())[0]
    assert float(want.abs().max()) > 0.1  # the output carries signal
    assert float((got - want).abs().max()) < 1e-5


def test_xnnpack_passes_run_only_where_their_operators_are(monkeypatch):
    buffer, ran, _ = _export_counting(monkeypatch)
    with without_workarounds(PASSES):
        plain, ran_all, _ = _export_counting(monkeypatch)
    assert ran_all == list(lowering_speed.KNOWN_XNNPACK_PASSES)  # one partition, every pass
    # the convolution and activation-fusion passes still run; batch norm, PReLU, SDPA, ``mm`` to linear
    # (the partitioner keeps ``linear`` whole), ... do not
    assert {"Conv1dUnsqueezePass", "FuseActivationPass", "ConstPropPass"} <= set(ran)
    skipped = {"FuseBatchNormPass", "DecomposeBatchNorm", "PReLUReshapePass", "ConvertToSDPAPass", "ConvertToLinearPass"}
    assert not skipped & set(ran)
    assert len(ran) < len(ran_all)
    assert buffer == plain  # the same program
    _check_parity(buffer)


def test_third_decomposition_skipped_when_nothing_is_left(monkeypatch):
    buffer, _, calls = _export_counting(monkeypatch)
    with without_workarounds(DECOMPOSITION):
        plain, _, calls_all = _export_counting(monkeypatch)
    assert (calls, calls_all) == (2, 3)
    assert buffer == plain
    _check_parity(buffer)


def test_other_executorch_version_fails_naming_the_stage(monkeypatch):
    monkeypatch.setattr(lowering_speed, "_executorch_version", lambda: "9.0.0")
    with pytest.raises(ExportStageError, match="Stage 3: ExecuTorch patches.*written for executorch 1.4"):
        ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig())


def test_changed_xnnpack_pipeline_fails_naming_the_stage(monkeypatch):
    monkeypatch.setattr(lowering_speed, "KNOWN_XNNPACK_PASSES", lowering_speed.KNOWN_XNNPACK_PASSES[:-1])
    with pytest.raises(ExportStageError, match="Stage 3: ExecuTorch patches.*pass pipeline"):
        ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig())


# ── the pattern graphs, built only where a partition could match them ──


def test_pattern_operators_are_held_by_every_pattern():
    """The operator sets the rules check first are necessary conditions: every built pattern holds them."""
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa

    for required, patterns in (
        (lowering_speed.SDPA_PATTERN_OPERATORS, sdpa.get_graphs()),
        (lowering_speed.BILINEAR_PATTERN_OPERATORS, list(bilinear_2d.get_graphs_dict())),
    ):
        assert patterns
        for pattern in patterns:
            assert required <= lowering_speed._names(lowering_speed._targets(pattern.graph))


def test_pattern_graphs_not_built_for_a_partition_without_their_operators(monkeypatch):
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa

    built: list[str] = []
    monkeypatch.setattr(sdpa, "get_graphs", lambda: built.append("sdpa") or [])
    monkeypatch.setattr(bilinear_2d, "get_graphs_dict", lambda: built.append("bilinear") or {})
    manager = ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig())
    assert built == []
    _check_parity(manager.buffer)


def test_pattern_rule_builds_the_patterns_once_when_the_operators_are_there():
    from executorch.exir.dialects._ops import ops as exir_ops

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(exir_ops.edge.aten.relu.default, (x,)))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    builds = []

    def build():
        builds.append(1)
        return [module]

    rule = lowering_speed._may_match_patterns(frozenset({"aten.relu.default"}), build)
    targets = lowering_speed._targets(module.graph)
    assert rule(module, targets) and rule(module, targets)
    assert len(builds) == 1
    assert not lowering_speed._may_match_patterns(frozenset({"aten.any.dim"}), build)(module, targets)
    assert len(builds) == 1


# ── provenance records shared, not deep-copied ──

PROVENANCE = "_patch_node_provenance_shared"


def test_provenance_record_shares_its_ancestors_and_equals_the_copied_one():
    from torch.fx.traceback import NodeSource, NodeSourceAction

    from hf_exporters import registry

    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    ancestor = NodeSource(None, "earlier_pass", NodeSourceAction.CREATE)
    node.meta["from_node"] = [ancestor]
    original_init = NodeSource.__init__
    copied = NodeSource(node, "a_pass", NodeSourceAction.CREATE)
    with registry.apply_patches("executorch.xnnpack", stage="Stage 3: ExecuTorch patches"):
        assert NodeSource.__init__ is not original_init
        shared = NodeSource(node, "a_pass", NodeSourceAction.CREATE)
    assert NodeSource.__init__ is original_init  # restored
    assert copied.from_node[0] is not ancestor
    assert shared.from_node[0] is ancestor  # shared, not copied
    assert shared.from_node is not node.meta["from_node"]  # the node's own list stays its own
    assert shared == copied and shared.to_dict() == copied.to_dict()
    assert (shared.name, shared.target, shared.pass_name) == ("x", "x", "a_pass")  # a placeholder's target is its name


def test_program_the_same_with_shared_provenance():
    buffer = _conv_block_pte()
    with without_workarounds(PROVENANCE):
        plain = _conv_block_pte()
    assert buffer == plain
    _check_parity(buffer)


def test_other_torch_version_fails_naming_the_stage(monkeypatch):
    monkeypatch.setattr(lowering_speed, "SUPPORTED_TORCH", ("9.9.",))
    with pytest.raises(ExportStageError, match="Stage 3: ExecuTorch patches.*provenance patch hooks torch.fx.traceback.NodeSource"):
        ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig())


# ── the CIA-operator table, materialized once per set of registrations ──

CIA = "_patch_cia_ops_materialized_once"


def test_cia_operators_materialized_only_when_the_registrations_change(monkeypatch):
    """Each walk over the dispatcher's CIA registrations runs once per set of registrations: the conv
    block's lowering asks for it once per operator namespace of every table (dozens of times) and walks at
    most once; a library registering a new CIA operator makes the next export walk again; the program
    is byte-identical."""
    import torch._export.utils as export_utils

    walks = [0]
    materialize = export_utils._materialize_cpp_cia_ops

    def counting() -> None:
        walks[0] += 1
        materialize()

    monkeypatch.setattr(export_utils, "_materialize_cpp_cia_ops", counting)  # the Stage 3 patch wraps this one
    asked = [0]
    collect = export_utils._collect_all_valid_cia_ops_for_namespace

    def asking(namespace):
        asked[0] += 1
        return collect(namespace)

    monkeypatch.setattr(export_utils, "_collect_all_valid_cia_ops_for_namespace", asking)
    buffer = _conv_block_pte()
    assert asked[0] > 10 and walks[0] <= 1
    walks[0] = 0
    library = torch.library.Library("hfx_cia_test", "DEF")
    library.define("twice(Tensor x) -> Tensor")
    library.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
    try:
        again = _conv_block_pte()
    finally:
        library._destroy()
    assert walks[0] == 1 and again == buffer
    with without_workarounds(CIA):
        assert _conv_block_pte() == buffer
    _check_parity(buffer)


# ── the edge-dialect conversion's passes, skipped where they find nothing ──

EDGE = "_patch_edge_passes_skip_absent_operators"


class MixedBlock(torch.nn.Module):
    """(B, 4) float and (B, 1) int64 -> (B, 3): float + int64 arithmetic, which ``RemoveMixedTypeOperators``
    casts (the transposed weight and the view are made copies before the skipped passes run)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(3, 4))

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return (torch.mm(x, self.weight.t()) + n).view(-1, 3).tanh()


class SymBlock(torch.nn.Module):
    """(B, 4) -> (B,): row sums scaled by the batch size, a symbolic value used as a tensor with a dynamic batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(-1) * x.shape[0]


def _mixed_inputs() -> dict[str, torch.Tensor]:
    return {"x": torch.randn(2, 4, generator=torch.Generator().manual_seed(2)), "n": torch.tensor([[1], [2]])}


def _aten_graph(module: torch.nn.Module, inputs: dict[str, torch.Tensor], dynamic: bool = False) -> torch.fx.GraphModule:
    shapes = {k: {0: torch.export.Dim.AUTO} for k in inputs} if dynamic else None
    return torch.export.export(module, (), inputs, dynamic_shapes=shapes).run_decompositions({}).graph_module


def test_edge_pass_rules_act_only_where_their_operators_are():
    rules = lowering_speed._edge_skip_rules()
    assert set(rules) < set(lowering_speed.KNOWN_EDGE_PASSES)
    plain = _aten_graph(ConvBlock().eval(), _inputs())
    mixed = _aten_graph(MixedBlock().eval(), _mixed_inputs())
    dynamic = _aten_graph(SymBlock(), {"x": torch.randn(3, 4)}, dynamic=True)
    from torch._export.passes import ReplaceViewOpsWithViewCopyOpsPass

    # ConvBlock's transpose is a view until the conversion's first pass makes it a view_copy
    assert rules["ReplaceBrokenOpsWithFunctionalOpsPass"](plain)
    copied = ReplaceViewOpsWithViewCopyOpsPass()(plain).graph_module
    assert not any(rule(copied) for rule in rules.values())
    assert rules["RemoveMixedTypeOperators"](mixed)  # float + int64
    assert rules["SymToTensorPass"](dynamic) and not rules["SymToTensorPass"](mixed)

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    t = graph.call_function(torch.ops.aten.t.default, (x,))
    graph.output(graph.call_function(torch.ops.aten.view.default, (t, [-1])))
    few = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert rules["NormalizeTransposePass"](few) and rules["ReplaceBrokenOpsWithFunctionalOpsPass"](few)


def test_promotion_rule_follows_the_dtypes():
    def graph_of(first: torch.dtype, second: torch.dtype) -> torch.fx.GraphModule:
        graph = torch.fx.Graph()
        a, b = graph.placeholder("a"), graph.placeholder("b")
        a.meta["val"], b.meta["val"] = torch.empty(2, dtype=first), torch.empty(2, dtype=second)
        graph.output(graph.call_function(torch.ops.aten.add.Tensor, (a, b)))
        return torch.fx.GraphModule(torch.nn.Module(), graph)

    assert not lowering_speed._promotes(graph_of(torch.float32, torch.float32))
    assert lowering_speed._promotes(graph_of(torch.float32, torch.int64))
    assert lowering_speed._promotes(graph_of(torch.float16, torch.float32))


@pytest.mark.parametrize(
    "make,inputs,acting",
    [(ConvBlock, _inputs, set()), (MixedBlock, _mixed_inputs, {"RemoveMixedTypeOperators"})],
    ids=["conv", "mixed"],
)
def test_program_the_same_with_edge_passes_skipped(make, inputs, acting, monkeypatch):
    decided: dict[str, bool] = {}
    rules = lowering_speed._edge_skip_rules

    def recording_rules():
        def record(name, rule):
            return lambda gm: decided.setdefault(name, rule(gm))

        return {name: record(name, rule) for name, rule in rules().items()}

    monkeypatch.setattr(lowering_speed, "_edge_skip_rules", recording_rules)
    buffer = ExecutorchExporter().export(make().eval(), inputs(), ExecutorchConfig()).buffer
    assert set(decided) == set(rules())  # every rule was asked: the patch was in place
    assert {name for name, acts in decided.items() if acts} == acting  # the others were skipped
    with without_workarounds(EDGE):
        plain = ExecutorchExporter().export(make().eval(), inputs(), ExecutorchConfig()).buffer
    assert buffer == plain
    with torch.no_grad():
        want = make().eval()(**inputs())
    got = ExecutorchRunner(buffer)(inputs())[0]
    assert float(want.abs().max()) > 0.1
    assert float((got - want).abs().max()) < 1e-5


def test_changed_edge_passes_fail_naming_the_stage(monkeypatch):
    monkeypatch.setattr(lowering_speed, "KNOWN_EDGE_PASSES", lowering_speed.KNOWN_EDGE_PASSES[:-1])
    with pytest.raises(ExportStageError, match="Stage 3: ExecuTorch patches.*aten-to-edge passes"):
        ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig())


def test_edge_operator_table_parsed_by_the_c_parser():
    """ExecuTorch's operator table is read with ruamel.yaml's C parser (ruamel.yaml.clib, a pinned dependency of
    the executorch extra), to the same data as the pure-Python parser."""
    from importlib import resources

    from ruamel.yaml import YAML

    text = resources.files("executorch.exir.dialects.edge").joinpath("edge.yaml").read_text(encoding="utf-8")
    fast = YAML(typ="safe")
    assert fast.Parser.__module__.startswith(("_ruamel_yaml", "ruamel.yaml.clib"))
    assert fast.load(text) == YAML(typ="safe", pure=True).load(text)


# ── the edge verifier's dtype check, from the nodes' recorded values ──
DTYPES = "_patch_edge_dtype_check_reads_metadata"


class AddBlock(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x + y).tanh()


def _edge_graph(int_y: bool = False) -> torch.fx.GraphModule:
    """The edge graph of ``AddBlock``; with ``int_y`` its input ``y`` is recorded as int64, so the float
    ``add`` takes mixed dtypes, which the edge dialect forbids."""
    from executorch.exir import EdgeCompileConfig, to_edge

    x = torch.randn(2, 3)
    program = to_edge(torch.export.export(AddBlock(), (x, x)), compile_config=EdgeCompileConfig(_check_ir_validity=False))
    gm = program.exported_program().graph_module
    if int_y:
        y = [n for n in gm.graph.nodes if n.op == "placeholder"][1]
        fake = y.meta["val"]
        with fake.fake_mode:
            y.meta["val"] = fake.to(torch.int64)
    return gm


def test_dtype_check_reads_recorded_values_and_raises_executorchs_own_error(monkeypatch):
    from executorch.exir.verification import arg_validator, verifier

    original = verifier._check_tensor_args_matching_op_allowed_dtype
    runs = []
    run = arg_validator.EdgeOpArgValidator.run
    monkeypatch.setattr(arg_validator.EdgeOpArgValidator, "run", lambda self, *a, **k: runs.append(1) or run(self, *a, **k))
    check = lowering_speed._patch_edge_dtype_check_reads_metadata(original)
    assert check(_edge_graph()) is None and runs == []  # a valid graph: no fake run of its operators
    with pytest.raises(Exception) as expected:
        original(_edge_graph(int_y=True))
    with pytest.raises(type(expected.value)) as caught:
        check(_edge_graph(int_y=True))
    assert "These operators are taking Tensor inputs with mismatched dtypes" in str(caught.value)
    assert str(caught.value) == str(expected.value) and len(runs) == 2  # the invalid graph: ExecuTorch's own run and message


def test_program_the_same_with_dtypes_read_from_metadata(monkeypatch):
    from executorch.exir.verification import arg_validator

    runs = []
    run = arg_validator.EdgeOpArgValidator.run
    monkeypatch.setattr(arg_validator.EdgeOpArgValidator, "run", lambda self, *a, **k: runs.append(1) or run(self, *a, **k))
    buffer = _conv_block_pte()
    patched_runs = len(runs)
    with without_workarounds(DTYPES):
        plain = _conv_block_pte()
    assert buffer == plain
    assert patched_runs < len(runs) - patched_runs, (patched_runs, len(runs))  # most fake runs are gone
    _check_parity(buffer)


# ── to_executorch's auto_functionalized removal, only where such a call is ──
AUTO_FUNCTIONALIZED = "_patch_auto_functionalized_removal_only_where_present"


def test_program_the_same_with_the_removal_skipped():
    buffer = _conv_block_pte()
    with without_workarounds(AUTO_FUNCTIONALIZED):
        plain = _conv_block_pte()
    assert buffer == plain
    _check_parity(buffer)


@torch.library.custom_op("hf_exporters_test::add_one_", mutates_args=("x",))
def _add_one_(x: torch.Tensor) -> None:
    x.add_(1)


class MutatingBlock(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        _add_one_(y)
        return y * 2


def test_a_program_with_auto_functionalized_calls_gets_torchs_removal():
    program = torch.export.export(MutatingBlock(), (torch.ones(3),)).run_decompositions({})
    called = []
    remove = lowering_speed._patch_auto_functionalized_removal_only_where_present(lambda p: called.append(p) or p)
    assert lowering_speed._holds_auto_functionalized(program)
    assert remove(program) is program and called == [program]
    plain = torch.export.export(ConvBlock().eval(), (), _inputs()).run_decompositions({})
    assert not lowering_speed._holds_auto_functionalized(plain)
    assert remove(plain) is plain and called == [program]  # done without torch's function


def test_first_export_in_a_process_does_not_load_inductor():
    """The module torch's removal lives in (it imports inductor's lowering) is never loaded by an export of a
    program without auto_functionalized calls; the stand-in loads it on first use of any other attribute."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from hf_exporters import ExecutorchConfig, ExecutorchExporter\n"
        "ExecutorchExporter().export(torch.nn.Linear(4, 3).eval(), {'input': torch.ones(2, 4)}, ExecutorchConfig())\n"
        "name = 'torch.export._remove_auto_functionalized_pass'\n"
        "print('inductor' if 'torch._inductor.fx_passes.post_grad' in sys.modules else 'no inductor')\n"
        "print(getattr(sys.modules[name], '__doc__', ''))\n"
        "print(sys.modules[name].remove_self_clone.__module__, 'torch._inductor.fx_passes.post_grad' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-3:] == [
        "no inductor",
        "torch.export._remove_auto_functionalized_pass, loaded on its first use (hf_exporters)",
        "torch.export._remove_auto_functionalized_pass True",
    ]


# ── graph modules compiled when first used ──

LAZY = "_patch_graph_modules_compiled_on_first_use"


def test_graph_modules_of_the_lowering_compiled_only_when_used(monkeypatch):
    """The conv block's lowering makes dozens of graph modules and compiles the code of almost none; the
    program is byte-identical without the patch, and the lowered program's graph module (made during
    the lowering) still gives its code and runs after it."""
    from torch.fx import _lazy_graph_module

    made, compiled = [0], [0]
    init, real = torch.fx.GraphModule.__init__, _lazy_graph_module._LazyGraphModule._real_recompile

    def counting_init(self, *args, **kwargs):
        made[0] += isinstance(self, _lazy_graph_module._LazyGraphModule)
        init(self, *args, **kwargs)

    def counting_real(self):
        compiled[0] += 1
        return real(self)

    monkeypatch.setattr(torch.fx.GraphModule, "__init__", counting_init)
    monkeypatch.setattr(_lazy_graph_module._LazyGraphModule, "_real_recompile", counting_real)
    manager = ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig())
    assert made[0] >= 20 and compiled[0] <= 3, (made, compiled)
    # the lowered program's graph module was made plain when the stage ended: its code made, its signature its own
    lowered = manager.exported_program().graph_module
    assert isinstance(lowered, torch.fx.GraphModule) and not isinstance(lowered, _lazy_graph_module._LazyGraphModule)
    assert list(inspect.signature(lowered.forward).parameters)[-1] == "x"
    assert "executorch_call_delegate" in lowered.recompile().src
    assert not isinstance(torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph()), _lazy_graph_module._LazyGraphModule)
    with without_workarounds(LAZY):
        plain = _conv_block_pte()
    assert manager.buffer == plain
    _check_parity(manager.buffer)


def test_lazy_graph_module_records_its_pytree_specs_before_its_code():
    """``torch.export`` reads ``_in_spec`` / ``_out_spec`` of a graph module without calling it: the deferred
    recompile sets them at once and leaves the code for the first call, which returns the eager value."""
    traced = torch.export.export(ConvBlock().eval(), (torch.randn(2, 4, 16),)).module()
    lazy = lowering_speed._lazy_graph_module_class()(traced, traced.graph)
    assert lazy._in_spec == traced._in_spec and lazy._out_spec == traced._out_spec
    assert type(lazy)._needs_recompile()  # no code made yet
    x = torch.randn(2, 4, 16)
    assert torch.equal(lazy(x), traced(x))
    assert not type(lazy)._needs_recompile()


def test_graph_modules_of_other_threads_stay_plain_and_survivors_are_made_plain(monkeypatch):
    """Only the thread that installed the patch (the exporting one) gets lazy graph modules; the ones still
    alive when the stage ends become plain graph modules that run as before."""
    from torch.fx import _lazy_graph_module

    replacement = lowering_speed._patch_graph_modules_compiled_on_first_use(torch.fx.GraphModule.__new__)
    monkeypatch.setattr(torch.fx.GraphModule, "__new__", staticmethod(replacement))
    traced = torch.fx.symbolic_trace(ConvBlock().eval())
    other: list[torch.fx.GraphModule] = []
    thread = threading.Thread(target=lambda: other.append(torch.fx.GraphModule(traced, traced.graph)))
    thread.start()
    thread.join()
    mine = torch.fx.GraphModule(traced, traced.graph)
    assert isinstance(mine, _lazy_graph_module._LazyGraphModule) and not isinstance(other[0], _lazy_graph_module._LazyGraphModule)
    monkeypatch.undo()
    assert lowering_speed.lazy_graph_modules_made_plain() >= 1
    assert not isinstance(mine, _lazy_graph_module._LazyGraphModule)
    assert list(inspect.signature(mine.forward).parameters) == ["x"]
    x = _inputs()["x"]
    assert torch.equal(mine(x), traced(x))


def test_moved_lazy_graph_module_fails_naming_the_stage(monkeypatch):
    from torch.fx import _lazy_graph_module

    monkeypatch.delattr(_lazy_graph_module._LazyGraphModule, "_lazy_forward")
    with pytest.raises(ExportStageError, match="Stage 3: ExecuTorch patches.*'torch.fx._lazy_graph_module._LazyGraphModule' has moved"):
        ExecutorchExporter().export(ConvBlock().eval(), _inputs(), ExecutorchConfig())
