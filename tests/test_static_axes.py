"""Axes a dynamic export pins or constrains through input guards: reported with the guard and the
model line that added it, on all three backends; ``on_static_axis="error"`` fails the export."""

import json
import re

import pytest
import torch
import transformers

from hf_exporters import DynamoConfig, DynamoExporter, ExportStageError
from hf_exporters.config import ExecutorchConfig, OnnxConfig
from hf_exporters.shapes import StaticAxis, auto_dynamic_shapes, constrained_axes, recorded_guards, size_oblivious_sizes, static_axes

BRANCH_LINE = "if x.shape[0] == 1:"


class BranchOnBatchOfOne(torch.nn.Module):
    """Takes another path for a batch of one: the trace guards the batch size either way."""

    def forward(self, x):
        if x.shape[0] == 1:
            return x * 2.0
        return x + 1.0


def _line_of(text: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(BranchOnBatchOfOne.forward)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _exporters():
    out = [pytest.param(DynamoExporter, DynamoConfig, id="dynamo")]
    try:
        from hf_exporters.exporters.onnx import OnnxExporter

        out.append(pytest.param(OnnxExporter, OnnxConfig, id="onnx"))
    except ImportError:  # pragma: no cover - the onnx extra is installed by make test
        pass
    try:
        from hf_exporters.exporters.executorch import ExecutorchExporter

        out.append(pytest.param(ExecutorchExporter, ExecutorchConfig, id="executorch"))
    except ImportError:  # pragma: no cover
        pass
    return out


@pytest.mark.parametrize("exporter_class,config_class", _exporters())
def test_guard_pinning_a_batch_of_one_is_reported_with_its_source_line(exporter_class, config_class):
    result = exporter_class().run(BranchOnBatchOfOne(), {"x": torch.randn(1, 3)}, config_class(dynamic=True))
    assert result.static_axes == [StaticAxis("x", 0, 1)]
    (axis,) = result.static_axes
    assert axis.guard == "x.size()[0] == 1"
    assert axis.source == f"{__file__}:{_line_of(BRANCH_LINE)} in forward"
    assert str(axis) == f"x[axis 0] = 1 (guard x.size()[0] == 1 at {axis.source})"
    assert result.constrained_axes == []


@pytest.mark.parametrize("exporter_class,config_class", _exporters())
def test_an_axis_that_refuses_size_one_is_reported_as_constrained(exporter_class, config_class):
    result = exporter_class().run(BranchOnBatchOfOne(), {"x": torch.randn(2, 3)}, config_class(dynamic=True))
    assert result.static_axes == []
    (axis,) = result.constrained_axes
    assert (axis.input, axis.axis, axis.size, axis.guard) == ("x", 0, 2, "x.size()[0] != 1")
    assert axis.source.endswith(f":{_line_of(BRANCH_LINE)} in forward")


def test_on_static_axis_error_fails_the_export_naming_the_guard():
    with pytest.raises(ExportStageError) as caught:
        DynamoExporter().export(BranchOnBatchOfOne(), {"x": torch.randn(1, 3)}, DynamoConfig(dynamic=True, on_static_axis="error"))
    message = str(caught.value)
    assert message.startswith(
        "[dynamo] Stage 4: Dynamic shapes failed: 1 axis/axes asked to be dynamic ended static (the program accepts only "
        "these sizes): x[axis 0] = 1 (guard x.size()[0] == 1 at "
    )
    assert message.endswith("; export with an example of other sizes, or on_static_axis='warn'")
    with pytest.raises(ValueError, match="on_static_axis must be 'warn' or 'error', not 'ignore'"):
        DynamoConfig(on_static_axis="ignore")


def test_the_program_really_refuses_what_the_report_says():
    inputs = {"x": torch.randn(2, 3)}
    shapes = auto_dynamic_shapes(inputs)
    with recorded_guards() as guards, size_oblivious_sizes():  # as the exporter traces
        program = torch.export.export(BranchOnBatchOfOne(), (), inputs, dynamic_shapes=shapes)
    (expression,) = guards
    assert re.fullmatch(r"Ne\(s\d+, 1\)", expression)
    module = program.module()
    module(x=torch.randn(5, 3))  # another batch size passes
    with pytest.raises(Exception, match=r"x.size\(\)\[0\] != 1"):
        module(x=torch.randn(1, 3))
    assert [str(a) for a in constrained_axes(program, inputs, shapes, guards)] == [
        f"x[axis 0] in [0, inf], refuses size 1 (guard x.size()[0] != 1 at {__file__}:{_line_of(BRANCH_LINE)} in forward)"
    ]
    assert static_axes(program, inputs, shapes, guards) == []


def test_recorded_guards_restores_the_logger_and_prints_nothing(capfd):
    import logging

    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    before = (logger.level, logger.propagate, list(logger.handlers))
    inputs = {"x": torch.randn(1, 3)}
    with recorded_guards() as guards, size_oblivious_sizes():
        torch.export.export(BranchOnBatchOfOne(), (), inputs, dynamic_shapes=auto_dynamic_shapes(inputs))
    (expression,) = guards
    assert re.fullmatch(r"Eq\(s\d+, 1\)", expression)
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    assert "guard added" not in capfd.readouterr().err


def test_a_model_without_size_guards_reports_nothing():
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    result = DynamoExporter().run(model, {"input_ids": torch.randint(0, 128, (1, 5))}, DynamoConfig(dynamic=True))
    assert result.static_axes == [] and result.constrained_axes == []
    module = result.program.module()
    for batch, length in [(1, 1), (3, 1), (3, 7)]:  # what the empty report promises
        assert module(input_ids=torch.randint(0, 128, (batch, length))).logits.shape == (batch, length, 128)


class BranchyConfig(transformers.PretrainedConfig):
    model_type = "hfx-branchy"


class BranchyModel(transformers.PreTrainedModel):
    config_class = BranchyConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(16, 4)
        self.post_init()

    def forward(self, input_ids):
        hidden = self.embed(input_ids)
        if input_ids.shape[0] == 1:
            return transformers.modeling_outputs.BaseModelOutput(last_hidden_state=hidden * 2.0)
        return transformers.modeling_outputs.BaseModelOutput(last_hidden_state=hidden + 1.0)


def test_export_json_records_pinned_and_constrained_axes(tmp_path):
    from hf_exporters.pipeline import export_to_folder

    torch.manual_seed(0)
    model = BranchyModel(BranchyConfig()).eval()
    manifest = export_to_folder(model, {"input_ids": torch.randint(0, 16, (1, 4))}, "dynamo", tmp_path / "one", dynamic=True)
    (pinned,) = manifest["static_axes"]
    assert (pinned["input"], pinned["axis"], pinned["size"], pinned["guard"]) == ("input_ids", 0, 1, "input_ids.size()[0] == 1")
    assert pinned["source"].endswith(" in forward") and "test_static_axes.py:" in pinned["source"]
    assert json.loads((tmp_path / "one" / "export.json").read_text())["static_axes"] == manifest["static_axes"]

    manifest = export_to_folder(model, {"input_ids": torch.randint(0, 16, (2, 4))}, "dynamo", tmp_path / "two", dynamic=True)
    assert manifest["static_axes"] == []
    (constrained,) = manifest["constrained_axes"]
    assert {k: constrained[k] for k in ("input", "axis", "size", "low", "high", "guard")} == {
        "input": "input_ids", "axis": 0, "size": 2, "low": 0, "high": None, "guard": "input_ids.size()[0] != 1",
    }
    assert len(manifest["parity"]) == 2 and all(p["max_abs_diff"] < 1e-6 for p in manifest["parity"])
