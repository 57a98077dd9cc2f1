"""``hf-exporters patches --model CLASS``: the workarounds whose docstring's ``Models:`` line names a
model class (the rule is :func:`hf_exporters.registry.models_line_names`)."""

import json

import pytest
from typer.testing import CliRunner

from hf_exporters.cli import app
from hf_exporters.registry import models_line_names


@pytest.mark.parametrize(
    ("line", "model_class"),
    [
        ("FunnelModel, FunnelBaseModel and their heads.", "FunnelModel"),  # the class itself
        ("FunnelModel, FunnelBaseModel and their heads.", "FunnelForMaskedLM"),  # its family
        ("GPT2Model, GPT2LMHeadModel (executorch in the sweep).", "GPT2ForSequenceClassification"),
        ("Qwen2-VL, Qwen2.5-VL, Qwen3-VL(-MoE), GLM-4V", "Qwen2_5_VLForConditionalGeneration"),  # a family in prose
        ("Qwen2-VL, Qwen2.5-VL, Qwen3-VL(-MoE), GLM-4V", "Glm4vModel"),
        ("Kimi_K25VisionModel (and the models around it).", "Kimi_K25ForConditionalGeneration"),  # a sub-model
        ("Qwen3ASREncoder (executorch in the sweep).", "Qwen3ASRForConditionalGeneration"),
        ("the other users of ``nn.LSTM``: EncodecModel's LSTM blocks.", "EncodecModel"),
        ("every model exported with ``dynamic=True`` (BertModel, ...).", "AnyModelAtAll"),  # every class
        ("all.", "T5Model"),
    ],
)
def test_models_line_names_the_class(line, model_class):
    assert models_line_names(line, model_class)


@pytest.mark.parametrize(
    ("line", "model_class"),
    [
        ("Llama4TextModel, Llama4ForConditionalGeneration.", "LlamaForCausalLM"),  # another family
        ("Qwen2-VL, Qwen2.5-VL", "Qwen2ForCausalLM"),
        ("T5Gemma2Model, UnlimitedOcrModel", "T5Model"),
        ("Sam3Model, Sam3LiteTextModel", "Sam2Model"),
        ("MoE routers calling topk(sorted=False), as every router does", "MixtralForCausalLM"),  # 'every' not first
        (None, "BertModel"),
    ],
)
def test_models_line_does_not_name_the_class(line, model_class):
    assert not models_line_names(line, model_class)


def _patches(*args):
    result = CliRunner().invoke(app, ["patches", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_patches_model_lists_what_names_the_class():
    rows = json.loads(_patches("--model", "Kimi_K25ForConditionalGeneration", "--json"))
    names = {(r["backend"], r["name"]) for r in rows}
    assert {
        ("dynamo", "_patch_kimi_frame_index_symbolic"),  # "Kimi_K25VisionModel (and the models around it)"
        ("dynamo", "_patch_kimi_temporal_merge_index_symbolic"),
        ("executorch", "_patch_embedding_bag_as_gather_and_reduce"),
        ("dynamo", "_patch_sdpa_attention"),  # "every model using the sdpa attention interface"
    } <= names
    assert ("dynamo", "_patch_funnel_positions_symbolic") not in names
    assert all(models_line_names(r["models"], "Kimi_K25ForConditionalGeneration") for r in rows)
    every = json.loads(_patches("--json"))
    assert {r["name"] for r in every} > {r["name"] for r in rows}
    assert all("models" in r for r in every)


def test_patches_model_with_a_backend():
    rows = json.loads(_patches("--model", "FunnelForMaskedLM", "--backend", "dynamo", "--json"))
    assert {r["name"] for r in rows} == {"_patch_funnel_positions_symbolic", "_patch_sdpa_attention", "_patch_cache_is_compileable"}
    assert {r["target"] for r in rows if r["name"] == "_patch_funnel_positions_symbolic"} == {
        "transformers.models.funnel.modeling_funnel.FunnelAttentionStructure.get_position_embeds",
        "transformers.models.funnel.modeling_funnel.FunnelAttentionStructure.relative_pos",
    }
    table = _patches("--model", "FunnelForMaskedLM", "--backend", "dynamo")
    assert "5 workaround(s) for dynamo naming FunnelForMaskedLM" in table


def test_patches_help_states_the_matching_rule():
    text = " ".join(_patches("--help").split())
    assert "--model CLASS keeps the workarounds whose docstring's 'Models:' line" in text
    assert "matches every class" in text
