"""``--dtype``: exports in float16 and bfloat16, checked against eager in that dtype and against float32."""

import json

import onnxruntime
import pytest
import torch
import transformers

from hf_exporters.errors import InputError
from hf_exporters.pipeline import export_to_folder
from hf_exporters.precision import DTYPE_RTOL, cast_for_export, dtype_tolerance, parse_dtype


def _tiny_bert() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_parse_dtype_takes_torch_and_optimum_names():
    assert parse_dtype("float16") is parse_dtype("fp16") is torch.float16
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype(None) is None
    with pytest.raises(InputError) as caught:
        parse_dtype("int4")
    assert str(caught.value) == "--dtype 'int4' is not one of float32, float16, bfloat16 (or fp32, fp16, bf16)"


def test_cast_keeps_ids_and_casts_floating_inputs():
    model = torch.nn.Linear(2, 2)
    ids = torch.tensor([[1, 2]])
    cast = cast_for_export(model, {"input_ids": ids, "pixel_values": torch.ones(1, 2), "nested": [torch.zeros(1)]}, torch.float16)
    assert model.weight.dtype == torch.float16
    assert cast["input_ids"] is ids and cast["pixel_values"].dtype == torch.float16 and cast["nested"][0].dtype == torch.float16


def test_tolerance_scales_with_the_largest_output():
    expected = [("a", torch.tensor([1.0, -8.0])), ("ids", torch.tensor([100]))]
    assert dtype_tolerance(torch.float16, 1e-4, expected) == pytest.approx(1e-4 + DTYPE_RTOL[torch.float16] * 8.0)
    assert dtype_tolerance(torch.float32, 1e-4, expected) == 1e-4


@pytest.mark.parametrize("backend", ["onnx", "dynamo", "executorch"])
def test_float16_export_matches_float16_and_float32_eager(backend, tmp_path):
    model, inputs = _tiny_bert()
    with torch.no_grad():
        float32 = model(**inputs).last_hidden_state
    manifest = export_to_folder(model, inputs, backend, tmp_path / "out", dtype="fp16")
    assert manifest["dtype"] == "float16"
    assert json.loads((tmp_path / "out" / "export.json").read_text())["dtype"] == "float16"
    assert manifest["inputs"][0]["dtype"] == "int64"
    assert manifest["outputs"][0]["dtype"] == "float16"
    scale = float(float32.abs().max())
    # the artifact keeps float16 eager's values to a few float16 steps, and float32 eager's to the cast's rounding
    assert manifest["parity"][0]["max_abs_diff"] <= manifest["atol"] < 1e-4 + 5e-3 * scale + 1e-3
    assert 0 < manifest["parity_float32"]["max_abs_diff"] <= manifest["parity_float32"]["atol"]
    assert manifest["parity_float32"]["max_abs_diff"] > 1e-5  # the cast does change the values: float16 really ran


def test_bfloat16_onnx_is_refused_at_export_without_a_cpu_kernel(tmp_path):
    model, inputs = _tiny_bert()
    with pytest.raises(InputError) as caught:
        export_to_folder(model, inputs, "onnx", tmp_path / "out", dtype="bfloat16", validate=False)
    message = str(caught.value)
    assert message.startswith(f"onnxruntime {onnxruntime.__version__}'s CPU provider has no bfloat16 kernel for ")
    assert message.endswith(", so this artifact could not run there; export with --dtype float16 or float32")
    assert not (tmp_path / "out").exists()


def test_reduced_dtype_with_quantization_is_refused(tmp_path):
    model, inputs = _tiny_bert()
    with pytest.raises(InputError) as caught:
        export_to_folder(model, inputs, "onnx", tmp_path / "out", dtype="float16", quantize="int8-dynamic")
    assert str(caught.value) == "--quantize int8-dynamic quantizes a float32 model; it cannot be combined with --dtype float16"
    assert next(model.parameters()).dtype == torch.float32  # refused before the cast


class _Norms(torch.nn.Module):
    """A LayerNorm over 384 features and a GroupNorm, the shapes of MiniLM's hidden states and a conv stem."""

    def __init__(self) -> None:
        super().__init__()
        self.layer_norm = torch.nn.LayerNorm(384)
        self.group_norm = torch.nn.GroupNorm(4, 16)

    def forward(self, hidden: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer_norm(hidden), self.group_norm(image)


def _norm_inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    # values of the size an embedding sum reaches: the sum of squares passes float16's largest value
    hidden = 40 * torch.randn(2, 8, 384, generator=generator) + 5
    return {"hidden": hidden.half(), "image": (20 * torch.randn(2, 16, 6, 6, generator=generator)).half()}


def _run_in_executorch(module: torch.nn.Module, inputs: dict[str, torch.Tensor], folder) -> tuple[list[torch.Tensor], list[str]]:
    """The portable ``.pte`` of ``module``, run in executorch.runtime: (outputs as float32, names of the workarounds fired)."""
    from hf_exporters import ExecutorchConfig, ExecutorchExporter

    exporter = ExecutorchExporter()
    result = exporter.run(module, inputs, ExecutorchConfig(backend="portable"))
    exporter.save(result.program, folder)
    outputs = [torch.as_tensor(out).float() for out in exporter.load_runner(folder / "model.pte")(inputs)]
    return outputs, [w.name for w in result.workarounds_fired]


def test_float16_norms_keep_their_values_in_executorch(tmp_path):
    module, inputs = _Norms().half().eval(), _norm_inputs()
    with torch.no_grad():
        expected = [out.float() for out in module(**inputs)]
    outputs, fired = _run_in_executorch(module, inputs, tmp_path)
    assert "_patch_norms_in_float32" in fired
    for got, want in zip(outputs, expected):
        assert torch.isfinite(got).all()
        assert float((got - want).abs().max()) <= 8e-3  # a few float16 steps of values up to ~4


@pytest.mark.canary
def test_float16_norms_drift_in_executorch_without_the_patch(tmp_path):
    from workaround_helpers import without_workarounds

    module, inputs = _Norms().half().eval(), _norm_inputs()
    with torch.no_grad():
        expected = [out.float() for out in module(**inputs)]
    with without_workarounds("_patch_norms_in_float32"):
        outputs, _ = _run_in_executorch(module, inputs, tmp_path)
    worst = [float((got - want).abs().nan_to_num(nan=float("inf")).max()) for got, want in zip(outputs, expected)]
    assert max(worst) > 0.1, worst  # executorch 1.4 accumulates in float16: far off or not finite


def test_bfloat16_on_xnnpack_is_refused(tmp_path):
    model, inputs = _tiny_bert()
    with pytest.raises(InputError) as caught:
        export_to_folder(model, inputs, "executorch", tmp_path / "out", dtype="bf16")
    assert str(caught.value) == (
        "--dtype bfloat16: XNNPACK has no bfloat16 kernels; export float16 or float32 with xnnpack, or bfloat16 with --recipe portable"
    )


def test_a_bfloat16_model_exported_with_xnnpack_is_checked_as_float32(tmp_path):
    """XNNPACK computes in float32: without --dtype the folder export casts the model to float32 (documented),
    so the parity reference computes as the artifact does."""
    model, inputs = _tiny_bert()
    model.to(torch.bfloat16)
    manifest = export_to_folder(model, inputs, "executorch", tmp_path / "out")
    assert model.embeddings.word_embeddings.weight.dtype == torch.float32
    assert manifest["outputs"][0]["dtype"] == "float32"
    assert manifest["parity"][0]["ok"] and manifest["parity"][0]["max_abs_diff"] < 1e-4


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_the_cuda_recipe_without_a_gpu_is_refused_by_stage_1_not_by_the_cast(tmp_path):
    from hf_exporters.errors import ExportStageError

    model, inputs = _tiny_bert()
    with pytest.raises(ExportStageError) as caught:
        export_to_folder(model, inputs, "executorch", tmp_path / "out", recipe="cuda")
    assert caught.value.stage == "Stage 1: Backend preparation"
    assert caught.value.detail.startswith("RuntimeError: the ExecuTorch 'cuda' backend needs a CUDA GPU, and none is available here")
    assert model.embeddings.word_embeddings.weight.device.type == "cpu" and not (tmp_path / "out").exists()


def test_a_bfloat16_model_on_the_portable_recipe_gets_the_bfloat16_tolerance(tmp_path):
    """Without --dtype, a model already in bfloat16 (a bfloat16 checkpoint) is checked within bfloat16's tolerance."""
    model, inputs = _tiny_bert()
    model.to(torch.bfloat16)
    manifest = export_to_folder(model, inputs, "executorch", tmp_path / "out", recipe="portable")
    with torch.no_grad():
        scale = float(model(**inputs).last_hidden_state.float().abs().max())
    assert manifest["atol"] == pytest.approx(1e-3 + DTYPE_RTOL[torch.bfloat16] * scale)
    assert manifest["outputs"][0]["dtype"] == "bfloat16"
    assert manifest["parity"][0]["ok"] and 0 < manifest["parity"][0]["max_abs_diff"] <= manifest["atol"]


def test_float16_generation_folder_computes_in_float16(tmp_path):
    """``export --task text-generation --dtype float16``: the parts are captured from the cast model, checked
    against float16 eager within float16's tolerance, and generate float16 eager's ids."""
    from typer.testing import CliRunner

    from config_models import spread_tiny_llama
    from hf_exporters.cli import app
    from hf_exporters.generation import ExportedGenerator

    model = spread_tiny_llama(tmp_path / "ckpt")
    result = CliRunner().invoke(app, ["export", "--backend", "dynamo", "--task", "text-generation", "--dtype", "fp16",
                                      "--model", str(tmp_path / "ckpt"), "--output", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "export.json").read_text())
    assert manifest["dtype"] == "float16"
    for part in manifest["parts"].values():
        assert part["parity"]["ok"] and part["parity"]["rtol"] == pytest.approx(1e-5 + DTYPE_RTOL[torch.float16])
    ids = torch.tensor([[5, 17, 33, 2, 71, 9]])
    generator = ExportedGenerator.from_pretrained(tmp_path / "out")
    logits = generator.runners["prefill"]({"input_ids": ids, "attention_mask": torch.ones_like(ids)})[0]
    assert torch.as_tensor(logits).dtype == torch.float16
    with torch.no_grad():
        eager = model.half().generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert generator.generate(ids, max_new_tokens=8).tolist() == eager.tolist()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--backend", "executorch", "--dtype", "bf16"],
         "--dtype bfloat16: XNNPACK has no bfloat16 kernels; export float16 or float32 with xnnpack, or bfloat16 with --recipe portable"),
        (["--backend", "executorch", "--dtype", "fp16", "--quantize", "8da4w"],
         "--quantize 8da4w quantizes a float32 model; it cannot be combined with --dtype fp16"),
        (["--backend", "onnx", "--dtype", "half"], "--dtype 'half' is not one of float32, float16, bfloat16 (or fp32, fp16, bf16)"),
    ],
)
def test_generation_dtype_requests_refused_before_loading(tmp_path, options, message):
    from hf_exporters.generation import export_generation_folder

    backend, dtype = options[1], options[3]
    quantize = options[5] if len(options) > 4 else None
    with pytest.raises(InputError) as caught:
        export_generation_folder(tmp_path / "no-checkpoint-needed", backend, tmp_path / "out", dtype=dtype, quantize=quantize)
    assert str(caught.value) == message
    assert not (tmp_path / "out").exists()


def test_xnnpack_keeps_float16_asked_for_on_a_wrapped_model():
    """A generation part wraps the model; ``--dtype float16`` is recorded on the model inside, and XNNPACK's
    Stage 1 keeps float16 for the wrapper (without the request it computes in float32)."""
    from hf_exporters.workarounds.executorch.backends import prepare_for_xnnpack

    class Step(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    asked = torch.nn.Linear(4, 4)
    cast_for_export(asked, {}, torch.float16)
    moved, inputs, _ = prepare_for_xnnpack(Step(asked), {"x": torch.ones(1, 4, dtype=torch.float16)})
    assert moved.inner.weight.dtype == torch.float16 and inputs["x"].dtype == torch.float16
    moved, inputs, _ = prepare_for_xnnpack(Step(torch.nn.Linear(4, 4).half()), {"x": torch.ones(1, 4, dtype=torch.float16)})
    assert moved.inner.weight.dtype == torch.float32 and inputs["x"].dtype == torch.float32


def test_onnx_generation_folders_in_float16_run_and_in_bfloat16_are_refused(tmp_path):
    """An ONNX generation folder in float16 runs in onnxruntime and generates float16 eager's ids; in bfloat16,
    where onnxruntime's CPU provider lacks kernels, it is refused at export (validated or not), naming the
    node, and nothing is written."""
    from config_models import spread_tiny_llama
    from hf_exporters.generation import ExportedGenerator, export_generation_folder

    model = spread_tiny_llama(tmp_path / "ckpt")
    manifest = export_generation_folder(tmp_path / "ckpt", "onnx", tmp_path / "fp16", dtype="float16")
    assert manifest["dtype"] == "float16" and all(part["parity"]["ok"] for part in manifest["parts"].values())
    ids = torch.tensor([[5, 17, 33, 2, 71, 9]])
    with torch.no_grad():
        eager = model.half().generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert ExportedGenerator.from_pretrained(tmp_path / "fp16").generate(ids, max_new_tokens=8).tolist() == eager.tolist()
    for validate in (True, False):
        with pytest.raises(InputError) as caught:
            export_generation_folder(tmp_path / "ckpt", "onnx", tmp_path / "bf16", dtype="bf16", validate=validate)
        message = str(caught.value)
        assert message.startswith(f"onnxruntime {onnxruntime.__version__}'s CPU provider has no bfloat16 kernel for "), message
        assert message.endswith(", so this artifact could not run there; export with --dtype float16 or float32")
        assert not (tmp_path / "bf16").exists()
