"""ExecuTorch ``--quantize 8da4w | 8da8w``: torchao-quantized linear layers that XNNPACK runs, checked on real sentences."""

import copy

import pytest
import torch
import transformers

pytest.importorskip("executorch.runtime", reason="the ExecuTorch tests need the executorch extra")
pytest.importorskip("torchao", reason="ExecuTorch quantization needs torchao")

from hf_exporters import ExecutorchConfig, ExecutorchExporter  # noqa: E402
from hf_exporters.errors import ExportStageError, InputError, ParityError  # noqa: E402
from hf_exporters.exporters.executorch_quantize import check_quantize  # noqa: E402
from hf_exporters.pipeline import build_inputs, default_model_path, export_to_folder, load_checkpoint  # noqa: E402


def test_modes_and_group_sizes():
    assert check_quantize("8da4w") == ("8da4w", 32)
    assert check_quantize("8da8w") == ("8da8w", None)
    assert check_quantize("8da4w", 64) == ("8da4w", 64)
    assert check_quantize(None) == (None, None)
    for args, message in [
        (("int4",), "unknown ExecuTorch quantization 'int4'; choose one of: 8da4w, 8da8w"),
        (("8da4w", 24), "--group-size must be a power of 2 of at least 32 (32, 64, 128, ...: XNNPACK's kernels), got 24"),
        (("8da4w", 16), "--group-size must be a power of 2 of at least 32 (32, 64, 128, ...: XNNPACK's kernels), got 16"),
        ((None, 32), "--group-size applies to --quantize 8da4w"),
        (("8da8w", 64), "--group-size applies to --quantize 8da4w: XNNPACK runs 8da8w's int8 weights with one scale per output channel only"),
    ]:
        with pytest.raises(InputError) as caught:
            check_quantize(*args)
        assert str(caught.value) == message


def _tiny_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=32, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16
    )
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _undelegated_ops(manager) -> set[str]:
    """Compute ops of the lowered program that run outside every delegate (on portable kernels)."""
    program = manager.exported_program("forward")
    return {
        str(node.target) for node in program.graph.nodes
        if node.op == "call_function" and "executorch_call_delegate" not in str(node.target) and "getitem" not in str(node.target)
    }


@pytest.mark.parametrize(("mode", "weight_bits"), [("8da4w", 4), ("8da8w", 8)])
def test_quantized_linears_run_inside_xnnpack(mode, weight_bits, tmp_path):
    model, inputs = _tiny_bert()
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    float_exporter, exporter = ExecutorchExporter(), ExecutorchExporter()
    float_size = float_exporter.save(float_exporter.export(model, inputs, ExecutorchConfig()), tmp_path / "float").stat().st_size
    result = exporter.run(model, inputs, ExecutorchConfig(quantize=mode))
    assert exporter.manifest_entries() == {
        "executorch": {"quantize": mode, "group_size": 32 if mode == "8da4w" else None, "quantized_linears": 13, "float_linears": 0}
    }
    assert result.partitions == {"forward": 1}
    assert not {op for op in _undelegated_ops(result.program) if "linear" in op or "mm" in op or "quantize" in op}
    path = exporter.save(result.program, tmp_path / mode)
    # the 13 linears hold 102 K of the 106 K weights: their bytes shrink about 4x (int8) or 8x (int4, with a scale per 32)
    ratio = path.stat().st_size / float_size
    assert ratio < (0.4 if weight_bits == 8 else 0.25), ratio  # (8da8w measured 0.35, 8da4w under 0.25)
    got = torch.as_tensor(exporter.load_runner(path)(inputs)[0])
    cosine = torch.nn.functional.cosine_similarity(got.flatten(1), expected.flatten(1)).min()
    assert cosine > 0.99, float(cosine)
    assert float((got - expected).abs().max()) > 1e-4  # quantized: not the float values
    assert type(model.encoder.layer[0].output.dense.weight) is torch.nn.Parameter  # the caller's model stays float


def test_int8_embeddings_are_looked_up_by_the_quantized_kernel(tmp_path):
    """``quantize_embeddings="8w"``: the tables in int8 (one scale per row), each lookup ExecuTorch's
    ``embedding_byte`` outside the delegate, no ``dequantize_affine`` left; the runtime gives the
    int8-table model's eager numbers, and the file loses about 3/4 of the tables' bytes."""
    from torchao.quantization import IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, max_position_embeddings=16, pad_token_id=0
    )
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 2048, (2, 8), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    float_exporter, exporter = ExecutorchExporter(), ExecutorchExporter()
    float_size = float_exporter.save(float_exporter.export(model, inputs, ExecutorchConfig()), tmp_path / "float").stat().st_size
    result = exporter.run(model, inputs, ExecutorchConfig(quantize_embeddings="8w"))
    # the word lookup; the position and token-type lookups read buffers only, so the lowering folds them into constants
    assert exporter.manifest_entries() == {"executorch": {"quantize_embeddings": "8w", "quantized_embeddings": 3, "embedding_lookups": 1}}
    ops = _undelegated_ops(result.program)
    assert [op for op in ops if "embedding" in op or "dequantize" in op] == ["quantized_decomposed.embedding_byte.out"], ops
    path = exporter.save(result.program, tmp_path / "8w")
    table_bytes = 4 * 2048 * 64
    assert float_size - path.stat().st_size > 0.7 * table_bytes, (float_size, path.stat().st_size)
    # the reference: the same tables quantized in eager (torchao), padding_idx cleared as the export does
    reference = copy.deepcopy(model)
    for table in reference.modules():
        if isinstance(table, torch.nn.Embedding):
            table.padding_idx = None
    quantize_(reference, IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)), filter_fn=lambda m, _: isinstance(m, torch.nn.Embedding))
    with torch.no_grad():
        expected, float_expected = reference(**inputs).last_hidden_state, model(**inputs).last_hidden_state
    got = torch.as_tensor(exporter.load_runner(path)(inputs)[0])
    assert float((got - expected).abs().max()) < 1e-4
    assert float((got - float_expected).abs().max()) > 1e-4  # int8 tables: not the float values
    assert model.embeddings.word_embeddings.padding_idx == 0  # the caller's model is left as it was
    assert type(model.embeddings.word_embeddings.weight) is torch.nn.Parameter


class _PositionsFromPaddingIdx(torch.nn.Embedding):
    """ProphetNet's pattern: an embedding subclass whose own forward reads ``padding_idx``."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.cumsum(torch.ones_like(ids), dim=1) + self.padding_idx)


def test_only_tables_with_the_plain_embedding_forward_are_quantized():
    from hf_exporters.exporters.executorch_quantize import quantize_embeddings

    model = torch.nn.ModuleDict({"words": torch.nn.Embedding(64, 32, padding_idx=0), "positions": _PositionsFromPaddingIdx(40, 32, padding_idx=1)})
    assert quantize_embeddings(model, "8w") == 1
    assert model["words"].padding_idx is None and type(model["words"].weight) is not torch.nn.Parameter
    assert model["positions"].padding_idx == 1 and type(model["positions"].weight) is torch.nn.Parameter
    assert model["positions"](torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, 32)  # still runs
    with pytest.raises(InputError) as caught:
        quantize_embeddings(torch.nn.ModuleDict({"positions": _PositionsFromPaddingIdx(40, 32, padding_idx=1)}), "8w")
    assert str(caught.value) == "--qembedding 8w: the model has no nn.Embedding table to quantize"


def test_qembedding_is_refused_with_the_cuda_recipe_and_before_loading_in_the_cli(tmp_path):
    from typer.testing import CliRunner

    from hf_exporters.cli import app

    model, inputs = _tiny_bert()
    with pytest.raises(InputError) as caught:
        export_to_folder(model, inputs, "executorch", tmp_path / "out", recipe="cuda", quantize_embeddings="8w", validate=False)
    assert str(caught.value) == "--qembedding 8w runs on ExecuTorch's CPU kernels: use --recipe xnnpack or portable, not 'cuda'"
    # the CLI refuses the options before it looks for the model (which does not exist here)
    for args, line in [
        (["-b", "onnx", "--qembedding", "8w"], "error: --qembedding applies to the executorch backend only, not 'onnx'"),
        (["-b", "executorch", "--recipe", "portable", "--quantize", "8da8w"],
         "error: --quantize 8da8w runs its linear layers on XNNPACK: use --recipe xnnpack, not 'portable'"),
    ]:
        result = CliRunner().invoke(app, ["export", "-m", str(tmp_path / "absent"), "-o", str(tmp_path / "out"), *args])
        assert (result.exit_code, result.stderr.strip().splitlines()[-1]) == (1, line)
    assert not (tmp_path / "out").exists()


def test_qembedding_is_for_executorch_only_and_names_its_modes(tmp_path):
    model, inputs = _tiny_bert()
    with pytest.raises(InputError) as caught:
        export_to_folder(model, inputs, "onnx", tmp_path / "out", quantize_embeddings="8w")
    assert str(caught.value) == "--qembedding applies to the executorch backend only, not 'onnx'"
    with pytest.raises(InputError) as caught:
        export_to_folder(model, inputs, "executorch", tmp_path / "out", quantize_embeddings="4w", validate=False)
    assert str(caught.value) == "unknown embedding quantization '4w'; choose one of: 8w"
    with pytest.raises(InputError) as caught:
        export_to_folder(model, inputs, "executorch", tmp_path / "out", quantize_embeddings="8w")
    assert str(caught.value) == "--qembedding 8w calibrates and checks on real sentences: the checkpoint needs a tokenizer"
    assert not (tmp_path / "out").exists()


def test_a_group_size_no_linear_takes_is_refused(tmp_path):
    model, inputs = _tiny_bert()
    with pytest.raises(ExportStageError) as caught:
        export_to_folder(model, inputs, "executorch", tmp_path / "out", quantize="8da4w", group_size=512, validate=False)
    assert caught.value.stage == "Stage 1: Backend preparation"
    assert caught.value.detail == (
        "InputError: --quantize 8da4w: none of the model's 13 linear layers has input features divisible by the group size 512"
    )
    assert not (tmp_path / "out").exists()


def test_quantized_linears_need_the_xnnpack_recipe(tmp_path):
    model, inputs = _tiny_bert()
    with pytest.raises(InputError) as caught:
        export_to_folder(model, inputs, "executorch", tmp_path / "out", recipe="portable", quantize="8da4w", validate=False)
    assert str(caught.value) == "--quantize 8da4w runs its linear layers on XNNPACK: use --recipe xnnpack, not 'portable'"
    assert not (tmp_path / "out").exists()


def test_group_size_is_for_executorch_only(tmp_path):
    model, inputs = _tiny_bert()
    with pytest.raises(InputError) as caught:
        export_to_folder(model, inputs, "onnx", tmp_path / "out", quantize="int8-dynamic", group_size=32)
    assert str(caught.value) == "--group-size applies to the executorch backend's --quantize 8da4w, not 'onnx'"


@pytest.fixture(scope="module")
def minilm():
    model, tokenizer, _ = load_checkpoint(default_model_path(), "feature-extraction")
    return model, tokenizer


def test_minilm_8da8w_keeps_its_sentence_embeddings(minilm, tmp_path):
    """8da8w linears and 8w embedding tables together (optimum-executorch's ``--qlinear 8da8w --qembedding 8w``):
    the .pte is a quarter of the float one (measured 22.9 MB against 90.9 MB; 58.7 MB with float tables)."""
    model, tokenizer = minilm
    inputs = build_inputs(model, tokenizer)  # the CLI's example sentences: the static program takes their batch and length
    manifest = export_to_folder(model, inputs, "executorch", tmp_path / "out", quantize="8da8w", quantize_embeddings="8w", preprocessor=tokenizer)
    accuracy = manifest["accuracy"]
    assert accuracy["ok"] and accuracy["sentences"] == 40
    assert accuracy["min_cosine"] >= 0.995 and accuracy["mean_cosine"] >= 0.998 and accuracy["neighbour_agreement"] >= 0.95
    assert manifest["executorch"] == {
        "quantize": "8da8w", "group_size": None, "quantized_linears": 37, "float_linears": 0,
        "quantize_embeddings": "8w", "quantized_embeddings": 3, "embedding_lookups": 2,
    }
    assert manifest["partitions"] == {"forward": 1}
    assert (tmp_path / "out" / "model.pte").stat().st_size < 25e6


@pytest.mark.slow
def test_minilm_8da4w_falls_below_the_accuracy_thresholds(minilm, tmp_path):
    model, tokenizer = minilm
    inputs = build_inputs(model, tokenizer)
    with pytest.raises(ParityError, match=r"^the quantized artifact's sentence embeddings differ from eager float32 over 40 sentences: min_cosine 0\.9\d+ < 0\.98"):
        export_to_folder(model, inputs, "executorch", tmp_path / "out", quantize="8da4w", preprocessor=tokenizer)
    assert not (tmp_path / "out").exists()
