"""What an export returns (``ExportResult``) and records in ``export.json``: the capture strategies,
the workarounds that fired, the stage times and ExecuTorch's delegated partitions."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from hf_exporters import DynamoConfig, DynamoExporter, ExportResult, registry
from hf_exporters.exporters.capture import (
    PlainTrace,
    SizeObliviousTrace,
    capture,
    is_data_dependent,
    strategies_for,
)
from hf_exporters.shapes import StaticAxis, auto_dynamic_shapes

ROOT = Path(__file__).resolve().parent.parent


def _code_stages(exporter: str) -> list[str]:
    """The ``# ── Stage N: Title ──`` blocks of an exporter's source, in order."""
    source = (ROOT / "src/hf_exporters/exporters" / f"{exporter}.py").read_text()
    return re.findall(r"# ── (Stage \d+: [^─\n]+?) ──", source)


# ── Capture strategies ────────────────────────────────────────────────────────


class _BroadcastsAConfigSizedMask(torch.nn.Module):
    """A mask of 4 elements reshaped to the input's sides, its leading 1 broadcast over the batch:
    size-oblivious reasoning assumes the computed leading size is never 1 and refuses the broadcast."""

    def forward(self, x):
        _, height, width = x.shape
        mask = torch.ones(4).reshape(-1, height, width)
        return x * (1 - mask) + mask


class _BranchesOnData(torch.nn.Module):
    def forward(self, x):
        return x + 1 if x.sum() > 0 else x - 1


class _Counting(PlainTrace):
    """A plain trace that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def _capture(self, *args):
        self.calls += 1
        return super()._capture(*args)


def test_strategies_return_a_result_instead_of_raising():
    model, inputs = _BroadcastsAConfigSizedMask(), {"x": torch.randn(2, 2, 2)}
    shapes = auto_dynamic_shapes(inputs)
    failed = SizeObliviousTrace()(model, inputs, shapes, DynamoConfig(dynamic=True))
    assert failed.program is None and not failed.success and failed.size_oblivious
    assert failed.strategy == "size-oblivious trace"
    assert "must match the size of tensor b" in str(failed.error)
    traced = PlainTrace()(model, inputs, shapes, DynamoConfig(dynamic=True))
    assert traced.success and traced.error is None and not traced.size_oblivious
    torch.testing.assert_close(traced.program.module()(x=torch.ones(5, 2, 2)), model(torch.ones(5, 2, 2)))


def test_a_failed_size_oblivious_trace_falls_back_to_the_plain_trace():
    model, inputs = _BroadcastsAConfigSizedMask(), {"x": torch.randn(2, 2, 2)}
    assert [s.name for s in strategies_for(auto_dynamic_shapes(inputs))] == ["size-oblivious trace", "plain trace"]
    assert [s.name for s in strategies_for(None)] == ["plain trace"]

    result = DynamoExporter().run(model, inputs, DynamoConfig(dynamic=True))
    assert isinstance(result, ExportResult)
    assert result.capture_strategy == "plain trace" and result.size_oblivious is False
    [(strategy, error)] = result.capture_errors
    assert strategy == "size-oblivious trace" and "must match the size of tensor b" in str(error)
    # the batch stays dynamic under plain reasoning too; the sides are pinned by the reshape's guard
    assert result.static_axes == [StaticAxis("x", 1, 2), StaticAxis("x", 2, 2)]
    assert result.static_axes[0].guard == "4 % (x.size()[1] * x.size()[2]) == 0"
    bigger = torch.randn(5, 2, 2)
    torch.testing.assert_close(result.program.module()(x=bigger), model(bigger))

    static = DynamoExporter().run(model, inputs)
    assert static.capture_strategy == "plain trace" and static.capture_errors == [] and static.dynamic_shapes is None


def test_a_data_dependent_guard_is_not_retried():
    model, inputs = _BranchesOnData(), {"x": torch.randn(2, 3)}
    shapes = auto_dynamic_shapes(inputs)
    second = _Counting()
    with pytest.raises(Exception, match="data-dependent expression") as caught:
        capture(model, inputs, shapes, DynamoConfig(dynamic=True), [SizeObliviousTrace(), second])
    assert is_data_dependent(caught.value)
    assert second.calls == 0
    assert not getattr(caught.value, "__notes__", [])


def test_when_every_strategy_fails_the_first_error_is_raised_with_a_note_naming_the_others():
    class ViewsAsFive(torch.nn.Module):
        def forward(self, x):
            return x.reshape(-1, 5)

    model, inputs = ViewsAsFive(), {"x": torch.randn(2, 3)}
    second = _Counting()
    with pytest.raises(RuntimeError, match=re.escape("shape '[-1, 5]' is invalid for input of size s")) as caught:
        capture(model, inputs, auto_dynamic_shapes(inputs), DynamoConfig(dynamic=True), [SizeObliviousTrace(), second])
    assert second.calls == 1
    (note,) = caught.value.__notes__
    assert note.startswith("traced again with plain size reasoning, it failed too: RuntimeError: shape '[-1, 5]' is invalid")


# ── Workarounds that fired ────────────────────────────────────────────────────


@pytest.fixture
def scratch_registry(monkeypatch):
    """A module ``hfx_fired_target`` with two functions, and a registry copy the test may add to."""
    module = types.ModuleType("hfx_fired_target")
    module.double = lambda x: 2 * x
    module.negate = lambda x: -x
    monkeypatch.setitem(sys.modules, "hfx_fired_target", module)
    monkeypatch.setattr(registry, "_REGISTRY", list(registry._REGISTRY))
    return module


def test_a_patch_is_recorded_when_its_replacement_is_called(scratch_registry):
    @registry.register_patch("scratch", "hfx_fired_target.double")
    def _patch_double(original):
        return lambda x: original(x) + 1

    @registry.register_patch("scratch", "hfx_fired_target.negate")
    def _patch_negate(original):
        return lambda x: original(x) - 1

    with registry.recording_fired() as outer:
        with registry.apply_patches("scratch"):
            assert scratch_registry.double(3) == 7  # the replacement ran
            with registry.recording_fired() as inner:
                assert scratch_registry.double(1) == 3
        assert scratch_registry.double(3) == 6  # restored
    assert [w.name for w in outer] == ["_patch_double"]  # negate was installed, never called
    assert [w.name for w in inner] == ["_patch_double"]
    with registry.apply_patches("scratch"):
        scratch_registry.negate(1)  # no recording open: nothing is kept
    assert [w.name for w in outer] == ["_patch_double"]


def test_fixes_are_recorded_when_they_change_the_graph(scratch_registry):
    @registry.register_fx_node_fix("scratch")
    def _fix_add_to_sub(gm, node):
        if node.target is not torch.ops.aten.add.Tensor:
            return False
        node.target = torch.ops.aten.sub.Tensor
        return True

    @registry.register_fx_node_fix("scratch")
    def _fix_never(gm, node):
        return False

    @registry.register_fx_program_fix("scratch")
    def _fix_program_untouched(ep):
        return False

    class Adds(torch.nn.Module):
        def forward(self, x):
            return x + x

    ep = torch.export.export(Adds(), (torch.ones(2),))
    with registry.recording_fired() as fired:
        assert registry.apply_fx_node_fixes("scratch", ep.graph_module) == 1
        registry.apply_fx_program_fixes("scratch", ep)
    assert [w.name for w in fired] == ["_fix_add_to_sub"]
    assert torch.equal(ep.module()(torch.ones(2)), torch.zeros(2))


# ── export.json ───────────────────────────────────────────────────────────────


def _tiny_bert():
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37, max_position_embeddings=64
    )
    model = transformers.BertModel(config).eval()
    inputs = {"input_ids": torch.randint(0, 100, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    return model, inputs


def test_export_json_records_stage_times_capture_strategy_and_fired_workarounds(tmp_path):
    """An unpadded mask reaches BERT's SDPA attention, and the mask patch skips it as eager does."""
    from hf_exporters.pipeline import export_to_folder

    model, inputs = _tiny_bert()
    export_to_folder(model, inputs, "dynamo", tmp_path / "out", dynamic=True)
    manifest = json.loads((tmp_path / "out" / "export.json").read_text())

    assert manifest["capture_strategy"] == "size-oblivious trace"
    assert list(manifest["stage_seconds"]) == [*_code_stages("dynamo"), "trace (torch.export.export)"]
    assert all(isinstance(v, float) and v >= 0 for v in manifest["stage_seconds"].values())
    assert manifest["stage_seconds"]["trace (torch.export.export)"] > 0
    assert sum(manifest["stage_seconds"].values()) <= manifest["export_seconds"] + 0.01
    fired = {entry["name"]: entry for entry in manifest["workarounds_fired"]}
    assert fired["_patch_skip_bidirectional_mask_without_padding"] == {
        "name": "_patch_skip_bidirectional_mask_without_padding",
        "kind": "patch",
        "stage": "Stage 2: Model patches",
        "target": "transformers.masking_utils._ignore_bidirectional_mask_sdpa",
    }
    listed = {(w.name, w.target) for w in registry.list_workarounds()}
    assert {(e["name"], e["target"]) for e in manifest["workarounds_fired"]} <= listed
    assert "partitions" not in manifest


def test_onnx_stage_seconds_name_every_stage_block():
    pytest.importorskip("onnxscript", reason="the ONNX exporter needs onnxscript")
    from hf_exporters import OnnxConfig, OnnxExporter

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return x.view(2, -1).sum(dim=1)

    result = OnnxExporter().run(Tiny(), {"x": torch.randn(2, 3, 4)}, OnnxConfig())
    expected = [
        "Stage 1: Torch patches",
        *(f"dynamo: {title}" for title in _code_stages("dynamo")),
        "trace (torch.export.export)",
        *_code_stages("onnx")[1:4],
        "lowering (torch.onnx.export)",
        "Stage 5: ONNX IR fixes",
        "output names",
        *_code_stages("onnx")[5:],
    ]
    assert _code_stages("onnx")[0] == "Stage 1: Torch patches" and _code_stages("onnx")[4] == "Stage 5: ONNX IR fixes"
    assert list(result.stage_seconds) == expected
    assert result.partitions is None and result.optimized is True
    fired = {w.name: w for w in result.workarounds_fired}
    assert fired["_fix_view_as_reshape"].kind == "fx_node_fix" and result.fx_fixes_applied >= 1
    # the translation of the op the lowered graph holds, and not one of an op it does not
    assert fired["_aten_sum_int64_exact"].target == "aten::sum.dim_IntList"
    assert "_aten_repeat_interleave_symbolic_repeats" not in fired and not any(w.target.startswith("aten::pow") for w in fired.values())


# ── ExecuTorch partitions ─────────────────────────────────────────────────────


class _PartlyDelegated(torch.nn.Module):
    """Two linear layers around a cumulative sum XNNPACK does not take: two delegated partitions."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.second = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.second(torch.cumsum(self.first(x), dim=1))


@pytest.mark.parametrize("backend, delegated", [("xnnpack", 2), ("portable", 0)])
def test_executorch_partitions_count_the_delegate_calls(backend, delegated):
    pytest.importorskip("executorch.exir", reason="the ExecuTorch exporter needs executorch")
    from executorch.exir._serialize._program import deserialize_pte_binary

    from hf_exporters import ExecutorchConfig, ExecutorchExporter

    torch.manual_seed(0)
    result = ExecutorchExporter().run(_PartlyDelegated().eval(), {"x": torch.randn(2, 3, 8)}, ExecutorchConfig(backend=backend))
    manager = result.program
    calls = sum(str(n.target) == "executorch_call_delegate" for n in manager.exported_program("forward").graph.nodes)
    assert calls == delegated
    assert result.partitions == {"forward": calls}
    # the serialised program holds one delegate entry per partition
    program = deserialize_pte_binary(manager.buffer)
    plans = {plan.name: len(plan.delegates) for plan in getattr(program, "program", program).execution_plan}
    assert plans["forward"] == delegated
    assert result.manifest_entries()["partitions"] == {"forward": delegated}
    assert list(result.stage_seconds)[:2] == ["Stage 1: Backend preparation", "Stage 2: Torch patches"]
    assert list(result.stage_seconds)[-2:] == ["lowering (to_edge_transform_and_lower)", "serialisation (to_executorch)"]


# ── Generation folders ────────────────────────────────────────────────────────


def test_a_generation_folder_records_each_parts_result(tmp_path):
    import transformers

    from hf_exporters.generation import export_for_generation

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2
    )
    model = transformers.LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(0, 64, (2, 5)), "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    artifacts = export_for_generation(DynamoExporter(), model, inputs, DynamoConfig())
    assert set(artifacts.results) == set(artifacts) == {"prefill", "decode"}
    for name, result in artifacts.results.items():
        assert result.program is artifacts[name]
        assert result.dynamic_shapes is not None  # every part is exported with dynamic axes
    manifest = artifacts.save_pretrained(tmp_path / "gen")
    for name, result in artifacts.results.items():
        entry = manifest["parts"][name]
        assert entry["capture_strategy"] == result.capture_strategy == "size-oblivious trace"
        assert list(entry["stage_seconds"]) == [*_code_stages("dynamo"), "trace (torch.export.export)"]
        assert [w["name"] for w in entry["workarounds_fired"]] == [w.name for w in result.workarounds_fired]
        assert "_patch_dim_constraints_skip_unsolvable" in [w["name"] for w in entry["workarounds_fired"]]
        assert "partitions" not in entry
    written = json.loads((tmp_path / "gen" / "export.json").read_text())
    assert written["parts"]["decode"]["capture_strategy"] == "size-oblivious trace"
