"""``--kv-cache program``: a decoder-only generation folder whose one ExecuTorch method holds the key/value
cache as mutable buffers and is driven by position, as ExecuTorch's LLM runner drives it."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("executorch.runtime", reason="the in-program cache is an ExecuTorch layout: it needs the executorch extra")

from hf_exporters.errors import InputError  # noqa: E402
from hf_exporters.generation import ExportedGenerator, export_generation_folder  # noqa: E402
from hf_exporters.runtime.et_runner import ExecutorchRunner  # noqa: E402
from config_models import spread_tiny_llama  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MAX_SEQ_LEN = 32


def _operators(pte) -> set[str]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    plans = deserialize_pte_binary(pte.read_bytes()).program.execution_plan
    return {op.name for plan in plans for op in plan.operators}


@pytest.fixture(scope="module", params=[True, False], ids=["custom-sdpa", "torch-attention"])
def program_folder(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("program-cache")
    model = spread_tiny_llama(root / "ckpt")
    folder = root / "out"
    manifest = export_generation_folder(root / "ckpt", "executorch", folder, kv_cache="program", max_seq_len=MAX_SEQ_LEN, custom_sdpa=request.param)
    return model, folder, manifest


def test_one_method_takes_ids_and_positions_and_returns_logits_only(program_folder):
    model, folder, manifest = program_folder
    assert list(manifest["parts"]) == ["decode"]
    part = manifest["parts"]["decode"]
    assert part["cache"]["kind"] == "program" and part["cache"]["max_cache_len"] == MAX_SEQ_LEN and part["cache"]["layers"] == 2
    custom = part["cache"]["custom_ops"]
    llama_ops = {op for op in _operators(folder / part["file"]) if op.startswith("llama::")}
    # ExecuTorch's operators write the cache (twice per layer: keys, values) and attend over it, or none of them
    assert llama_ops == ({"llama::update_cache", "llama::custom_sdpa"} if custom else set())
    assert [i["name"] for i in part["inputs"]] == ["input_ids", "cache_position"] and part["outputs"] == ["logits"]
    assert part["parity"]["ok"] and part["parity"]["max_abs_eager"] > 1.0  # the prompt's logits match eager, and carry signal
    assert part["method"] == "forward"  # the program's one method, as ExecuTorch's runners call it
    runner = ExecutorchRunner(folder / part["file"])
    meta = runner.method.metadata
    assert (meta.num_inputs(), meta.num_outputs()) == (2, 1)  # no cache tensor in or out
    assert runner.input_max_sizes[0] == (1, MAX_SEQ_LEN)
    # a position past the cache is refused before the program writes there (index_put checks part of it only)
    # (with the custom operators, cache_position's first value starts the run of positions written)
    assert runner.index_bounds == {0: (96, 0), 1: (MAX_SEQ_LEN, 2 if custom else 1)}
    with pytest.raises(InputError) as caught:
        runner({"input_ids": torch.tensor([[1, 2]]), "cache_position": torch.tensor([0, 1000000])})
    what = "cache" if custom else "axis"
    assert str(caught.value) == f"input 'cache_position' holds the index 1000000, outside the 32 positions of the {what} it indexes (valid: 0 to 31)"
    if custom:  # a start in the cache whose run passes its end: update_cache would fail inside execute
        with pytest.raises(InputError) as caught:
            runner({"input_ids": torch.tensor([[1, 2, 3]]), "cache_position": torch.tensor([31, 0, 1])})
        assert str(caught.value) == (
            "input 'cache_position' starts at position 31: its 3 positions from there pass the 32 positions of the cache it writes "
            "(valid starts for 3: 0 to 29)"
        )
        # positions that do not follow each other: the operators would write and attend 0, 1, 2 all the same
        for positions, message in (([0, 5, 6], "0 then 5 (elements 0 and 1)"), ([2, 1, 0], "2 then 1 (elements 0 and 1)")):
            with pytest.raises(InputError) as caught:
                runner({"input_ids": torch.tensor([[1, 2, 3]]), "cache_position": torch.tensor(positions)})
            assert str(caught.value) == (
                f"input 'cache_position' holds the positions {message}: the cache is written at one run of positions, each one past the one before"
            )
    # the batch axis was traced at 1: a batch of 2 is refused (it aborted update_cache)
    assert runner.static_axes == [(0, 0, 1)]
    with pytest.raises(InputError) as caught:
        runner({"input_ids": torch.tensor([[1, 2], [3, 4]]), "cache_position": torch.tensor([0, 1])})
    assert str(caught.value) == "input 'input_ids' is 2 long on axis 0, which the program was exported for at 1 only"
    # the tokens and their positions were traced as one length: a mismatch is refused (it aborted custom_sdpa)
    assert runner.equal_axes == [(0, 1, 1, 0)]
    for ids, positions in (([[1, 2]], [0]), ([[1]], [0, 1])):
        with pytest.raises(InputError) as caught:
            runner({"input_ids": torch.tensor(ids), "cache_position": torch.tensor(positions)})
        assert str(caught.value) == (
            f"inputs 'input_ids' (axis 1) and 'cache_position' (axis 0) are {len(ids[0])} and {len(positions)} long: "
            "the program was exported with one size for both"
        )


def test_generated_ids_equal_eager_generate_and_a_second_prompt_starts_afresh(program_folder):
    model, folder, _ = program_folder
    generator = ExportedGenerator.from_pretrained(folder)
    for prompt in ([5, 17, 33, 2, 71, 9], [40, 3, 3]):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            eager = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
        got = generator.generate(ids, max_new_tokens=10)
        assert got.tolist() == eager.tolist()
        assert len(set(got[0, len(prompt):].tolist())) > 1  # not one repeated token


def test_requests_the_program_cannot_hold_are_refused(program_folder):
    _, folder, _ = program_folder
    generator = ExportedGenerator.from_pretrained(folder)
    for kwargs, message in [
        ({"input_ids": torch.ones(2, 4, dtype=torch.long)}, "this folder's program holds the cache of a batch of 1; got a batch of 2 (generate one prompt at a time)"),
        ({"input_ids": torch.ones(1, 4, dtype=torch.long), "attention_mask": torch.tensor([[0, 1, 1, 1]])},
         "this folder's program places tokens by their index: a padded prompt (zeros in attention_mask) is not supported"),
        ({"input_ids": torch.ones(1, 40, dtype=torch.long)}, "prompt of 40 tokens: this folder's program holds at most 32 positions (re-export with a larger --max-seq-len)"),
        ({"input_ids": torch.ones(1, 30, dtype=torch.long), "max_new_tokens": 5},
         "prompt of 30 tokens plus 5 new tokens needs 34 positions: this folder's program holds at most 32 (re-export with a larger --max-seq-len, or ask for at most 3 new tokens)"),
    ]:
        with pytest.raises(InputError) as caught:
            generator.generate(**{"max_new_tokens": 2, **kwargs})
        assert str(caught.value) == message


def test_program_cache_is_refused_where_it_does_not_apply(tmp_path, program_folder):
    from typer.testing import CliRunner

    from hf_exporters.cli import app

    checkpoint = program_folder[1].parent / "ckpt"
    runner = CliRunner()
    for args, message in [
        (["-b", "onnx", "--task", "text-generation", "--kv-cache", "program"], "error: --kv-cache program holds the cache in an ExecuTorch program; use --backend executorch, not 'onnx'"),
        (["-b", "executorch", "--kv-cache", "program"], "error: --kv-cache applies to --task text-generation exports, not 'a single export'"),
        (["-b", "executorch", "--task", "text-generation", "--no-custom-sdpa"],
         "error: --no-custom-sdpa applies to --kv-cache program exports (the other layouts use torch's attention)"),
    ]:
        result = runner.invoke(app, ["export", "-m", str(checkpoint), "-o", str(tmp_path / "x"), *args])
        assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == message, result.output
        assert not (tmp_path / "x").exists()
    manifest = json.loads((program_folder[1] / "export.json").read_text())
    assert manifest["program"]["methods"] == ["forward"]


def test_a_short_cache_cuts_the_example_prompt_and_a_long_window_is_a_full_cache(tmp_path):
    """The example prompt (7 tokens here) is cut to leave room in a 4-position cache; Mistral's sliding window
    (4096 positions) never drops a position of a 16-position cache, so its layers are full static layers."""
    import transformers

    model = spread_tiny_llama(tmp_path / "llama")
    manifest = export_generation_folder(tmp_path / "llama", "executorch", tmp_path / "short", kv_cache="program", max_seq_len=4)
    assert manifest["parts"]["decode"]["inputs"][0]["shape"] == [1, 3]
    ids = torch.tensor([[5, 17]])
    with torch.no_grad():
        eager = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
    assert ExportedGenerator.from_pretrained(tmp_path / "short").generate(ids, max_new_tokens=3).tolist() == eager.tolist()
    config = transformers.MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=64, sliding_window=4096, eos_token_id=None)
    torch.manual_seed(0)
    mistral = transformers.MistralForCausalLM(config).eval()
    mistral.save_pretrained(tmp_path / "mistral")
    export_generation_folder(tmp_path / "mistral", "executorch", tmp_path / "mistral-out", kv_cache="program", max_seq_len=16)
    ids = torch.tensor([[5, 17, 33, 2]])
    with torch.no_grad():
        eager = mistral.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    assert ExportedGenerator.from_pretrained(tmp_path / "mistral-out").generate(ids, max_new_tokens=6).tolist() == eager.tolist()


def test_the_custom_operator_step_equals_torch_attention_and_restores_the_attention_implementation():
    """``llama::update_cache`` / ``llama::custom_sdpa`` (grouped-query: 4 heads over 2 key/value heads) give
    the logits of torch's attention over the same cache, prompt then one token; the model's attention
    implementation is its own again after each call."""
    from hf_exporters.generation.steps import ProgramCacheStep

    model = spread_tiny_llama()
    before = model.config._attn_implementation
    custom, plain = ProgramCacheStep(model, 16, custom_ops=True), ProgramCacheStep(model, 16)
    assert tuple(custom.key_cache_0.shape) == (1, 16, 2, 8) and tuple(plain.key_cache_0.shape) == (1, 2, 16, 8)
    with torch.no_grad():
        for ids, positions in [(torch.tensor([[5, 17, 33, 2]]), torch.arange(4)), (torch.tensor([[71]]), torch.tensor([4]))]:
            got, expected = custom(ids, positions), plain(ids, positions)
            assert expected.abs().max() > 1.0 and torch.allclose(got, expected, atol=1e-4, rtol=0)
            assert model.config._attn_implementation == before


def test_custom_sdpa_without_the_operators_is_one_error(tmp_path, monkeypatch):
    from hf_exporters.generation import executorch_ops

    monkeypatch.setattr(executorch_ops, "load_custom_ops", lambda: False)
    checkpoint = tmp_path / "ckpt"
    spread_tiny_llama(checkpoint)
    with pytest.raises(InputError) as caught:
        export_generation_folder(checkpoint, "executorch", tmp_path / "out", kv_cache="program", max_seq_len=MAX_SEQ_LEN)
    assert str(caught.value) == (
        "--custom-sdpa needs ExecuTorch's LLM operators (executorch.extension.llm.custom_ops), which the installed "
        "executorch lacks; use --no-custom-sdpa"
    )
    assert not (tmp_path / "out").exists()


def _refusal(checkpoint, out) -> str:
    """The error exporting ``checkpoint`` with the custom operators: one line, blaming no model source line
    (the refusal is ours, raised inside the trace); nothing is written to ``out``."""
    from hf_exporters.errors import ExportStageError

    with pytest.raises(ExportStageError) as caught:
        export_generation_folder(checkpoint, "executorch", out, kv_cache="program", max_seq_len=16)
    assert not out.exists()
    assert caught.value.blamed is None and "\n" not in str(caught.value)
    return str(caught.value)


def test_attention_the_custom_operator_lacks_is_refused_and_exports_with_torch_attention(tmp_path):
    """Gemma 2 soft-caps its attention logits, which ``llama::custom_sdpa`` does not: one error naming the
    way out, and ``custom_sdpa=False`` exports it (its ids equal eager's)."""
    import transformers

    config = transformers.Gemma2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=64, eos_token_id=None)
    torch.manual_seed(0)
    gemma = transformers.Gemma2ForCausalLM(config).eval()
    gemma.save_pretrained(tmp_path / "gemma2")
    assert _refusal(tmp_path / "gemma2", tmp_path / "out") == (
        "[executorch] trace (torch.export.export) failed: InputError: ExecuTorch's custom SDPA has no softcap "
        "(Gemma2Attention uses it); export with --no-custom-sdpa"
    )
    export_generation_folder(tmp_path / "gemma2", "executorch", tmp_path / "out", kv_cache="program", max_seq_len=16, custom_sdpa=False)
    ids = torch.tensor([[5, 17, 33]])
    with torch.no_grad():
        eager = gemma.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    assert ExportedGenerator.from_pretrained(tmp_path / "out").generate(ids, max_new_tokens=5).tolist() == eager.tolist()


def test_a_model_attending_outside_the_attention_interface_is_refused_and_bfloat16_exports(tmp_path):
    """Bloom computes its attention itself (it would read the custom layers' caches heads-first): refused,
    naming the way out. A bfloat16 checkpoint (cast to float32 for XNNPACK) exports with the operators, its
    parity checked against the model's own attention."""
    import transformers

    config = transformers.BloomConfig(vocab_size=96, hidden_size=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    transformers.BloomForCausalLM(config).eval().save_pretrained(tmp_path / "bloom")
    assert _refusal(tmp_path / "bloom", tmp_path / "out") == (
        "[executorch] trace (torch.export.export) failed: InputError: BloomForCausalLM attends through transformers' attention "
        "interface in 0 of its 2 layers, so ExecuTorch's custom SDPA cannot stand in for its attention; export with --no-custom-sdpa"
    )
    spread_tiny_llama().to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    manifest = export_generation_folder(tmp_path / "bf16", "executorch", tmp_path / "bf16-out", kv_cache="program", max_seq_len=16)
    assert manifest["parts"]["decode"]["cache"]["custom_ops"] and manifest["parts"]["decode"]["parity"]["ok"]


def test_a_cache_longer_than_a_learned_position_table_is_refused(tmp_path):
    """GPT-2 indexes its 16-row position table (``wpe``) with ``cache_position``: a 32-position cache would be
    refused at every step past the 16th, so the export is refused, naming the largest cache that fits; nothing
    is written."""
    import transformers

    config = transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=1, n_head=2, n_positions=16)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(tmp_path / "gpt2")
    with pytest.raises(InputError) as caught:
        export_generation_folder(tmp_path / "gpt2", "executorch", tmp_path / "out", kv_cache="program", max_seq_len=32)
    assert str(caught.value) == (
        "--max-seq-len 32 is more positions than the model's learned position table holds (16 rows, indexed by cache_position): "
        "use --max-seq-len 16 or less"
    )
    assert not (tmp_path / "out").exists()
