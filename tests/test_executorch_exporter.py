"""ExecutorchExporter: its stages, backends, runner, and the smallest test for each ExecuTorch workaround."""

from __future__ import annotations

import inspect
import os
import re
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

pytest.importorskip("executorch", reason="the ExecuTorch tests need the executorch extra")

from hf_exporters import ExecutorchConfig, ExportStageError, MissingDependencyError, registry  # noqa: E402
from hf_exporters.errors import InputError  # noqa: E402
from hf_exporters.exporters import executorch as executorch_module  # noqa: E402
from hf_exporters.exporters.executorch import ExecutorchExporter  # noqa: E402
from hf_exporters.runtime import check_parity, resized_inputs  # noqa: E402
from hf_exporters.runtime.et_runner import ExecutorchRunner  # noqa: E402
from hf_exporters.shapes import StaticAxis, size_oblivious_sizes  # noqa: E402
from hf_exporters.workarounds.executorch import fx_program_fixes  # noqa: E402
from config_models import build, example_inputs  # noqa: E402
from workaround_helpers import without_workarounds  # noqa: E402

AUTO = torch.export.Dim.AUTO


class TinyAttention(torch.nn.Module):
    """One self-attention block: linear, view, permute, scaled_dot_product_attention."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, 4).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, 8)


def _tiny_attention() -> TinyAttention:
    torch.manual_seed(0)
    return TinyAttention().eval()


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


def _lower_and_run(model, example, fixes, run_shapes, make=None):
    """torch.export with Dim.AUTO, apply only ``fixes``, lower to XNNPACK, run each shape in executorch.runtime.

    Returns the max abs diff from eager per shape, or the runtime error's text.
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    with size_oblivious_sizes():
        ep = torch.export.export(model, (example,), dynamic_shapes=({i: AUTO for i in range(example.dim())},))
        for fix in fixes:
            fix(ep)
        buffer = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    method = Runtime.get().load_program(buffer).load_method("forward")
    results = []
    for shape in run_shapes:
        x = (make or _x)(*shape)
        try:
            got = method.execute([x])[0]  # the first output (last_hidden_state for a BertModel)
        except RuntimeError as error:
            results.append(str(error))
            continue
        with torch.no_grad():
            want = model(x)
        want = want if isinstance(want, torch.Tensor) else want[0]
        results.append(float((got - want).abs().max()))
    return results


# ── The exporter's shape ─────────────────────────────────────────────────────


def test_export_reads_as_five_stages():
    source = inspect.getsource(ExecutorchExporter.run_methods)
    titles = re.findall(r"# ── (Stage \d: [^─]+) ──", source)
    assert titles == [
        "Stage 1: Backend preparation",
        "Stage 2: Torch patches",
        "Stage 3: ExecuTorch patches",
        "Stage 4: FX program fixes",
        "Stage 5: FX node fixes",
    ]
    assert "super().run(" in source


def test_interface_attributes():
    assert ExecutorchExporter.name == "executorch"
    assert ExecutorchExporter.artifact_name == "model.pte"
    assert ExecutorchExporter.default_atol == 1e-3
    assert ExecutorchExporter.config_class is ExecutorchConfig
    assert set(registry.executorch_backends()) >= {"xnnpack", "portable", "cuda"}


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(ExportStageError) as info:
        ExecutorchExporter().export(_tiny_attention(), {"x": _x(1, 3, 8)}, ExecutorchConfig(backend="vulkan-x"))
    assert info.value.stage == "Stage 1: Backend preparation"
    assert info.value.detail == "InputError: unknown ExecuTorch backend 'vulkan-x'; known backends: cuda, portable, xnnpack"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_backend_without_gpu_fails_in_stage_1():
    with pytest.raises(ExportStageError) as info:
        ExecutorchExporter().export(_tiny_attention(), {"x": _x(1, 3, 8)}, ExecutorchConfig(backend="cuda"))
    assert info.value.stage == "Stage 1: Backend preparation"
    assert info.value.detail.startswith("RuntimeError: the ExecuTorch 'cuda' backend needs a CUDA GPU, and none is available here")


def test_missing_executorch_is_a_missing_dependency_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "executorch.exir", None)
    with pytest.raises(MissingDependencyError) as info:
        ExecutorchExporter().export(_tiny_attention(), {"x": _x(1, 3, 8)})
    assert "pip install 'hf-exporters[executorch]'" in str(info.value)


def test_every_executorch_workaround_names_upstream_and_removal():
    workarounds = [w for w in registry.list_workarounds() if w.backend.split(".")[0] == "executorch"]
    assert {w.name for w in workarounds} >= {
        "prepare_for_xnnpack",
        "prepare_for_portable",
        "prepare_for_cuda",
        "_fix_unbounded_range_constraints",
        "_fix_size_hints_of_one",
        "_patch_experts_batched_mm",
        "_patch_chunk_as_narrow",
        "_patch_split_as_narrow",
    }
    for w in workarounds:
        assert w.upstream, f"{w.name} has no 'Upstream:' line"
        assert w.remove_when, f"{w.name} has no 'Remove when:' line"
        prefix = {"patch": "_patch_", "fx_node_fix": "_fix_", "fx_program_fix": "_fix_", "backend_prepare": "prepare_for_"}
        assert w.name.startswith(prefix[w.kind]), w.name
        assert "Models:" in inspect.getdoc(w.func) and "Pattern:" in inspect.getdoc(w.func), w.name


# ── End to end on a tiny model ───────────────────────────────────────────────


@pytest.mark.parametrize("backend", ["xnnpack", "portable"])
def test_export_save_run_parity_dynamic(backend, tmp_path):
    model = _tiny_attention()
    inputs = {"x": _x(2, 5, 8)}
    exporter = ExecutorchExporter()
    result = exporter.run(model, inputs, ExecutorchConfig(backend=backend, dynamic=True))
    manager = result.program
    assert result.static_axes == [StaticAxis("x", 2, 8)]  # the feature axis, fixed by the Linear
    path = exporter.save(manager, tmp_path)
    assert path == tmp_path / "model.pte" and path.read_bytes() == manager.buffer
    resized = resized_inputs(result.exported_program, inputs)
    assert resized["x"].shape == (5, 8, 8)
    reports = check_parity(model, exporter.load_runner(path), [inputs, resized], atol=1e-3)
    assert [r.input_shapes["x"] for r in reports] == [[2, 5, 8], [5, 8, 8]]
    assert all(r.max_abs_diff < 1e-5 for r in reports)


class _AudioFeatureEncoder(torch.nn.Module):
    """wav2vec2's feature encoder in small: strided 1-D convolutions over raw audio (batch, samples)."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList([torch.nn.Conv1d(1, 8, 10, stride=5), torch.nn.Conv1d(8, 8, 3, stride=2)])

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        x = input_values[:, None]
        for conv in self.convs:
            x = torch.nn.functional.gelu(conv(x))
        return x.transpose(1, 2)


def test_patch_xnnpack_conv1d_one_dynamic_axis(tmp_path):
    """XNNPACK lowers a 1-D convolution as a 2-D one between reshapes that take one dynamic axis; with
    batch and length dynamic such convolutions stay on the portable kernel."""
    torch.manual_seed(0)
    model = _AudioFeatureEncoder().eval()
    inputs = {"input_values": _x(2, 400)}
    with without_workarounds("_patch_xnnpack_conv1d_one_dynamic_axis"):
        with pytest.raises(ExportStageError, match="XNNPACK reshape only supports 1 dynamic dimension"):
            ExecutorchExporter().export(model, inputs, ExecutorchConfig(dynamic=True))
    exporter = ExecutorchExporter()
    result = exporter.run(model, inputs, ExecutorchConfig(dynamic=True))
    manager = result.program
    path = exporter.save(manager, tmp_path)
    assert result.static_axes == []
    assert _top_level_convolutions(manager) == 2  # on the portable kernel
    reports = check_parity(model, exporter.load_runner(path), [inputs, {"input_values": _x(3, 650)}], atol=1e-3)
    assert [r.ok for r in reports] == [True, True] and max(r.max_abs_diff for r in reports) < 1e-5
    assert _top_level_convolutions(ExecutorchExporter().export(model, inputs)) == 0  # static: XNNPACK takes them


def _top_level_convolutions(manager) -> int:
    return sum("convolution" in str(n.target) for n in manager.exported_program().graph.nodes if n.op == "call_function")


class _NormOverTransposed(torch.nn.Module):
    """A LayerNorm over a transposed (batch, channels, length) input, then a view merging length and features."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, length = x.shape
        return self.norm(x.transpose(1, 2)).view(batch, length // 2, 16)


def test_patch_views_reshaped_before_decomposition(tmp_path):
    """The decomposed LayerNorm keeps its transposed input's strides where the fused kernel's output was contiguous:
    the traced view is refused in the lowering's re-trace; as a reshape it lowers, and the program equals eager."""
    torch.manual_seed(0)
    model, inputs = _NormOverTransposed().eval(), {"x": _x(2, 8, 6)}
    with without_workarounds("_patch_views_reshaped_before_decomposition"):
        with pytest.raises(ExportStageError) as caught:
            ExecutorchExporter().export(model, inputs)
    assert caught.value.stage == "lowering (to_edge_transform_and_lower)"
    assert "Cannot view a tensor with shape torch.Size([2, 6, 8]) and strides (48, 1, 6) as a tensor with shape (2, 3, 16)" in str(caught.value)
    exporter = ExecutorchExporter()
    runner = exporter.load_runner(exporter.save(exporter.export(model, inputs), tmp_path))
    with torch.no_grad():
        assert float((runner(inputs)[0] - model(**inputs)).abs().max()) < 1e-5


def test_views_as_reshapes_rewrites_and_recompiles():
    from hf_exporters.workarounds.executorch.decomposition_layouts import views_as_reshapes

    ep = torch.export.export(_NormOverTransposed().eval(), (_x(2, 8, 6),))
    views = [n for n in ep.graph.nodes if n.target is torch.ops.aten.view.default]
    assert len(views) == 1
    assert views_as_reshapes(ep.graph_module) == 1 and views[0].target is torch.ops.aten.reshape.default
    assert "torch.ops.aten.reshape.default" in ep.graph_module.code and views_as_reshapes(ep.graph_module) == 0


class _GatedHeads(torch.nn.Module):
    """An attention output gated per head: ``out * gate.unsqueeze(-1).sigmoid()`` over (batch, length, heads)."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = x.reshape(*x.shape[:2], 4, 2)
        return (heads * self.gate(x).unsqueeze(-1).sigmoid()).flatten(2)


def test_patch_xnnpack_unsqueeze_one_dynamic_axis(tmp_path):
    torch.manual_seed(0)
    model, inputs = _GatedHeads().eval(), {"x": _x(2, 5, 8)}
    with without_workarounds("_patch_xnnpack_unsqueeze_one_dynamic_axis"):
        with pytest.raises(ExportStageError, match="XNNPACK reshape only supports 1 dynamic dimension"):
            ExecutorchExporter().export(model, inputs, ExecutorchConfig(dynamic=True))
    exporter = ExecutorchExporter()
    result = exporter.run(model, inputs, ExecutorchConfig(dynamic=True))
    path = exporter.save(result.program, tmp_path)
    assert result.static_axes == [StaticAxis("x", 2, 8)]
    reports = check_parity(model, exporter.load_runner(path), [inputs, {"x": _x(3, 7, 8)}], atol=1e-3)
    assert [r.ok for r in reports] == [True, True] and max(r.max_abs_diff for r in reports) < 1e-5


class _SumsFirstRows(torch.nn.Module):
    """``min()`` over a size read from data: the trace records ``torch.sym_min`` on an unbacked SymInt."""

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= x.shape[0])
        return x[: min(k, 3)].sum(0)


def test_patch_edge_verifier_python_sym_ops(tmp_path):
    model, inputs = _SumsFirstRows(), {"x": _x(6, 4), "n": torch.tensor(5)}
    with without_workarounds("_patch_edge_verifier_python_sym_ops"):
        with pytest.raises(ExportStageError, match=r"check_valid_edge_op: assert op.__name__ in \(\"alloc\",\)"):
            ExecutorchExporter().export(model, inputs)
    exporter = ExecutorchExporter()
    manager = exporter.export(model, inputs)
    targets = [str(n.target) for n in manager.exported_program().graph.nodes if n.op == "call_function"]
    assert any("executorch_prim.sym_min.Scalar" in t for t in targets)  # the runtime's prim op, mapped by to_executorch
    assert not any("function sym_min" in t for t in targets)
    reports = check_parity(model, exporter.load_runner(exporter.save(manager, tmp_path)), [inputs, {"x": _x(6, 4), "n": torch.tensor(1)}], atol=1e-5)
    assert [r.ok for r in reports] == [True, True] and max(r.max_abs_diff for r in reports) == 0.0


#: (tiny family, the workarounds it needs, what the export says without them): the canary tier exports
#: each without them (test_refused_without_the_workaround), the fast tier with them.
REFUSED_WITHOUT = [
    ("DeepseekV2Model", ("_patch_deepseek_v2_rotary_as_real_pairs", "_patch_deepseek_v2_apply_rotary_real"), "complex"),
    ("Llama4TextModel", ("_patch_deepseek_v2_rotary_as_real_pairs", "_patch_llama4_apply_rotary_real"), "complex"),
    ("FNetModel", ("_patch_fnet_fourier_as_real_matmuls",), re.escape("aten._fft_")),
]


@pytest.mark.canary
@pytest.mark.parametrize(("model_class", "workarounds", "refusal"), REFUSED_WITHOUT, ids=[row[0] for row in REFUSED_WITHOUT])
def test_refused_without_the_workaround(model_class, workarounds, refusal):
    model = build(model_class)
    _refused_without(model, example_inputs(model), workarounds, refusal)


@pytest.mark.canary
def test_gpt2_attention_output_view_is_refused_without_reshapes():
    """The refusal half of test_gpt2_attention_output_view_lowers."""
    model, inputs = _tiny_gpt2()
    _refused_without(model, inputs, "_patch_views_reshaped_before_decomposition", r"Cannot view a tensor with shape torch.Size\(\[2, 8, 32\]\)")


@pytest.mark.parametrize(("model_class", "bound"), [("DeepseekV2Model", 1e-5), ("Llama4TextModel", 1e-4)])
def test_complex_rotary_in_real_arithmetic(tmp_path, model_class, bound):
    """DeepSeek-V2 and Llama 4 rotate queries and keys with complex numbers, which ExecuTorch lacks
    (the canary's REFUSED_WITHOUT); the patches carry the table as (cos, sin) pairs and write the
    complex product out."""
    model = build(model_class)
    report = _pte_parity(model, example_inputs(model), tmp_path, atol=1e-3)
    assert report.ok and report.max_abs_diff < bound  # eager multiplies complex numbers, the .pte real pairs


class _TopKMask(torch.nn.Module):
    """A top-k mask built with int32 indices (GLM-5 Next's sparse attention): gather and scatter_add."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        index = x.topk(3, dim=-1).indices.int()
        mask = torch.zeros(x.shape, dtype=torch.int32).scatter_add(-1, index, torch.ones_like(index))
        counts = torch.zeros(x.shape, dtype=torch.int32)
        counts.scatter_add_(-1, index, torch.ones_like(index))  # in place, as GLM-5 Next writes it
        return x.gather(-1, index), mask, counts


def test_fix_int32_gather_scatter_index(tmp_path):
    report = _refused_without_then_parity(
        _TopKMask(), {"x": _x(2, 4, 9)}, "_fix_int32_gather_scatter_index",
        r"mismatched dtypes", tmp_path, atol=1e-5,
    )
    assert report.ok and report.max_abs_diff == 0.0 and [leaf.shape for leaf in report.leaves] == [(2, 4, 3), (2, 4, 9), (2, 4, 9)]


class InPlaceUpdate(torch.nn.Module):
    def forward(self, state: torch.Tensor, x: torch.Tensor, scale: float):
        state.add_(x)
        return state * scale, x.sum()


def test_runner_drops_input_mutation_outputs_and_passes_scalars(tmp_path):
    model = InPlaceUpdate()
    inputs = {"state": torch.zeros(2, 3), "x": torch.ones(2, 3), "scale": 2.0}
    exporter = ExecutorchExporter()
    exporter.save(exporter.export(model, inputs), tmp_path)
    runner = exporter.load_runner(tmp_path / "model.pte")
    assert runner.skip_outputs == 1  # the mutated `state` comes first in ExecuTorch's outputs
    out = runner({"state": torch.zeros(2, 3), "x": torch.ones(2, 3), "scale": 2.0})
    assert [o.tolist() for o in out] == [[[2.0] * 3] * 2, 6.0]


class SharedLinear(torch.nn.Module):
    """Two methods over one 64x64 linear layer: ``step`` also updates ``state`` in place."""

    def __init__(self, linear: torch.nn.Linear, step: bool) -> None:
        super().__init__()
        self.linear, self.step = linear, step

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        if self.step:
            state.add_(x)
            return self.linear(state)
        return self.linear(x) * 2


def test_run_methods_lowers_one_program_with_a_method_per_module():
    """Two modules sharing a weight lowered in one call: one program with both methods, the weight stored
    once, each method's own count of mutated-input outputs, and each method equal to its module."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 64)
    modules = {"prefill": SharedLinear(linear, step=False).eval(), "decode": SharedLinear(linear, step=True).eval()}
    inputs = {"x": _x(2, 64), "state": torch.zeros(2, 64)}
    exporter = ExecutorchExporter()
    results = exporter.run_methods({name: (module, dict(inputs)) for name, module in modules.items()})
    assert list(results) == ["prefill", "decode"]
    manager = results["prefill"].program
    assert results["decode"].program is manager
    assert (results["prefill"].partitions, results["decode"].partitions) == ({"prefill": 1}, {"decode": 1})
    assert sorted(manager.methods) == ["decode", "prefill"]
    assert "lowering (to_edge_transform_and_lower)" in results["decode"].stage_seconds
    separate = [len(exporter.export(module, dict(inputs)).buffer) for module in modules.values()]
    weight = 64 * 64 * 4
    assert min(separate) > weight and len(manager.buffer) < min(separate) + weight // 2, (len(manager.buffer), separate)
    for name, module in modules.items():
        runner = ExecutorchRunner(manager.buffer, name)
        assert runner.skip_outputs == (1 if name == "decode" else 0)
        got = runner({"x": _x(2, 64), "state": torch.ones(2, 64)})
        with torch.no_grad():
            want = module(_x(2, 64), torch.ones(2, 64))
        assert len(got) == 1 and float((got[0] - want).abs().max()) < 1e-5
    with pytest.raises(ValueError, match=r"^the program has no method 'forward' \(it has \["):
        ExecutorchRunner(manager.buffer)
    prefill = ExecutorchRunner(manager.buffer, "prefill")
    decode = prefill.for_method("decode")
    assert decode.program is prefill.program and decode.skip_outputs == 1


def test_run_methods_refuses_configs_one_program_cannot_take():
    """One lowering takes one backend and one quantization, and needs a config for every method."""
    from hf_exporters.errors import InputError

    linear = torch.nn.Linear(4, 4)
    methods = {"a": (SharedLinear(linear, step=False), {"x": _x(2, 4), "state": torch.zeros(2, 4)}),
               "b": (SharedLinear(linear, step=False), {"x": _x(2, 4), "state": torch.zeros(2, 4)})}
    with pytest.raises(InputError, match=r"^one config per method: configs for \['a'\], methods \['a', 'b'\]$"):
        ExecutorchExporter().run_methods(methods, {"a": ExecutorchConfig()})
    with pytest.raises(InputError, match=r"^the methods of one program share quantize: None for 'a', '8da8w' for 'b'$"):
        ExecutorchExporter().run_methods(methods, {"a": ExecutorchConfig(), "b": ExecutorchConfig(quantize="8da8w")})


def test_runner_loads_bytes():
    model = _tiny_attention()
    manager = ExecutorchExporter().export(model, {"x": _x(2, 3, 8)})
    out = ExecutorchRunner(manager.buffer)({"x": _x(2, 3, 8)})
    assert float((out[0] - model(_x(2, 3, 8))).abs().max()) < 1e-5


# ── Stage 4: FX program fixes, each with the failure it removes ─────────────


def test_fix_unbounded_range_constraints_is_needed():
    shapes = [(2, 5, 8), (2, 9, 8)]
    without = _lower_and_run(_tiny_attention(), _x(2, 5, 8), [], shapes)
    assert without[0] < 1e-5
    assert "failed with error" in without[1]  # planned for the example's size: "Attempted to resize a bounded tensor"
    with_fix = _lower_and_run(_tiny_attention(), _x(2, 5, 8), [fx_program_fixes._fix_unbounded_range_constraints], shapes)
    assert max(with_fix) < 1e-5


def test_fix_unbounded_range_constraints_bounds():
    ep = torch.export.export(_tiny_attention(), (_x(2, 5, 8),), dynamic_shapes=({0: AUTO, 1: AUTO},))
    fx_program_fixes._fix_unbounded_range_constraints(ep)
    assert sorted(int(r.upper) for r in ep.range_constraints.values()) == [128, 128]


class _PositionTable(torch.nn.Module):
    """A learned position table sliced by the sequence length: the trace bounds ``seq_len <= 2048`` (the table's
    rows), as absolute-position decoders do with ``max_position_embeddings``; attention scores are ``seq x seq``."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(2048, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.table[: x.shape[1]]
        return torch.softmax(h @ h.transpose(1, 2), dim=-1) @ h


def _planned_bytes(ep: torch.export.ExportedProgram) -> int:
    from executorch.exir import to_edge_transform_and_lower

    program = to_edge_transform_and_lower(ep).to_executorch().executorch_program
    return sum(program.execution_plan[0].non_const_buffer_sizes)


def test_fix_unbounded_range_constraints_lowers_bounds_the_model_sets():
    """A sequence the model bounds at 2048 (a sliced position table) is planned for the export's bound (128, or
    ``max_seq_len``), not for 2048: the score buffers shrink 256-fold; a caller's own ``Dim(max=...)`` stands."""
    example = (_x(2, 5, 8),)

    def traced() -> torch.export.ExportedProgram:
        return torch.export.export(_PositionTable().eval(), example, dynamic_shapes=({0: AUTO, 1: AUTO},))

    as_traced = traced()
    from torch.utils._sympy.numbers import int_oo

    assert sorted(int(r.upper) for r in as_traced.range_constraints.values() if r.upper is not int_oo) == [2048]
    fixed = traced()
    fx_program_fixes._fix_unbounded_range_constraints(fixed)
    assert sorted(int(r.upper) for r in fixed.range_constraints.values()) == [128, 128]
    with fx_program_fixes.dynamic_dim_max(64):
        bounded = traced()
        fx_program_fixes._fix_unbounded_range_constraints(bounded)
    assert sorted(int(r.upper) for r in bounded.range_constraints.values()) == [64, 64]
    with fx_program_fixes.dynamic_dim_max(None, kept=frozenset({2048})):
        kept = traced()
        fx_program_fixes._fix_unbounded_range_constraints(kept)
    assert sorted(int(r.upper) for r in kept.range_constraints.values()) == [128, 2048]
    # batch 128 x 2048 x 2048 float scores before, batch 128 x 128 x 128 after
    assert _planned_bytes(kept) > 2 * 128 * 2048 * 2048 * 4 > 200 * _planned_bytes(fixed)
    assert fx_program_fixes.caller_maxima({"x": {1: torch.export.Dim("n", max=16)}}) == {16}
    assert fx_program_fixes.caller_maxima([{1: AUTO(max=64)}, {0: torch.export.Dim("b", max=4)}]) == {4, 64}
    assert fx_program_fixes.caller_maxima({"x": {0: AUTO, 1: torch.export.Dim("n")}, "y": None}) == frozenset()


class _NonzeroRows(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.nonzero()


def test_fix_unbounded_range_constraints_keeps_sizes_read_from_data():
    """``nonzero``'s row count is bounded by the data (4096 elements here), not planned: the bound stays, or its
    program would refuse more than 128 rows."""
    ep = torch.export.export(_NonzeroRows(), (torch.randn(4096),))
    fx_program_fixes._fix_unbounded_range_constraints(ep)
    assert [int(r.upper) for r in ep.range_constraints.values()] == [4096]


def _ids(batch: int, seq_len: int) -> torch.Tensor:
    return torch.randint(3, 100, (batch, seq_len), generator=torch.Generator().manual_seed(batch * seq_len))


def _one_layer_bert():
    import transformers

    config = transformers.BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=100)
    torch.manual_seed(0)
    return transformers.BertModel(config).eval()


def test_fix_size_hints_of_one_keeps_batch_one_programs_general():
    """A one-layer BertModel exported from a batch-1 example runs at batch 1 and batch 3 with the fix."""
    bound = fx_program_fixes._fix_unbounded_range_constraints
    with_fix = _lower_and_run(_one_layer_bert(), _ids(1, 5), [bound, fx_program_fixes._fix_size_hints_of_one], [(1, 5), (3, 4)], make=_ids)
    assert max(with_fix) < 1e-5


@pytest.mark.canary
def test_fix_size_hints_of_one_is_needed():
    """Without the fix the lowering builds the attention views for batch 1 and batch 3 fails at run time."""
    without = _lower_and_run(_one_layer_bert(), _ids(1, 5), [fx_program_fixes._fix_unbounded_range_constraints], [(1, 5), (3, 4)], make=_ids)
    assert without[0] < 1e-5
    assert "failed with error" in without[1]


# ── Stage 2: Torch patches ───────────────────────────────────────────────────


def test_patch_experts_batched_mm_swaps_grouped_and_eager():
    from transformers.integrations import moe

    batched = moe.ALL_EXPERTS_FUNCTIONS["batched_mm"]
    assert moe.ALL_EXPERTS_FUNCTIONS["grouped_mm"] is not batched
    with registry.apply_patches("executorch.xnnpack", select=lambda p: not p.startswith("executorch.")):
        assert moe.ALL_EXPERTS_FUNCTIONS.get_interface("grouped_mm", None) is batched
        assert moe.ALL_EXPERTS_FUNCTIONS.get_interface("eager", None) is batched
    assert moe.ALL_EXPERTS_FUNCTIONS.get_interface("grouped_mm", None) is not batched


def test_patch_experts_batched_mm_is_needed():
    """Without the patch a MoE block traces to aten.histc (not core ATen) and the
    transformers::grouped_mm_fallback custom op (no ExecuTorch kernel); with it the block runs in
    executorch.runtime with eager's numbers."""
    import transformers
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = transformers.MixtralConfig(hidden_size=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)
    config._experts_implementation = "grouped_mm"  # what from_pretrained / from_config pick
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(config).eval()
    for parameter in block.parameters():  # expert weights are torch.empty outside a PreTrainedModel
        torch.nn.init.normal_(parameter, std=0.2)
    x = _x(1, 6, 16)
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    with torch.no_grad():
        ep = torch.export.export(block, (x,))
    from torch._export.verifier import SpecViolationError

    with pytest.raises(SpecViolationError, match=r"Operator torch._ops.aten.histc.default is not in Core ATen opset"):
        to_edge_transform_and_lower(ep).to_executorch()
    with pytest.raises(RuntimeError, match=r"Missing out variants: \{'transformers::grouped_mm_fallback'\}"):
        to_edge_transform_and_lower(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
    exporter = ExecutorchExporter()
    manager = exporter.export(block, {"hidden_states": x}, ExecutorchConfig(backend="portable"))
    out = ExecutorchRunner(manager.buffer)({"hidden_states": x})
    with torch.no_grad():
        assert float((out[0] - block(x)).abs().max()) < 1e-5


@pytest.mark.parametrize(
    ("call", "expected_sizes"),
    [
        (lambda t: t.chunk(2, dim=-1), [3, 2]),
        (lambda t: torch.chunk(t, 3, -1), [2, 2, 1]),
        (lambda t: t.split(2, dim=-1), [2, 2, 1]),
        (lambda t: torch.split(t, [1, 4], dim=-1), [1, 4]),
    ],
)
def test_patch_chunk_and_split_as_narrow_match_torch(call, expected_sizes):
    t = _x(2, 3, 5)
    want = call(t)
    with registry.apply_patches("executorch.xnnpack", select=lambda p: not p.startswith("executorch.")) as paths:
        assert {"TensorBase.chunk", "TensorBase.split"} & set(paths) or {"Tensor.chunk", "Tensor.split"} <= set(paths), paths
        got = call(t)
    assert [g.shape[-1] for g in got] == expected_sizes
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_patch_split_keeps_torch_errors():
    with registry.apply_patches("executorch.xnnpack", select=lambda p: not p.startswith("executorch.")):
        with pytest.raises(RuntimeError, match="split_with_sizes expects split_sizes to sum exactly to 5"):
            _x(2, 5).split([1, 2], dim=-1)


def test_patch_chunk_as_narrow_traces_views():
    """The traced gated MLP has no split op left for ExecuTorch to verify (the case that needs the
    patch end to end is H1, Phi3ForCausalLM, in test_executorch_cases.py)."""

    class GatedMLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_up = torch.nn.Linear(8, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return torch.nn.functional.silu(gate) * up

    def ops(ep):
        return {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}

    model, example = GatedMLP().eval(), (_x(1, 5, 8),)
    assert "aten.chunk.default" in ops(torch.export.export(model, example))
    with registry.apply_patches("executorch.xnnpack", select=lambda p: not p.startswith("executorch.")):
        patched = ops(torch.export.export(model, example))
    assert not {"aten.chunk.default", "aten.split.Tensor", "aten.split_with_sizes.default"} & patched
    assert "aten.narrow.default" in patched or "aten.slice.Tensor" in patched


class _PatchShuffle(torch.nn.Module):
    """Random patch masking as masked-image models do it: keep the patches with the lowest noise."""

    def forward(self, patches: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = ids_shuffle.argsort(dim=1)
        kept = torch.gather(patches, 1, ids_shuffle[:, :3, None].expand(-1, -1, patches.shape[-1]))
        return kept * 2, ids_restore


def test_patch_argsort_as_topk(tmp_path):
    model = _PatchShuffle()
    generator = torch.Generator().manual_seed(3)
    inputs = {"patches": torch.randn(2, 6, 4, generator=generator), "noise": torch.rand(2, 6, generator=generator)}
    original = torch.argsort, torch.Tensor.argsort
    with registry.apply_patches("executorch.xnnpack", select=lambda p: not p.startswith("executorch.")):
        assert torch.argsort is not original[0]
        assert torch.equal(torch.argsort(inputs["noise"], dim=1), inputs["noise"].argsort(dim=1, stable=True))
        assert torch.equal(inputs["noise"].argsort(dim=0, descending=True), torch.sort(inputs["noise"], dim=0, descending=True).indices)
    assert (torch.argsort, torch.Tensor.argsort) == original  # restored after the trace
    exporter = ExecutorchExporter()
    path = exporter.save(exporter.export(model, inputs), tmp_path)
    (report,) = check_parity(model, exporter.load_runner(path), [inputs], atol=1e-5)
    assert report.max_abs_diff == 0.0  # the same patches kept and the same restore order


def test_missing_operator_kernels_are_named(tmp_path, monkeypatch):
    """Without the argsort patch the program calls aten::sort.values; loading it names the operator."""
    monkeypatch.setattr(registry, "_REGISTRY", [w for w in registry._REGISTRY if w.func.__name__ != "_patch_argsort_as_topk"])

    class Argsort(torch.nn.Module):
        def forward(self, x):
            return torch.argsort(x, dim=1)

    exporter = ExecutorchExporter()
    path = exporter.save(exporter.export(Argsort(), {"x": torch.rand(2, 5)}), tmp_path / "nested")
    with pytest.raises(RuntimeError) as caught:
        exporter.load_runner(path)
    assert str(caught.value) == (
        "Failed to load method forward, error: 0x:14: the program calls operators this ExecuTorch runtime has no "
        "kernel for: aten::sort.values (rewrite them at export with a patch or FX fix into ops the kernel library "
        "has, or link a kernel library that registers them)"
    )


def _refused_without(model, inputs, workaround, refusal):
    """Export ``model`` without ``workaround`` (a name or a tuple of names): the export must fail matching ``refusal``."""
    with without_workarounds(*([workaround] if isinstance(workaround, str) else workaround)):
        with pytest.raises(ExportStageError, match=refusal):
            ExecutorchExporter().export(model, inputs)


def _pte_parity(model, inputs, tmp_path, atol):
    """Export ``model`` with every workaround and return the parity report of the saved .pte run in executorch.runtime."""
    exporter = ExecutorchExporter()
    path = exporter.save(exporter.export(model, inputs), tmp_path)
    (report,) = check_parity(model, exporter.load_runner(path), [inputs], atol=atol)
    return report


def _refused_without_then_parity(model, inputs, workaround, refusal, tmp_path, atol):
    """:func:`_refused_without`, then :func:`_pte_parity`'s report."""
    _refused_without(model, inputs, workaround, refusal)
    return _pte_parity(model, inputs, tmp_path, atol)


class _SinkRowMax(torch.nn.Module):
    """Attention with sinks subtracts the row maximum before the softmax: ``max.dim`` over the last
    axis of a 4-D tensor, indices unused."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores - scores.max(dim=-1, keepdim=True).values, dim=-1)


def test_fix_max_dim_for_xnnpack(tmp_path):
    model, inputs = _SinkRowMax(), {"scores": _x(2, 4, 8, 9) * 10}
    report = _refused_without_then_parity(model, inputs, "_fix_max_dim_for_xnnpack", "amax.default only supports dim == 2 or dim == 3", tmp_path, atol=1e-5)
    assert report.ok and report.max_abs_diff < 1e-6


class _FirstCacheUpdate(torch.nn.Module):
    """A cache layer's first update: keys as a transposed view of the projection, concatenated onto the
    layer's empty starting tensor (transformers' ``DynamicLayer``), then reshaped to (batch * heads, sequence,
    head_dim) as Bloom does; ``cat`` returns a contiguous tensor, so the trace records the reshape as a view."""

    def forward(self, projected: torch.Tensor) -> torch.Tensor:
        batch, length, _ = projected.shape
        keys = projected.view(batch, length, 4, 16).transpose(1, 2)
        keys = torch.cat([torch.tensor([], dtype=projected.dtype), keys], dim=-2)
        return keys.reshape(batch * 4, -1, 16) * 2


def test_first_cache_update_view_lowers_as_a_reshape(tmp_path):
    """ExecuTorch's ``PruneEmptyTensorsPass`` drops the empty input, and the one-input ``cat`` is re-traced with the
    transposed keys' strides: the view Bloom's reshape was traced as is refused, unless it is re-traced as a reshape."""
    model, inputs = _FirstCacheUpdate(), {"projected": _x(2, 8, 64)}
    report = _refused_without_then_parity(
        model, inputs, "_patch_views_reshaped_before_decomposition",
        re.escape("Cannot view a tensor with shape torch.Size([2, 4, 8, 16]) and strides (512, 16, 64, 1) as a tensor with shape (8, 8, 16)"),
        tmp_path, atol=0,
    )
    assert report.ok and report.max_abs_diff == 0 and [leaf.shape for leaf in report.leaves] == [(8, 8, 16)]


def test_bloom_with_its_cache_lowers_and_matches_eager(tmp_path):
    """BloomModel with the config's ``use_cache``: its first cache update is the pattern above."""
    import transformers

    torch.manual_seed(0)
    model = transformers.BloomModel(transformers.BloomConfig(vocab_size=128, hidden_size=64, n_layer=2, n_head=4)).eval()
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    report = _pte_parity(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, tmp_path, atol=1e-4)
    assert report.ok and report.max_abs_diff < 1e-4
    assert len(report.leaves) == 5  # last_hidden_state and each layer's key and value


def _tiny_gpt2():
    import transformers

    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2Model(config).eval()
    return model, {"input_ids": torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))}


def test_gpt2_attention_output_view_lowers(tmp_path):
    """GPT-2 views SDPA's transposed output as (-1, hidden); the lowering re-traces SDPA with the CPU
    flash kernel's layout, which that recorded view cannot take (the canary tier's
    test_gpt2_attention_output_view_is_refused_without_reshapes), unless it is re-traced as a reshape."""
    model, inputs = _tiny_gpt2()
    report = _pte_parity(model, inputs, tmp_path, atol=1e-4)
    assert report.ok and report.max_abs_diff < 1e-5


class _Bucketize(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("boundaries", torch.arange(1, 8) / 8, persistent=False)

    def forward(self, coords: torch.Tensor) -> torch.Tensor:
        return torch.bucketize(coords, self.boundaries, right=True) * 10 + torch.bucketize(coords, self.boundaries)


def test_patch_bucketize_by_comparison(tmp_path):
    """Position ids by bucketize (Idefics3): not core ATen and no portable kernel; the patch's
    comparison count gives torch's buckets on both sides of a boundary, in the ExecuTorch runtime."""
    from hf_exporters.workarounds.executorch.torch_patches import _patch_bucketize_by_comparison

    ours = _patch_bucketize_by_comparison(torch.bucketize)
    values, edges = torch.tensor([[0.0, 0.125, 0.13, 0.5], [0.99, 1.0, -1.0, 0.875]]), torch.arange(1, 8) / 8
    for right in (False, True):
        assert torch.equal(ours(values, edges, right=right), torch.bucketize(values, edges, right=right))
    assert ours(values, edges, out_int32=True).dtype == torch.int32
    model, inputs = _Bucketize(), {"coords": torch.tensor([[0.0, 0.125, 0.3, 0.5, 0.75, 0.9999]])}
    report = _refused_without_then_parity(model, inputs, "_patch_bucketize_by_comparison", "aten.bucketize.Tensor is not in Core ATen opset", tmp_path, atol=0)
    assert report.ok and report.max_abs_diff == 0


class _FrameLengths(torch.nn.Module):
    """Packed vision towers' frame boundaries: each image's ``h * w`` repeated once per frame, summed up."""

    def forward(self, grid_thw: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        lengths = torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0])
        frames_of_rows = hidden.repeat_interleave(grid_thw[:, 0], dim=0)
        return torch.cat([lengths.cumsum(0), frames_of_rows.sum(-1).long()])


def test_patch_repeat_interleave_by_counts(tmp_path):
    """``repeat_interleave`` by a tensor of counts is not core ATen and has no portable kernel; the
    patch's gather gives torch's values (zero counts included) and runs in the ExecuTorch runtime."""
    from hf_exporters.workarounds.executorch.torch_patches import _patch_repeat_interleave_by_counts

    ours = _patch_repeat_interleave_by_counts(torch.repeat_interleave)
    counts, rows = torch.tensor([2, 0, 3, 1]), torch.arange(8).reshape(4, 2)
    for args, kwargs in (((counts,), {}), ((rows, counts), {"dim": 0}), ((rows.t(), counts), {"dim": 1}), ((rows[:, 0], counts), {}), ((rows, counts), {"dim": 0, "output_size": 6}), ((rows, counts[2:3]), {"dim": 0}), ((rows, torch.tensor(2)), {}), ((rows[:1], counts[:1]), {"dim": 0})):
        want, got = torch.repeat_interleave(*args, **kwargs), ours(*args, **kwargs)
        assert torch.equal(got, want) and got.dtype == want.dtype
    model = _FrameLengths()
    inputs = {"grid_thw": torch.tensor([[2, 4, 4], [1, 2, 6]]), "hidden": torch.arange(6.0).reshape(2, 3)}
    report = _refused_without_then_parity(model, inputs, "_patch_repeat_interleave_by_counts", "aten.repeat_interleave.Tensor is not in Core ATen opset", tmp_path, atol=0)
    assert report.ok and report.max_abs_diff == 0


class _GridFromData(torch.nn.Module):
    """A vision tower reading an image's patch grid as Python ints: an intermediate of shape
    ``(h, w, c)`` whose strides are sizes read from data, transposed and reduced."""

    def forward(self, grid: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
        h, w = grid.tolist()
        torch._check(h * w <= patches.shape[0])
        image = patches[: h * w].reshape(h, w, patches.shape[1])
        return image.transpose(0, 1).reshape(-1, patches.shape[1]).sum(0)


def test_patch_dim_order_from_positive_strides(tmp_path):
    """Strides that are sizes read from data: the lowering's dim order cannot compare ``4*u < 4``
    without the patch; with it the order holds (a transposed copy sorts its axes), and the program runs
    with eager's numbers."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from hf_exporters.workarounds.executorch.executorch_patches import _patch_dim_order_from_positive_strides

    env = ShapeEnv()
    u, v = env.create_unbacked_symint(), env.create_unbacked_symint()
    ours = _patch_dim_order_from_positive_strides(lambda stride: "original")
    assert ours((4 * u, 4, 1)) == (0, 1, 2)
    assert ours((v, u * v, 1)) == (1, 0, 2)  # a transposed (u, v) grid
    assert ours((12, 4, 1)) == "original"  # static strides are left to ExecuTorch
    assert ours((4 * u, 0, 1)) == "original"  # a 0 stride too (ExecuTorch refuses it by name)
    model, inputs = _GridFromData(), {"grid": torch.tensor([2, 3]), "patches": torch.randn(8, 4)}
    report = _refused_without_then_parity(model, inputs, "_patch_dim_order_from_positive_strides", r"Could not guard on data-dependent expression 4\*u\d+ < 4", tmp_path, atol=1e-5)
    assert report.ok and report.max_abs_diff < 1e-6


class _ChunkedCumsum(torch.nn.Module):
    """Mamba2's chunked scan: the length padded to whole chunks of 256, ``(batch, heads, chunks, 256)``,
    a cumulative sum within each chunk. Over lengths 4 to 128 there is one chunk, so the contiguous
    strides ``(1024*Max(1, c), 256*Max(1, c), 256, 1)`` hold two equal ones."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, length, heads)
        pad = (256 - x.shape[1] % 256) % 256
        chunks = torch.nn.functional.pad(x, (0, 0, 0, pad)).reshape(x.shape[0], -1, 256, x.shape[2])
        return torch.cumsum(chunks.permute(0, 3, 1, 2), dim=-1)


def test_patch_dim_order_keeps_equal_strides_row_major(tmp_path, monkeypatch):
    """Two strides each a multiple of the other are equal and keep row-major order. In the lowering of
    a Mamba2 prefill (Bamba), torch proved ``256 % (256*Max(1, c)) == 0`` and its converse but not the
    equality; taking the divisibility for "inside" labelled the contiguous tensor (0, 2, 1, 3), which
    the portable cumsum kernel refused at run time. That lowering's answers are replayed here; the
    chunked cumsum itself runs with eager's numbers."""
    from torch.export import Dim
    from torch.fx.experimental import symbolic_shapes
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from hf_exporters.workarounds.executorch.executorch_patches import _patch_dim_order_from_positive_strides

    env = ShapeEnv()
    length = env.create_unbacked_symint()
    torch._check(length >= 4)
    torch._check(length <= 128)
    chunks = torch.sym_max(1, (length + (256 - length % 256) % 256) // 256)
    undecided = {str(256 * chunks == 256), str(1024 * chunks == 1024)}
    real = symbolic_shapes.guard_or_false
    monkeypatch.setattr(symbolic_shapes, "guard_or_false", lambda expr: False if str(expr) in undecided else real(expr))
    ours = _patch_dim_order_from_positive_strides(lambda stride: "original")
    assert ours((1024 * chunks, 256 * chunks, 256, 1)) == (0, 1, 2, 3)
    assert ours((1024 * chunks, 1024, 4, 1)) == (0, 1, 2, 3)
    assert ours((chunks, 256 * chunks, 1)) == (1, 0, 2)  # a real transpose still sorts
    monkeypatch.setattr(symbolic_shapes, "guard_or_false", real)

    model, inputs = _ChunkedCumsum(), {"x": _x(2, 8, 4)}
    config = ExecutorchConfig(dynamic_shapes={"x": {0: Dim("batch", min=1, max=8), 1: Dim("length", min=4, max=128)}})
    exporter = ExecutorchExporter()
    run = exporter.load_runner(exporter.save(exporter.export(model, inputs, config), tmp_path))
    reports = check_parity(model, run, [inputs, {"x": _x(3, 21, 4)}], atol=1e-4)
    assert all(r.ok and r.max_abs_diff < 1e-4 for r in reports)


class _GatedRecurrence(torch.nn.Module):
    """A recurrent state of shape (batch, width) carried over the sequence by one scan op (as the Mamba,
    RG-LRU and RWKV replacements do): a carry and a stacked per-step output with a symbolic batch."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # (batch, length, width)
        from hf_exporters.workarounds.dynamo.recurrences import _linear_recurrence

        state = torch.zeros(x.shape[0], x.shape[2], dtype=x.dtype)
        last, states = _linear_recurrence(torch.sigmoid(x).transpose(0, 1), x.transpose(0, 1), state)
        return states.transpose(0, 1), last


def test_patch_scan_buffers_sized_at_run_time(tmp_path):
    """A dynamic scan's carry and stacked-output buffers take their run-time shapes: without the patch
    the program stops at the first call (the carry's copy into its upper-bound buffer); with it the
    loop gives eager's numbers at the example's sizes, at other batches and lengths (one step
    included) and again after a larger call."""
    model, inputs = _GatedRecurrence(), {"x": _x(2, 8, 4)}
    with without_workarounds("_patch_scan_buffers_sized_at_run_time"):
        exporter = ExecutorchExporter()
        run = exporter.load_runner(exporter.save(exporter.export(model, inputs, ExecutorchConfig(dynamic=True)), tmp_path / "without"))
        with pytest.raises(RuntimeError, match=re.escape("[op_copy.cpp:83] Check failed (tensor_is_broadcastable_to(src, in))")):
            run(inputs)
    exporter = ExecutorchExporter()
    run = exporter.load_runner(exporter.save(exporter.export(model, inputs, ExecutorchConfig(dynamic=True)), tmp_path / "with"))
    sets = [inputs, {"x": _x(3, 5, 4)}, {"x": _x(1, 1, 4)}, {"x": _x(5, 12, 4)}, inputs]
    reports = check_parity(model, run, sets, atol=1e-5)
    assert [r.ok for r in reports] == [True] * 5 and max(r.max_abs_diff for r in reports) < 1e-5


class _GaussianCutoff(torch.nn.Module):
    """Gemma 3n's activation sparsity: a cut-off at the normal quantile of a target sparsity."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        quantile = torch.distributions.normal.Normal(0, 1).icdf(torch.tensor(0.95))
        return torch.relu(x - x.mean(-1, keepdim=True) - x.std(-1, keepdim=True) * quantile) + torch.erfinv(torch.tanh(x))


def test_patch_erfinv_by_polynomial(tmp_path):
    model, inputs = _GaussianCutoff(), {"x": _x(2, 16) * 2}
    report = _refused_without_then_parity(model, inputs, "_patch_erfinv_by_polynomial", "aten.erfinv.default is not in Core ATen opset", tmp_path, atol=1e-4)
    assert report.ok and report.max_abs_diff < 1e-4


def test_runner_failure_names_what_the_runtime_logged(tmp_path):
    """The runtime logs why a call failed to file descriptor 2 and raises only an error code; the
    runner's error carries those log lines."""
    model = torch.nn.Linear(4, 3)
    exporter = ExecutorchExporter()
    run = exporter.load_runner(exporter.save(exporter.export(model, {"input": _x(2, 4)}), tmp_path))
    stderr_file = os.fstat(2).st_ino
    assert run({"input": _x(2, 4)})[0].shape == (2, 3)
    log = run._log
    for rows in (5, 7):  # the second failure's message holds only its own lines: the capture is emptied
        with pytest.raises(RuntimeError) as failure:
            run({"input": _x(rows, 4)})
        assert str(failure.value) == (
            "method->set_inputs() for method 'forward' failed with error 0x10: [tensor_impl.cpp:135] Attempted to resize a "
            f"static tensor. Expected shape (2, 4), but received ({rows}, 4).; [method.cpp:1240] Error resizing tensor at input 0"
        )
    assert run({"input": _x(2, 4)})[0].shape == (2, 3)  # descriptor 2 restored, the method still runs
    assert os.fstat(2).st_ino == stderr_file
    assert run._log is log and not log.closed  # one capture file per runner, not one per call


class _VideoPatchEmbed(torch.nn.Module):
    """Qwen2-VL's patch embedding: every (2, 4, 4) patch of a frame pair embedded by a strided Conv3d."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4), bias=True)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.proj(pixel_values.view(-1, 3, 2, 4, 4)).view(-1, 8)


def test_patch_conv3d_patchify_as_conv2d(tmp_path):
    """A patchifying Conv3d lowers without the patch and fails in the runtime (no 3-D convolution
    kernel); with it the program gives eager's numbers. Other 3-D convolutions go to torch's."""
    from hf_exporters.workarounds.executorch.torch_patches import _patch_conv3d_patchify_as_conv2d

    torch.manual_seed(0)
    ours = _patch_conv3d_patchify_as_conv2d(torch.nn.functional.conv3d)
    x, weight, bias = _x(2, 4, 5, 7, 11), _x(8, 4, 2, 3, 5), _x(8)
    want, got = torch.nn.functional.conv3d(x, weight, bias, (2, 3, 5)), ours(x, weight, bias, (2, 3, 5))  # cropped to whole patches
    assert got.shape == want.shape == (2, 8, 2, 2, 2) and got.is_contiguous() and (got - want).abs().max() < 1e-4
    assert torch.equal(ours(x, weight, bias, 1, 1), torch.nn.functional.conv3d(x, weight, bias, 1, 1))
    model, inputs = _VideoPatchEmbed().eval(), {"pixel_values": _x(6, 96)}
    with without_workarounds("_patch_conv3d_patchify_as_conv2d"):
        exporter = ExecutorchExporter()
        run = exporter.load_runner(exporter.save(exporter.export(model, inputs), tmp_path / "conv3d"))
        with pytest.raises(RuntimeError, match=r"Expect input tensor to be 3-D or 4-D, but got, 5"):
            run(inputs)
    exporter = ExecutorchExporter()
    run = exporter.load_runner(exporter.save(exporter.export(model, inputs), tmp_path / "conv2d"))
    (report,) = check_parity(model, run, [inputs], atol=1e-5)
    assert report.ok and report.max_abs_diff < 1e-5


class _ResizedPositions(torch.nn.Module):
    """SigLIP 2's position embeddings: a (1, C, 4, 4) grid resized, antialiased, to a size read from data."""

    def __init__(self) -> None:
        super().__init__()
        self.grid = torch.nn.Parameter(torch.randn(1, 3, 4, 4))

    def forward(self, spatial_shape: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
        height, width = spatial_shape.tolist()
        torch._check(height > 0)
        torch._check(width > 0)
        torch._check(height * width <= patches.shape[0])
        resized = torch.nn.functional.interpolate(self.grid, size=(height, width), mode="bilinear", align_corners=False, antialias=True)
        positions = resized.reshape(3, -1).t()
        return torch.nn.functional.pad(positions, (0, 0, 0, patches.shape[0] - positions.shape[0])) + patches


def test_patch_antialiased_bilinear_to_sizes_from_data(tmp_path):
    """The antialiased resize to a size read from data lowers without the patch and fails in the
    runtime (the kernel does not resize its output); with it the program gives eager's numbers, also on
    a grid shape other than the traced one. The weights equal torch's kernel when shrinking and growing."""
    from hf_exporters.workarounds.executorch.torch_patches import _antialiased_bilinear_weights

    torch.manual_seed(0)
    grid = _x(1, 2, 7, 13)
    for height, width in ((3, 5), (2, 9), (11, 20), (7, 13)):
        want = torch.nn.functional.interpolate(grid, size=(height, width), mode="bilinear", antialias=True)
        got = _antialiased_bilinear_weights(height, 7, grid) @ grid @ _antialiased_bilinear_weights(width, 13, grid).t()
        assert (got - want).abs().max() < 1e-5, (height, width)
    model, inputs = _ResizedPositions().eval(), {"spatial_shape": torch.tensor([2, 6]), "patches": _x(16, 3)}
    with without_workarounds("_patch_antialiased_bilinear_to_sizes_from_data"):
        exporter = ExecutorchExporter()
        run = exporter.load_runner(exporter.save(exporter.export(model, inputs), tmp_path / "kernel"))
        with pytest.raises(RuntimeError, match=re.escape("Check failed (out.size(2) == output_size[0])")):
            run(inputs)
    exporter = ExecutorchExporter()
    run = exporter.load_runner(exporter.save(exporter.export(model, inputs), tmp_path / "matmul"))
    reports = check_parity(model, run, [inputs, {**inputs, "spatial_shape": torch.tensor([5, 3])}], atol=1e-5)
    assert [r.ok for r in reports] == [True, True] and max(r.max_abs_diff for r in reports) < 1e-5


class _SpecialTokenSpans(torch.nn.Module):
    """Grounding DINO's text bookkeeping: each token's previous special token (a running maximum of
    positions) and next one (a flipped running minimum), and the running-maximum indices."""

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        special = input_ids < 3
        previous = torch.cummax(torch.where(special, positions, -1), dim=1)
        following = torch.where(special, positions, input_ids.shape[1]).flip(1).cummin(1).values.flip(1)
        return previous.values, following, previous.indices


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
@pytest.mark.parametrize(("shape", "dim"), [((7,), 0), ((1,), 0), ((3, 9), 1), ((4, 5, 3), 0), ((2, 3, 8), -1), ((3, 0), 1), ((0, 4), 0), ((0, 4), 1)])
def test_cummax_and_cummin_of_integers_match_torch(shape, dim, dtype, largest):
    """Under the patches, values and indices equal torch's: ties (small integers tie often), the
    dtype's extreme values (the fill of positions not yet seen), empty axes, method and keyword calls."""
    info = torch.iinfo(dtype)
    generator = torch.Generator().manual_seed(len(shape) + dim)
    x = torch.tensor([info.min, info.min + 1, 0, 1, info.max - 1, info.max], dtype=dtype)[torch.randint(0, 6, shape, generator=generator)]
    expected = [torch.cummax(x, dim), x.cummax(dim=dim)] if largest else [torch.cummin(x, dim), x.cummin(dim=dim)]
    originals = torch.cummax, torch.cummin
    with registry.apply_patches("executorch.xnnpack", select=lambda p: not p.startswith("executorch.")):
        assert (torch.cummax, torch.cummin) != originals
        got = [torch.cummax(x, dim), x.cummax(dim=dim)] if largest else [torch.cummin(x, dim), x.cummin(dim=dim)]
    for result, reference in zip(got, expected):
        assert torch.equal(result.values, reference.values) and torch.equal(result.indices, reference.indices)


def test_cummax_and_cummin_export_for_executorch(tmp_path):
    inputs = {"input_ids": torch.tensor([[0, 5, 7, 1, 9, 9, 2, 8], [4, 4, 0, 6, 6, 6, 6, 1]])}
    report = _refused_without_then_parity(
        _SpecialTokenSpans(), inputs,
        ("_patch_cummax_of_integers_as_core_ops", "_patch_cummin_of_integers_as_core_ops"),
        re.escape("aten.cummax.default is not in Core ATen opset"), tmp_path, atol=0,
    )
    assert report.ok and report.max_abs_diff == 0.0
    floats = torch.tensor([[0.5, float("nan"), 0.2]])
    original = torch.cummax
    with registry.apply_patches("executorch.xnnpack", select=lambda p: not p.startswith("executorch.")):
        assert torch.cummax is not original  # the patch is installed
        kept = torch.cummax(floats, 1)  # floating input: torch's own, NaN propagation included
    assert torch.equal(kept.indices, torch.tensor([[0, 1, 1]])) and torch.isnan(kept.values[0, 1:]).all()


@pytest.mark.parametrize("shape", [(2, 8, 16), (1, 13, 7), (3, 128, 32)])
def test_real_dft2_equals_the_real_part_of_fftn(shape):
    from hf_exporters.workarounds.executorch.complex_numbers import _real_dft2

    x = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[1]))
    expected = torch.fft.fftn(x, dim=(1, 2)).real
    assert float((_real_dft2(x) - expected).abs().max()) < 1e-6 * float(expected.abs().max()) * shape[1]


def test_fnet_fourier_mixing_exports_for_executorch(tmp_path):
    """FNet mixes tokens with complex FFTs, which are not core ATen (the canary's REFUSED_WITHOUT); the
    patch writes the real part out as cosine and sine matrix products, and the .pte matches eager."""
    model = build("FNetModel")
    report = _pte_parity(model, example_inputs(model), tmp_path, atol=1e-3)
    assert report.ok and report.max_abs_diff < 1e-4


class _PositionTaps(torch.nn.Module):
    """A learned position table resampled per patch: a weighted sum of ``taps`` rows (Kimi-K2.5)."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(16, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, taps: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        summed = torch.nn.functional.embedding_bag(taps, self.table, per_sample_weights=weights, mode="sum")
        return summed + torch.nn.functional.embedding_bag(taps, self.table, mode="max")


def test_patch_embedding_bag_as_gather_and_reduce(tmp_path):
    """``F.embedding_bag`` leaves ``aten._embedding_bag`` in the program, which ExecuTorch's kernels
    lack (the load fails, naming the operator); the patch's gather and reduction give torch's values
    for every mode and run in the ExecuTorch runtime."""
    import torch.nn.functional as F

    from hf_exporters.workarounds.executorch.torch_patches import _patch_embedding_bag_as_gather_and_reduce

    ours = _patch_embedding_bag_as_gather_and_reduce(F.embedding_bag)
    table, taps, weights = torch.randn(16, 8), torch.randint(0, 16, (5, 4)), torch.rand(5, 4)
    assert torch.allclose(ours(taps, table, per_sample_weights=weights, mode="sum"), F.embedding_bag(taps, table, per_sample_weights=weights, mode="sum"), atol=1e-6)
    for mode in ("sum", "mean", "max"):
        assert torch.equal(ours(taps, table, mode=mode), F.embedding_bag(taps, table, mode=mode))
    offsets = torch.tensor([0, 2])
    assert torch.equal(ours(taps[0], table, offsets), F.embedding_bag(taps[0], table, offsets))  # 1-D with offsets: torch's op
    model, inputs = _PositionTaps(), {"taps": taps, "weights": weights}
    with without_workarounds("_patch_embedding_bag_as_gather_and_reduce"):
        exporter = ExecutorchExporter()
        path = exporter.save(exporter.export(model, inputs), tmp_path / "without")
        with pytest.raises(RuntimeError, match=r"no kernel for: aten::_embedding_bag\.out"):
            exporter.load_runner(path)
    exporter = ExecutorchExporter()
    path = exporter.save(exporter.export(model, inputs), tmp_path / "with")
    (report,) = check_parity(model, exporter.load_runner(path), [inputs], atol=1e-5)
    assert report.ok and report.max_abs_diff < 1e-5


class _SegmentMeans(torch.nn.Module):
    """Per-segment averages of token values: ``zeros(segments).scatter_reduce(..., "mean")`` (TAPAS's cells)."""

    def forward(self, values: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
        means = torch.zeros(6).scatter_reduce(0, segment, values, reduce="mean", include_self=False)
        peaks = torch.full((6,), -1.0).scatter_reduce(0, segment, values, reduce="amax")
        return means + peaks


def test_patch_scatter_reduce_1d_by_scatter_add(tmp_path):
    """1-D ``scatter_reduce`` leaves ``aten.scatter_reduce`` in the program, which ExecuTorch's kernels
    lack; the patch gives torch's values for every reduction, with and without ``self``, and an
    untouched segment keeps its value."""
    from hf_exporters.workarounds.executorch.torch_patches import _patch_scatter_reduce_1d_by_scatter_add

    ours = _patch_scatter_reduce_1d_by_scatter_add(torch.scatter_reduce)
    start = torch.randn(6, generator=torch.Generator().manual_seed(1))
    segment = torch.tensor([0, 2, 2, 5, 0, 2, 1])  # segments 3 and 4 receive nothing
    values = torch.randn(7, generator=torch.Generator().manual_seed(2))
    for reduce in ("sum", "mean", "amax", "amin"):
        for include_self in (True, False):
            expected = torch.scatter_reduce(start, 0, segment, values, reduce=reduce, include_self=include_self)
            got = ours(start, 0, segment, values, reduce, include_self=include_self)
            assert torch.allclose(got, expected, atol=1e-6), (reduce, include_self)
    nothing = torch.tensor([], dtype=torch.long)
    for reduce in ("sum", "mean", "amax", "amin"):  # an empty index leaves self as it is
        assert torch.equal(ours(start, 0, nothing, values[:0], reduce, include_self=False), start)
    many = torch.randn(3000, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    spots = torch.randint(0, 6, (3000,), generator=torch.Generator().manual_seed(4))
    for reduce in ("sum", "mean"):  # bf16 sums onto self round as torch's do
        assert torch.equal(ours(start.bfloat16(), 0, spots, many, reduce), torch.scatter_reduce(start.bfloat16(), 0, spots, many, reduce))
    method = _patch_scatter_reduce_1d_by_scatter_add(torch.Tensor.scatter_reduce)  # as the Tensor method: no out=
    grid = torch.zeros(2, 6)
    assert torch.equal(method(grid, 1, segment[None, :6].expand(2, 6), values[None, :6].expand(2, 6), "amax"),
                       grid.scatter_reduce(1, segment[None, :6].expand(2, 6), values[None, :6].expand(2, 6), "amax"))
    assert torch.equal(  # 2-D: torch's op
        ours(grid, 1, segment[None, :6].expand(2, 6), values[None, :6].expand(2, 6), "sum"),
        torch.scatter_reduce(grid, 1, segment[None, :6].expand(2, 6), values[None, :6].expand(2, 6), "sum"),
    )
    model, inputs = _SegmentMeans(), {"values": values, "segment": segment}
    with without_workarounds("_patch_scatter_reduce_1d_by_scatter_add"):
        exporter = ExecutorchExporter()
        path = exporter.save(exporter.export(model, inputs), tmp_path / "without")
        with pytest.raises(RuntimeError, match=r"no kernel for: aten::scatter_reduce"):
            exporter.load_runner(path)
    exporter = ExecutorchExporter()
    path = exporter.save(exporter.export(model, inputs), tmp_path / "with")
    (report,) = check_parity(model, exporter.load_runner(path), [inputs], atol=1e-5)
    assert report.ok and report.max_abs_diff < 1e-5


class _ValidFrames(torch.nn.Module):
    """Frames kept by a mask, found with ``nonzero(...).squeeze(-1)`` (an audio encoder's valid frames)."""

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = torch.nonzero(mask[0]).squeeze(-1)
        return frames[:, keep].sum(dim=1)


def test_fix_squeeze_of_nonzero_made_contiguous(tmp_path):
    """``nonzero``'s column-major output squeezed: the portable kernel refuses the differing dim orders
    when the program runs; with a contiguous copy in between the program matches eager."""
    model = _ValidFrames()
    inputs = {"frames": torch.arange(24.0).reshape(2, 6, 2), "mask": torch.tensor([[1, 0, 1, 1, 0, 1]])}
    with without_workarounds("_fix_squeeze_of_nonzero_made_contiguous"):
        exporter = ExecutorchExporter()
        runner = exporter.load_runner(exporter.save(exporter.export(model, inputs), tmp_path / "without"))
        with pytest.raises(RuntimeError, match="different dim orders"):
            runner(inputs)
    exporter = ExecutorchExporter()
    path = exporter.save(exporter.export(model, inputs), tmp_path / "with")
    (report,) = check_parity(model, exporter.load_runner(path), [inputs], atol=0)
    assert report.ok and report.max_abs_diff == 0


class _TwoTables(torch.nn.Module):
    """``ids`` indexes a 50-row table through a view and a 20-row table directly; ``shifted`` only after an
    ``add`` (its values are not the table's indices, so it gets no bound); ``scale`` is a float input."""

    def __init__(self):
        super().__init__()
        self.words, self.small, self.other = torch.nn.Embedding(50, 8), torch.nn.Embedding(20, 8), torch.nn.Embedding(30, 8)

    def forward(self, scale, ids, shifted):
        return scale * (self.words(ids.reshape(-1)).reshape(*ids.shape, 8) + self.small(ids) + self.other(shifted + 1))


def test_the_runner_refuses_an_index_outside_the_table_it_indexes(tmp_path):
    """The program records, per input that indexes an embedding table (directly or through a view), the
    fewest rows among its tables; the runner refuses an index outside them before ``execute``."""
    from hf_exporters.errors import InputError
    from hf_exporters.exporters.executorch import input_index_bounds

    model = _TwoTables().eval()
    inputs = {"scale": torch.ones(1), "ids": torch.tensor([[1, 2, 3]]), "shifted": torch.tensor([[4, 5, 6]])}
    exporter = ExecutorchExporter()
    result = exporter.run(model, inputs, ExecutorchConfig())
    assert input_index_bounds(result.program.exported_program()) == [1, 20, 0]
    runner = exporter.load_runner(exporter.save(result.program, tmp_path / "model.pte"))
    assert runner.index_bounds == {1: (20, 0)}
    torch.testing.assert_close(runner(inputs)[0], model(**inputs), rtol=0, atol=1e-5)
    with pytest.raises(InputError) as caught:
        runner({**inputs, "ids": torch.tensor([[1, 20, 3]])})
    assert str(caught.value) == "input 'ids' holds the index 20, outside the 20 rows of the embedding table it indexes (valid: 0 to 19)"


class _CastAndWrite(torch.nn.Module):
    """``ids`` (int32) indexes a 30-row table after a cast; ``at`` names the rows of a 4-row state written
    with ``index_copy`` (a cache written at its positions)."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(30, 8)
        self.register_buffer("state", torch.zeros(4, 8))

    def forward(self, ids, at):
        rows = self.table(ids.long())  # (1, n, 8)
        return self.state.clone().index_copy(0, at, rows[0])


def test_bounds_follow_casts_and_cover_written_axes(tmp_path):
    from hf_exporters.errors import InputError
    from hf_exporters.exporters.executorch import input_index_bounds

    model = _CastAndWrite().eval()
    inputs = {"ids": torch.tensor([[3, 7]], dtype=torch.int32), "at": torch.tensor([1, 2])}
    exporter = ExecutorchExporter()
    result = exporter.run(model, inputs, ExecutorchConfig())
    assert input_index_bounds(result.program.exported_program()) == [0, 30, 0, 1, 4, 1]
    runner = exporter.load_runner(exporter.save(result.program, tmp_path / "model.pte"))
    torch.testing.assert_close(runner(inputs)[0], model(**inputs), rtol=0, atol=1e-6)
    for bad, message in [
        ({"ids": torch.tensor([[3, 30]], dtype=torch.int32)}, "input 'ids' holds the index 30, outside the 30 rows of the embedding table it indexes (valid: 0 to 29)"),
        ({"at": torch.tensor([1, 4])}, "input 'at' holds the index 4, outside the 4 positions of the axis it indexes (valid: 0 to 3)"),
    ]:
        with pytest.raises(InputError) as caught:
            runner({**inputs, **bad})
        assert str(caught.value) == message


class _RowsTimesState(torch.nn.Module):
    """``x (2, n)`` times a ``(2, 1)`` state: the rows are traced at 2 (the state's), the length is dynamic."""

    def __init__(self):
        super().__init__()
        self.register_buffer("state", torch.tensor([[2.0], [3.0]]))

    def forward(self, x):
        return x * self.state


def test_the_runner_refuses_another_size_on_an_axis_a_dynamic_program_keeps_static(tmp_path):
    """A dynamic program records the axes its trace kept at one size; the runner refuses another size there
    before ``execute`` (ExecuTorch accepts any shape within the planned bounds), and a static program
    records none (ExecuTorch refuses to resize its inputs)."""
    from hf_exporters.errors import InputError
    from hf_exporters.exporters.executorch import input_static_axes

    model, inputs = _RowsTimesState().eval(), {"x": torch.arange(10.0).reshape(2, 5)}
    exporter = ExecutorchExporter()
    result = exporter.run(model, inputs, ExecutorchConfig(dynamic_shapes={"x": {1: torch.export.Dim("n", min=2, max=16)}}))
    assert input_static_axes(result.program.exported_program()) == [0, 0, 2]
    runner = exporter.load_runner(exporter.save(result.program, tmp_path / "model.pte"))
    assert runner.static_axes == [(0, 0, 2)]
    longer = {"x": torch.arange(14.0).reshape(2, 7)}
    torch.testing.assert_close(runner(longer)[0], model(**longer), rtol=0, atol=0)
    with pytest.raises(InputError) as caught:
        runner({"x": torch.ones(1, 7)})
    assert str(caught.value) == "input 'x' is 1 long on axis 0, which the program was exported for at 2 only"
    static = exporter.run(model, inputs, ExecutorchConfig())
    assert input_static_axes(static.program.exported_program()) == []
    # what ExecuTorch refuses with a log line alone, or drops, is refused naming the input
    for bad, message in [
        ({"x": torch.ones(2, 7, dtype=torch.float64)}, "input 'x' is torch.float64, where the program takes torch.float32"),
        ({"x": torch.ones(2, 17)}, "input 'x' axis 1 is 17, the program was exported for at most 16 (re-export with a bound of 17 or more: "
                                     "--max-seq-len, ExecutorchConfig.max_seq_len, or the axis's Dim max in dynamic_shapes)"),
        ({"x": torch.ones(2, 7).numpy()}, "input 'x' is a numpy.ndarray: the runner takes torch tensors"),
        ({"x": [1.0, 2.0]}, "input 'x' is a builtins.list: the runner takes torch tensors"),
        ({}, "the method takes 1 input; 0 given ()"),
        ({"x": torch.ones(2, 7), "y": torch.ones(2, 7)}, "the method takes 1 input; 2 given ('x', 'y')"),
    ]:
        with pytest.raises(InputError) as caught:
            runner(bad)
        assert str(caught.value) == message


def test_export_leaves_the_callers_model_in_its_dtype_and_mode(tmp_path):
    """XNNPACK computes in float32: Stage 1 casts a copy of a bfloat16 model; the caller's parameters keep their
    dtype and values, and its training flags come back."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).to(torch.bfloat16).train()
    weight = model[0].weight.detach().clone()
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    exporter = ExecutorchExporter()
    runner = exporter.load_runner(exporter.save(exporter.export(model, {"input": x}), tmp_path))
    assert model[0].weight.dtype == torch.bfloat16 and torch.equal(model[0].weight, weight)
    assert model.training and model[1].training
    with torch.no_grad():
        expected = model.float().eval()[0](x.float())
    (actual,) = runner({"input": x.float()})
    torch.testing.assert_close(torch.as_tensor(actual), expected, atol=1e-5, rtol=0)


class _ReassignedTable(torch.nn.Module):
    """A table buffer reassigned in forward before it is read, as CTRL moves its positional encoding."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(1.0, 13.0).reshape(6, 2), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        self.table = self.table.to(device=positions.device, dtype=torch.float32)
        return self.table[positions] * 2


def test_patch_initial_values_of_mutated_buffers(tmp_path):
    """ExecuTorch serialises a mutated buffer without its data unless asked to keep it: the program read
    uninitialised memory where the model reads its table."""
    from hf_exporters.workarounds.executorch.mutable_buffers import initialized_mutable_buffers

    model, inputs = _ReassignedTable().eval(), {"positions": torch.tensor([[0, 5, 2]])}
    exporter = ExecutorchExporter()
    result = exporter.run(model, inputs)
    assert initialized_mutable_buffers(result.program.exported_program()) == ["b_table"]
    assert "_patch_initial_values_of_mutated_buffers" in [w.func.__name__ for w in result.workarounds_fired]
    runner = exporter.load_runner(exporter.save(result.program, tmp_path))
    (report,) = check_parity(model, runner, [inputs], atol=0)
    assert report.ok and report.max_abs_diff == 0
    (out,) = runner(inputs)
    assert torch.as_tensor(out).tolist() == [[[2.0, 4.0], [22.0, 24.0], [10.0, 12.0]]]


class _ConvThenSoftmax(torch.nn.Module):
    """A 1x1 convolution, then a softmax over the width (MobileViTV2's linear self-attention scores)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.conv(x)
        return torch.softmax(scores, dim=-1), torch.log_softmax(scores, dim=-1)


def test_patch_xnnpack_softmax_in_model_layout(tmp_path):
    """Without the patch XNNPACK normalises the convolution's NHWC output over the channels: wrong values, no error."""
    model, inputs = _ConvThenSoftmax().eval(), {"x": _x(2, 8, 4, 16)}
    with without_workarounds("_patch_xnnpack_softmax_in_model_layout"):
        exporter = ExecutorchExporter()
        runner = exporter.load_runner(exporter.save(exporter.export(model, inputs), tmp_path / "without"))
        (wrong,) = check_parity(model, runner, [inputs], atol=1e-5, raise_on_mismatch=False)
    assert not wrong.ok and wrong.max_abs_diff > 0.1
    report = _pte_parity(model, inputs, tmp_path / "with", atol=1e-5)
    assert report.ok and report.max_abs_diff < 1e-5 and [leaf.shape for leaf in report.leaves] == [(2, 4, 4, 16)] * 2


class _PReLUOverTokens(torch.nn.Module):
    """A feed-forward layer with ``nn.PReLU`` over (batch, tokens, features), as DAB-DETR's encoder has it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)
        self.act = torch.nn.PReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


def test_patch_xnnpack_prelu_on_4d_inputs(tmp_path):
    model, inputs = _PReLUOverTokens().eval(), {"x": _x(2, 4, 8)}
    with torch.no_grad():
        model.act.weight.fill_(0.25)  # a slope that is not PReLU's default, so the negative side is checked
    report = _refused_without_then_parity(
        model, inputs, "_patch_xnnpack_prelu_on_4d_inputs", "An error occurred when running the 'ChannelsLastTaggedReshapePass' pass",
        tmp_path, atol=1e-6,
    )
    assert report.ok and report.max_abs_diff < 1e-6
    # over a 4-D input XNNPACK still runs it: a convolution, then PReLU, in one partition
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.PReLU(4)).eval()
    result = ExecutorchExporter().run(conv, {"input": _x(1, 3, 8, 8)})
    assert result.partitions == {"forward": 1}
    assert not [n for n in result.program.exported_program().graph.nodes if "prelu" in str(n.target) or "where" in str(n.target)]


class _OutputAndItsContiguousCopy(torch.nn.Module):
    """A projection transposed, returned as it is and as a contiguous copy (PeAudioEncoder's pattern): XNNPACK's
    passes drop the copy, and the partition then returns one value at two output positions."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.proj(x).permute(0, 2, 1)
        return y, y.contiguous()


def test_patch_xnnpack_repeated_partition_outputs(tmp_path):
    model, inputs = _OutputAndItsContiguousCopy().eval(), {"x": _x(2, 4, 8)}
    report = _refused_without_then_parity(
        model, inputs, "_patch_xnnpack_repeated_partition_outputs", "Output node 'aten_permute_copy_default' is already in the inputs", tmp_path, atol=1e-6
    )
    assert report.ok and report.max_abs_diff < 1e-6 and [leaf.shape for leaf in report.leaves] == [(2, 8, 4)] * 2


class _TensorsAndSizes(torch.nn.Module):
    """Returns its input's sizes between two tensors, as MaskFormerSwin returns its spatial dimensions: ints the
    trace makes constant outputs of the program."""

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        return {"doubled": x * 2, "sizes": (x.shape[1], x.shape[2]), "shifted": x + 1}


def test_the_runner_returns_the_output_tensors_only(tmp_path):
    model, inputs = _TensorsAndSizes(), {"x": _x(2, 3, 4)}
    exporter = ExecutorchExporter()
    runner = exporter.load_runner(exporter.save(exporter.export(model, inputs), tmp_path))
    outputs = runner(inputs)
    assert [tuple(o.shape) for o in outputs] == [(2, 3, 4), (2, 3, 4)]
    torch.testing.assert_close(outputs[1], inputs["x"] + 1, rtol=0, atol=0)
    (report,) = check_parity(model, runner, [inputs], atol=1e-6)
    assert report.ok and [leaf.name for leaf in report.leaves] == ["doubled", "shifted"]


class _FilledBySlices(torch.nn.Module):
    """A buffer allocated with ``new_empty`` and filled slice by slice (BailingHybrid's ``expand_kv``)."""

    def forward(self, nope: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        key = nope.new_empty(*nope.shape[:-1], nope.shape[-1] + rot.shape[-1])
        key[..., : nope.shape[-1]].copy_(nope)
        key[..., nope.shape[-1] :].copy_(rot)
        return key * 2


def test_fix_empty_of_symbolic_size_as_full(tmp_path):
    """Without the fix the lowering silently specialises the dynamic batch and length to the example's (the
    program refuses any other size); with it the .pte runs other sizes and matches eager."""
    model = _FilledBySlices()
    inputs = {"nope": _x(2, 5, 6), "rot": _x(2, 5, 2)}
    other = {"nope": _x(3, 7, 6), "rot": _x(3, 7, 2)}
    exporter = ExecutorchExporter()
    with without_workarounds("_fix_empty_of_symbolic_size_as_full"):
        path = exporter.save(exporter.export(model, inputs, ExecutorchConfig(dynamic=True)), tmp_path / "without")
        with pytest.raises(InputError, match=re.escape("input 'nope' is 3 long on axis 0, which the program was exported for at 2 only")):
            exporter.load_runner(path)(other)
    path = exporter.save(exporter.export(model, inputs, ExecutorchConfig(dynamic=True)), tmp_path / "with")
    reports = check_parity(model, exporter.load_runner(path), [inputs, other], atol=0)
    assert [r.ok for r in reports] == [True, True] and max(r.max_abs_diff for r in reports) == 0


class _FilledLike(torch.nn.Module):
    """``empty_like`` filled slice by slice."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        y[:, :2].copy_(x[:, :2])
        y[:, 2:].copy_(x[:, 2:] * 3)
        return y + 1


def test_fix_empty_like_of_symbolic_size_as_full_like(tmp_path):
    """``empty_like`` of a dynamic tensor decomposes to ``empty_permuted``, which the lowering refuses; as a
    contiguous ``full_like`` it lowers and runs other sizes."""
    model, inputs, other = _FilledLike(), {"x": _x(2, 5)}, {"x": _x(3, 7)}
    with without_workarounds("_fix_empty_of_symbolic_size_as_full"):
        with pytest.raises(ExportStageError, match=re.escape("aten.empty_permuted.default is not in Core ATen opset")):
            ExecutorchExporter().export(model, inputs, ExecutorchConfig(dynamic=True))
    exporter = ExecutorchExporter()
    path = exporter.save(exporter.export(model, inputs, ExecutorchConfig(dynamic=True)), tmp_path)
    reports = check_parity(model, exporter.load_runner(path), [inputs, other], atol=0)
    assert [r.ok for r in reports] == [True, True] and max(r.max_abs_diff for r in reports) == 0


class _WriteThroughView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 1
        y.view(-1)[:3].mul_(2)
        return y.view(2, -1) + 1


def test_views_as_reshapes_keeps_views_written_through():
    """A view an in-place op writes through stays a view (a reshape could be a copy and drop the write)."""
    from hf_exporters.workarounds.executorch.decomposition_layouts import views_as_reshapes

    ep = torch.export.export(_WriteThroughView(), (_x(4, 3),))
    assert views_as_reshapes(ep.graph_module) == 1
    targets = [n.target for n in ep.graph.nodes if n.target in (torch.ops.aten.view.default, torch.ops.aten.reshape.default)]
    assert targets == [torch.ops.aten.view.default, torch.ops.aten.reshape.default]
