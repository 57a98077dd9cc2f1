"""The opset-23 optimizer leaves rotary embeddings unfused, so a dynamic export runs at every batch."""

import pytest
import torch
import transformers

pytest.importorskip("onnxruntime", reason="the ONNX tests need the onnx extra")

from hf_exporters.config import OnnxConfig  # noqa: E402
from hf_exporters.exporters.onnx import OnnxExporter  # noqa: E402
from hf_exporters.runtime import check_parity  # noqa: E402
from workaround_helpers import without_workarounds  # noqa: E402


def _tiny_llama():
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaModel(config).eval()


def test_rotary_stays_unfused_and_runs_at_another_batch(tmp_path):
    model = _tiny_llama()
    example = {"input_ids": torch.randint(0, 64, (2, 6))}
    other = {"input_ids": torch.randint(0, 64, (3, 5))}
    exporter = OnnxExporter()
    with without_workarounds("_patch_no_rotary_fusion_across_batches"):
        fused = exporter.run(model, example, OnnxConfig(dynamic=True, opset_version=23)).program
    assert "RotaryEmbedding" in {node.op_type for node in fused.model.graph}  # the upstream fusion: its tables keep the batch of 1 they broadcast from
    runner = exporter.load_runner(exporter.save(fused, tmp_path / "fused"))
    with pytest.raises(Exception, match="cos_cache"):
        runner(other)

    program = exporter.run(model, example, OnnxConfig(dynamic=True, opset_version=23)).program
    assert "RotaryEmbedding" not in {node.op_type for node in program.model.graph}
    runner = exporter.load_runner(exporter.save(program, tmp_path / "ours"))
    reports = check_parity(model, runner, [example, other], atol=1e-4)
    assert [r.ok for r in reports] == [True, True]
    assert max(r.max_abs_diff for r in reports) < 1e-4
