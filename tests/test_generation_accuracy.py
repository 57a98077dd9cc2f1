"""Quantized generation folders are judged by next-token accuracy against float32 eager.

A tiny Llama (weights spread wide, see ``test_generation._spread_weights``) with a character-level
tokenizer, so the shipped prompts give real, varied token ids. The float folder scores exactly what
eager scores (the teacher-forced path is the generation loop); int8 weights pass the thresholds; int4
weights of a random model do not, and the export is refused with the figures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import torch
import transformers as tf
from typer.testing import CliRunner

from hf_exporters.cli import app
from hf_exporters.errors import InputError
from hf_exporters.generation import ExportedGenerator, export_generation_folder
from hf_exporters.generation.accuracy import NEW_TOKENS, PROMPTS, THRESHOLDS, measure, prompt_ids
from hf_exporters.runtime import cpp_runner

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def _char_tokenizer() -> tf.PreTrainedTokenizerFast:
    """One token per character: letters are ids 3-28, the space 29, anything else ``<unk>`` (0)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{chr(ord("a") + i): 3 + i for i in range(26)}, " ": 29}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return tf.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _checkpoint(folder, tokenizer: bool = True):
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**TINY, bos_token_id=1, eos_token_id=2))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    model.eval().save_pretrained(folder)
    if tokenizer:
        _char_tokenizer().save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("accuracy") / "ckpt"
    return _checkpoint(folder), folder


def test_the_prompts_give_varied_ids():
    ids = prompt_ids(_char_tokenizer())
    assert len(ids) == len(PROMPTS) == 40
    assert all(t.shape[0] == 1 and t.shape[1] >= 20 for t in ids)
    assert len(set(torch.cat(ids, dim=1)[0].tolist())) >= 20


def test_a_float_folder_scores_what_eager_scores(checkpoint, tmp_path):
    """The teacher-forced path of the generator is its generation loop: fed eager's own greedy
    tokens, a float32 folder agrees on every position with a KL divergence of float rounding, and
    its greedy ids are the argmax of the scored rows."""
    model, folder = checkpoint
    manifest = export_generation_folder(folder, "dynamo", tmp_path / "float")
    assert "accuracy" not in manifest and all(part["parity"]["ok"] for part in manifest["parts"].values())
    generator = ExportedGenerator.from_pretrained(tmp_path / "float")
    prompts = prompt_ids(generator.preprocessor)
    accuracy = measure(model, generator, prompts)
    assert (accuracy.top1_agreement, accuracy.positions, accuracy.prompts) == (1.0, 40 * NEW_TOKENS, 40)
    assert accuracy.mean_kl < 1e-6 and accuracy.max_kl < 1e-5
    ids = prompts[0]
    greedy = generator.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS)[:, ids.shape[1]:]
    scored = generator.score(ids, greedy)
    assert scored.shape == (1, NEW_TOKENS, TINY["vocab_size"])
    assert scored.argmax(-1).tolist() == greedy.tolist()
    with pytest.raises(InputError, match=r"^continuation must be \(B, n\) with B = 1 and n >= 1, got \(1, 0\)$"):
        generator.score(ids, greedy[:, :0])


def test_int8_executorch_folder_passes_and_records_its_accuracy(checkpoint, tmp_path):
    """8da8w linears and int8 embeddings: every part skips element parity, the folder's next-token
    accuracy is recorded and above the thresholds, and the folder generates in both runtimes."""
    _, folder = checkpoint
    out = tmp_path / "int8"
    result = CliRunner().invoke(
        app, ["export", "-m", str(folder), "-o", str(out), "--task", "text-generation", "--backend", "executorch", "--quantize", "8da8w", "--qembedding", "8w"]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "export.json").read_text())
    accuracy = manifest["accuracy"]
    line = re.search(r"^next-token accuracy vs eager float32 over 160 positions of 40 prompts: top-1 agreement ([0-9.]+), mean KL ([0-9.]+) nats \(max ([0-9.]+)\)$", result.output, re.M)
    assert line and float(line.group(1)) == pytest.approx(accuracy["top1_agreement"], abs=1e-3)
    assert accuracy["ok"] and accuracy["thresholds"] == THRESHOLDS
    assert accuracy["top1_agreement"] >= 0.9 and accuracy["mean_kl"] <= 0.1 and accuracy["max_kl"] >= accuracy["mean_kl"] > 0
    assert (accuracy["positions"], accuracy["prompts"], accuracy["new_tokens"]) == (160, 40, NEW_TOKENS)
    quantization = manifest["executorch"]
    assert (quantization["quantize"], quantization["group_size"], quantization["quantized_linears"], quantization["float_linears"]) == ("8da8w", None, 15, 0)
    assert (quantization["quantize_embeddings"], quantization["quantized_embeddings"]) == ("8w", 1)
    assert all(part["parity"] is None for part in manifest["parts"].values())
    prompt = torch.tensor([[3, 4, 5, 6, 29, 7]])
    python_ids = ExportedGenerator.from_pretrained(out).generate(prompt, max_new_tokens=8)
    assert python_ids.shape == (1, 14) and len(set(python_ids[0, 6:].tolist())) > 1
    cpp_ids = ExportedGenerator.from_pretrained(out, runtime="cpp").generate(prompt, max_new_tokens=8)  # make test builds cpp/
    assert cpp_ids.tolist() == python_ids.tolist()
    # an id past the table would abort the process in the int8 embedding kernel: refused before any part runs
    assert manifest["vocab_size"] == TINY["vocab_size"]
    for runtime in ("python", "cpp"):
        with pytest.raises(InputError, match=r"^token id 100 in input_ids is outside the vocabulary \(0 to 63\)$"):
            ExportedGenerator.from_pretrained(out, runtime=runtime).generate(torch.tensor([[3, 4, 100]]), max_new_tokens=2)
    with pytest.raises(InputError, match=r"^token id -1 in continuation is outside the vocabulary \(0 to 63\)$"):
        ExportedGenerator.from_pretrained(out).score(prompt, torch.tensor([[-1, 3]]))
    with pytest.raises(InputError, match=r"^continuation must be a \(B, T\) tensor of integer token ids, got list$"):
        ExportedGenerator.from_pretrained(out).score(prompt, [[3, 4]])
    loaded = ExportedGenerator.from_pretrained(out)
    for call, message in [
        (lambda: loaded.generate(torch.tensor([3, 4, 5]), max_new_tokens=2),
         r"^input_ids must be a \(B, T\) tensor of integer token ids, got a 1-D torch.int64 tensor$"),
        (lambda: loaded.generate(torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2), r"^input_ids has no token: the prompt is empty$"),
        (lambda: loaded.generate(prompt, attention_mask=torch.ones(1, 4, dtype=torch.long), max_new_tokens=2),
         r"^attention_mask must have input_ids' shape \(1, 6\), got \(1, 4\)$"),
        (lambda: loaded.generate(prompt, max_new_tokens=0), r"^max_new_tokens must be an integer of at least 1, got 0$"),
    ]:
        with pytest.raises(InputError, match=message):
            call()
    hfx = subprocess.run([str(cpp_runner.hfx_run()), str(out), "--generate", "--input-ids", "3,4,100", "--max-new-tokens", "4"],
                         capture_output=True, text=True, check=False)
    assert (hfx.returncode, hfx.stderr.strip().splitlines()[-1]) == (1, "error: token id 100 is outside the vocabulary (0 to 63)")


def test_int8_onnx_folder_passes(checkpoint, tmp_path):
    _, folder = checkpoint
    manifest = export_generation_folder(folder, "onnx", tmp_path / "onnx", quantize="int8-dynamic")
    assert manifest["onnx"]["quantize"] == "int8-dynamic"
    assert manifest["accuracy"]["ok"] and manifest["accuracy"]["top1_agreement"] >= 0.9
    import onnx

    graph = onnx.load(tmp_path / "onnx" / manifest["parts"]["decode"]["file"], load_external_data=False).graph
    assert any(node.op_type in ("MatMulInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLinear") for node in graph.node)


def test_an_unchecked_quantized_folder_says_so(checkpoint, tmp_path):
    _, folder = checkpoint
    out = tmp_path / "unchecked"
    result = CliRunner().invoke(
        app, ["export", "-m", str(folder), "-o", str(out), "--task", "text-generation", "--backend", "onnx", "--quantize", "int8-dynamic", "--no-validate"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == "quantized weights, not checked against eager (--no-validate)"
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["accuracy"] is None and manifest["onnx"]["quantize"] == "int8-dynamic"


def test_int4_weights_of_a_random_model_are_refused_with_the_figures(checkpoint, tmp_path):
    """4-bit weights in groups of 32 move a random tiny model's next tokens (real checkpoints keep
    them): the export fails with one error line giving the figures, and writes nothing."""
    _, folder = checkpoint
    out = tmp_path / "int4"
    result = CliRunner().invoke(app, ["export", "-m", str(folder), "-o", str(out), "--task", "text-generation", "--backend", "executorch", "--quantize", "8da4w"])
    assert result.exit_code == 1, result.output
    match = re.fullmatch(
        r"error: next-token accuracy below threshold: top-1 agreement ([0-9.]+) \(floor 0\.9\), mean KL ([0-9.]+) nats \(ceiling 0\.1\) over 160 positions of 40 prompts",
        result.output.strip().splitlines()[-1],
    )
    assert match, result.output
    assert float(match.group(1)) < 0.9 or float(match.group(2)) > 0.1
    assert not out.exists() and not any(p.name.startswith(".") for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    "tokenizer, args, message",
    [
        (False, ["--backend", "executorch", "--quantize", "8da8w"], "error: a quantized generation folder is checked on real prompts: the checkpoint needs a tokenizer"),
        (False, ["--backend", "onnx", "--quantize", "int8-static"],
         "error: --quantize int8-static is not supported for generation exports: its calibration would see one example prompt per part; use int8-dynamic"),
        (True, ["--backend", "executorch", "--quantize", "8da8w", "--max-seq-len", "64"],
         "error: --max-seq-len 64 is too short for the accuracy check of a quantized folder: its longest prompt is 78 tokens and 3 decode "
         "positions follow (81); give --max-seq-len 81 or more, or --no-validate"),
        (False, ["--backend", "dynamo", "--quantize", "8da8w"], "error: --quantize applies to the onnx and executorch backends, not 'dynamo'"),
    ],
)
def test_quantized_generation_refusals(tmp_path, tokenizer, args, message):
    folder = tmp_path / "ckpt"
    _checkpoint(folder, tokenizer=tokenizer)
    result = CliRunner().invoke(app, ["export", "-m", str(folder), "-o", str(tmp_path / "out"), "--task", "text-generation", *args])
    assert result.exit_code == 1 and result.output.strip() == message
    assert not (tmp_path / "out").exists()


def test_compare_eager_on_a_quantized_folder_says_what_was_checked(checkpoint, tmp_path):
    """Greedy ids of int8/int4 weights may part from float32 eager's: `generate --compare-eager` exits 3
    as for any difference, and says the folder was checked by next-token accuracy instead."""
    import typer

    from hf_exporters.cli_generate import register

    _, folder = checkpoint
    out = tmp_path / "gen"
    export_generation_folder(folder, "dynamo", out)
    manifest = json.loads((out / "export.json").read_text())
    manifest["accuracy"] = {"top1_agreement": 0.95, "mean_kl": 0.01, "ok": True}  # as a quantized folder records it
    (out / "export.json").write_text(json.dumps(manifest))
    other = tmp_path / "other"
    _checkpoint(other, tokenizer=False)
    model = tf.LlamaForCausalLM.from_pretrained(other)
    with torch.no_grad():  # another model: other ids
        model.lm_head.weight.mul_(-1)
    model.save_pretrained(other)
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps typer from collapsing the app into one command
        pass

    result = CliRunner().invoke(app, ["generate", str(out), "--prompt", "hello world", "-n", "6", "--compare-eager", "--model", str(other)])
    assert result.exit_code == 3, result.output
    assert "equal to eager generate(): no" in result.output
    assert result.output.strip().splitlines()[-1] == (
        "the folder's weights are quantized: its export checked next-token accuracy, not equal ids (export.json accuracy)"
    )


def test_an_encoder_decoder_folder_is_scored_from_its_decoder_start_token(tmp_path):
    """T5 starts its decoder at token 0 and its generation config asks for beam search: the check
    scores the decoder from that start token, greedy, and a float folder agrees on every position."""
    from hf_exporters.generation import export_for_generation
    from hf_exporters.pipeline import make_config, make_exporter

    torch.manual_seed(0)
    config = tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = tf.T5ForConditionalGeneration(config).eval()
    ids = torch.tensor([[5, 9, 13, 2, 7]])
    exporter = make_exporter("dynamo")
    artifacts = export_for_generation(exporter, model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, make_config(exporter, True, None))
    model.generation_config.num_beams = 4  # written to the folder's generation_config.json (as bart-large-cnn's)
    artifacts.save_pretrained(tmp_path / "t5")
    generator = ExportedGenerator.from_pretrained(tmp_path / "t5")
    accuracy = measure(model, generator, prompt_ids(_char_tokenizer())[:5])
    assert (accuracy.top1_agreement, accuracy.positions, accuracy.reference_dtype) == (1.0, 5 * NEW_TOKENS, "float32")
    assert accuracy.mean_kl < 1e-6
