"""Generation from exported graphs: greedy token ids equal eager ``generate()``.

Each check exports a tiny model's generation parts with one backend, writes the artifact folder,
loads it with ``ExportedGenerator.from_pretrained`` and compares the ids of 8 new tokens with eager
``model.generate()`` on the export inputs and on inputs of another batch size / length.
Default subset: Llama on the three backends, T5 and LLaVA on dynamo, folder checks, CLI. The rest is ``slow``.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

import numpy as np
import torch
import transformers as tf

from hf_exporters.errors import InputError, ManifestError
from hf_exporters.generation import ExportedGenerator, build_parts, export_for_generation, read_manifest
from hf_exporters.pipeline import make_config, make_exporter

from config_models import build, example_inputs

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NEW_TOKENS = 8
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def _spread_weights(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Re-draw every weight with a wider spread: a tiny randomly initialised model otherwise tends to
    repeat one token, which would make equal ids a weak check."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model.eval()


def _text_inputs(batch: int, seq: int, pad_left: int = 0, pad_right: int = 0, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (batch, seq), generator=generator)
    mask = torch.ones_like(ids)
    if batch > 1 and pad_left:
        mask[1, :pad_left] = 0
        ids[1, :pad_left] = 0
    if batch > 1 and pad_right:
        mask[1, -pad_right:] = 0
        ids[1, -pad_right:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def llama():
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**TINY, eos_token_id=None))
    return _spread_weights(model), [_text_inputs(2, 6, pad_left=2), _text_inputs(1, 9, seed=1)]


def qwen3():
    model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**TINY, head_dim=8, eos_token_id=None))
    return _spread_weights(model), [_text_inputs(2, 6, pad_left=2), _text_inputs(1, 9, seed=1)]


def gemma3_text():
    config = tf.Gemma3TextConfig(**TINY, head_dim=8, sliding_window=4, eos_token_id=None, pad_token_id=0)
    model = tf.Gemma3ForCausalLM(config)
    return _spread_weights(model), [_text_inputs(1, 6), _text_inputs(2, 9, pad_left=2, seed=1)]


def phi3():
    model = tf.Phi3ForCausalLM(tf.Phi3Config(**TINY, pad_token_id=0, eos_token_id=None))
    return _spread_weights(model), [_text_inputs(2, 6, pad_left=2), _text_inputs(1, 9, seed=1)]


def mistral_sliding():
    """H3 (Mistral decode steps on a filled DynamicCache), with sliding_window=4 and 6-9 prompt tokens
    and 8 new ones: generation runs far past the window.
    Exported from a batch of 1 (widened to 2 for the trace), checked on a left-padded batch of 2 too."""
    model = tf.MistralForCausalLM(tf.MistralConfig(**TINY, sliding_window=4, eos_token_id=None))
    return _spread_weights(model), [_text_inputs(1, 6), _text_inputs(2, 9, pad_left=2, seed=1)]


def mixtral():
    model = tf.MixtralForCausalLM(tf.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2, eos_token_id=None))
    return _spread_weights(model), [_text_inputs(2, 6, pad_left=2), _text_inputs(1, 9, seed=1)]


def t5():
    """H10: a padded batch; the encoder mask must reach the encoder and the cross-attention."""
    config = tf.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=None)
    model = tf.T5ForConditionalGeneration(config)
    return _spread_weights(model), [_text_inputs(2, 6, pad_right=2), _text_inputs(1, 9, seed=1)]


def bart():
    config = tf.BartConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, eos_token_id=None, forced_eos_token_id=None,
        forced_bos_token_id=None, decoder_start_token_id=2, pad_token_id=1,
    )
    model = tf.BartForConditionalGeneration(config)
    return _spread_weights(model), [_text_inputs(2, 6, pad_right=2), _text_inputs(1, 9, seed=1)]


def whisper():
    """H9: speech encoder (log-mel features) + decoder with an encoder-decoder cache."""
    config = tf.WhisperConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16, max_target_positions=32,
        decoder_start_token_id=1, pad_token_id=0, eos_token_id=None, bos_token_id=1, begin_suppress_tokens=None, suppress_tokens=None,
    )
    model = tf.WhisperForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(0)
    # exported from a batch of 2: from a batch-1 example the exported decoder keeps batch 1 (see the report)
    features = [{"input_features": torch.randn(b, 8, 32, generator=generator)} for b in (2, 1)]
    return _spread_weights(model), features


def llava():
    """Vision-language: CLIP vision tower + projector (the ``image_encoder`` part), Llama language model.
    Each prompt holds 16 image tokens (a 16x16 image in 4x4 patches); the second set is a left-padded batch of 2 images."""
    text = tf.LlamaConfig(**TINY, eos_token_id=None, pad_token_id=0)
    vision = tf.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=16, patch_size=4)
    config = tf.LlavaConfig(vision_config=vision, text_config=text, image_token_id=63, vision_feature_layer=-1)
    model = _spread_weights(tf.LlavaForConditionalGeneration(config))
    generator = torch.Generator().manual_seed(0)
    sets = []
    for batch, seq, pad in ((1, 20, 0), (2, 22, 2)):
        inputs = _text_inputs(batch, seq, pad_left=pad, seed=batch)
        inputs["input_ids"].clamp_(max=60)
        inputs["input_ids"][:, 4:20] = 63
        inputs["pixel_values"] = torch.randn(batch, 3, 16, 16, generator=generator)
        sets.append(inputs)
    return model, sets


def jamba():
    """A hybrid cache: one Mamba layer (convolution and state-space states, fixed size) and one attention
    layer (keys and values growing with the sequence). Exported from a left-padded batch of 2."""
    config = tf.JambaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=2, num_experts_per_tok=1,
        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False, eos_token_id=None, pad_token_id=0,
    )
    model = tf.JambaForCausalLM(config)
    return _spread_weights(model), [_text_inputs(2, 6, pad_left=2), _text_inputs(1, 9, seed=1)]


def mamba():
    """A state-space cache (``cache_params``): convolution and SSM states only. ``generate()`` passes no
    attention mask on decode steps, and the exported decode step must not apply the grown one."""
    config = tf.MambaConfig(vocab_size=64, hidden_size=32, state_size=8, num_hidden_layers=2, conv_kernel=4, expand=2, eos_token_id=None, pad_token_id=0)
    model = tf.MambaForCausalLM(config)
    return _spread_weights(model), [_text_inputs(1, 6), _text_inputs(2, 9, pad_left=2, seed=1)]


def qwen3_5():
    """Qwen3.5, text only: gated delta-net (linear attention) layers beside full attention, multimodal
    rotary positions. ``generate()`` drops an all-ones attention mask; the decode step exported from
    such a batch still applies the mask of a padded one, and takes the positions from it."""
    model = build("Qwen3_5ForConditionalGeneration")
    model.generation_config.eos_token_id = None
    # exported from an unpadded batch (generate() then drops the all-ones mask), run on a padded one
    return _spread_weights(model), [_text_inputs(2, 6), _text_inputs(2, 9, pad_left=3, seed=1)]


MODELS = {
    "llama": llama,
    "qwen3": qwen3,
    "gemma3_text": gemma3_text,
    "phi3": phi3,
    "mistral_sliding": mistral_sliding,
    "mixtral": mixtral,
    "t5": t5,
    "bart": bart,
    "whisper": whisper,
    "llava": llava,
    "jamba": jamba,
    "mamba": mamba,
    "qwen3_5": qwen3_5,
}
#: the fast tier's round trips (ExecuTorch's is tests/test_cpp.py's, which shares its export with the C++ tests)
FAST = {("llama", "dynamo"), ("llama", "onnx"), ("t5", "dynamo"), ("llava", "dynamo"), ("jamba", "dynamo"), ("mamba", "dynamo")}
#: (model, backend) pairs that do not pass yet, expected to fail (strictly), with the cause
XFAIL: dict[tuple[str, str], str] = {}
#: (model, backend) pairs whose ids match eager on some runs only (expected to fail, not strictly), with the cause
INTERMITTENT: dict[tuple[str, str], str] = {
    ("mamba", "executorch"): "after calls at another batch size, a decode step of ExecuTorch 1.4.1 intermittently returns "
    "logits up to 0.4 away from eager for the same inputs (the step alone, called repeatedly, stays exact); not yet traced",
}


def _export_folder(name: str, backend: str, tmp_path, generation_config=None, eos_token_id=None):
    model, input_sets = MODELS[name]()
    if eos_token_id is not None:
        model.generation_config.eos_token_id = eos_token_id
    exporter = make_exporter(backend)
    artifacts = export_for_generation(exporter, model, input_sets[0], make_config(exporter, True, None), generation_config)
    folder = tmp_path / f"{name}-{backend}"
    manifest = artifacts.save_pretrained(folder)
    return model, input_sets, folder, manifest


def _assert_same_ids(model, generator, input_sets, generation_config=None):
    for inputs in input_sets:
        with torch.no_grad():
            eager = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, generation_config=generation_config)
        got = generator.generate(**inputs, max_new_tokens=NEW_TOKENS)
        assert got.tolist() == eager.tolist(), f"exported ids {got.tolist()} != eager ids {eager.tolist()}"
        assert got.shape[1] >= NEW_TOKENS  # the new tokens are really there (no early stop)


def _assert_cache_stays_bound(generator, inputs):
    """ONNX: every decode step binds the previous step's cache outputs (``OrtValue``) as they are, and no step
    goes through ``InferenceSession.run``; with ``io_binding=False`` the ids are the same."""
    import onnxruntime as ort

    decode_caches = []
    for name, runner in generator.runners.items():
        bound = runner.run_bound

        def spy(feed, bound=bound, name=name):
            if name == "decode":
                decode_caches.append([type(t) for t in feed["past_key_values"]])
            outputs = bound(feed)
            assert all(isinstance(o, ort.OrtValue) for o in outputs)
            return outputs

        def refuse(*args, **kwargs):
            raise AssertionError("InferenceSession.run was called while the generator binds its inputs")

        runner.run_bound = spy
        runner.session.run = refuse
    got = generator.generate(**inputs, max_new_tokens=NEW_TOKENS)
    assert len(decode_caches) == got.shape[1] - inputs["input_ids"].shape[1] - 1 > 0  # one per step after the prefill
    assert all(kinds and set(kinds) == {ort.OrtValue} for kinds in decode_caches)
    for runner in generator.runners.values():
        del runner.run_bound, runner.session.run
    generator.io_binding = False
    try:
        assert generator.generate(**inputs, max_new_tokens=NEW_TOKENS).tolist() == got.tolist()
    finally:
        generator.io_binding = True


#: a token id the tiny Llama's greedy generation never produces from its test prompts (checked in the test)
UNUSED_LLAMA_TOKEN = 62


def _assert_onnxruntime_genai_runs_the_folder(model, folder, manifest, inputs):
    """onnxruntime-genai loads the ONNX folder from its own genai_config.json and generates eager's greedy ids."""
    og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai comes with the onnx extra")
    assert manifest["onnxruntime_genai"] == {"layout": True, "config": "genai_config.json"}
    decode = manifest["parts"]["decode"]
    assert decode["outputs"][:3] == ["logits", "present.0.key", "present.0.value"]
    assert [i["name"] for i in decode["inputs"]][:4] == ["input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value"]
    described = json.loads((folder / "genai_config.json").read_text())["model"]
    assert (described["eos_token_id"], described["vocab_size"]) == (UNUSED_LLAMA_TOKEN, model.config.vocab_size)
    heads = model.config.num_key_value_heads
    assert (described["decoder"]["num_key_value_heads"], described["decoder"]["head_size"]) == (heads, model.config.head_dim)
    genai_model = og.Model(str(folder))
    for row in range(inputs["input_ids"].shape[0]):
        prompt = inputs["input_ids"][row][inputs["attention_mask"][row].bool()][None]  # the row without its padding
        with torch.no_grad():
            want = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False)[0].tolist()
        assert UNUSED_LLAMA_TOKEN not in want[prompt.shape[1] :]
        params = og.GeneratorParams(genai_model)
        params.set_search_options(max_length=prompt.shape[1] + NEW_TOKENS, do_sample=False)
        generator = og.Generator(genai_model, params)
        generator.append_tokens(prompt.numpy().astype(np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        got = [int(t) for t in generator.get_sequence(0)]
        assert got == want and len(got) == prompt.shape[1] + NEW_TOKENS


def _params():
    for name in MODELS:
        for backend in ("dynamo", "onnx", "executorch"):
            marks = []
            if (name, backend) not in FAST:
                marks.append(pytest.mark.slow)
            if (name, backend) in XFAIL:
                marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[(name, backend)]))
            if (name, backend) in INTERMITTENT:
                marks.append(pytest.mark.xfail(strict=False, reason=INTERMITTENT[(name, backend)]))
            yield pytest.param(name, backend, marks=marks, id=f"{name}-{backend}")


@pytest.mark.parametrize(("name", "backend"), list(_params()))
def test_greedy_ids_equal_eager(name, backend, tmp_path):
    if backend == "executorch":
        pytest.importorskip("executorch.runtime", reason="the ExecuTorch generation tests need the executorch extra")
    # the ONNX Llama gets an eos id its prompts never generate, so its folder qualifies for onnxruntime-genai
    eos = UNUSED_LLAMA_TOKEN if (name, backend) == ("llama", "onnx") else None
    model, input_sets, folder, manifest = _export_folder(name, backend, tmp_path, eos_token_id=eos)
    assert all(part["parity"]["ok"] for part in manifest["parts"].values())
    generator = ExportedGenerator.from_pretrained(folder)
    _assert_same_ids(model, generator, input_sets)
    if (name, backend) == ("llama", "executorch"):
        # ExecuTorch planned memory for 128 positions: a longer prompt is refused before the runtime runs
        long_prompt = torch.randint(3, 64, (1, 200))
        with pytest.raises(InputError, match=r"^prompt of 200 tokens: this folder was exported for at most 128 \(re-export with a larger --max-seq-len\)$"):
            generator.generate(input_ids=long_prompt, max_new_tokens=2)
        with pytest.raises(InputError, match=r"^prompt of 100 tokens plus 40 new tokens needs 139 positions: this folder was exported for at most 128 "):
            generator.generate(input_ids=long_prompt[:, :100], max_new_tokens=40)
    if (name, backend) == ("llama", "onnx"):
        _assert_cache_stays_bound(generator, input_sets[0])
        _assert_onnxruntime_genai_runs_the_folder(model, folder, manifest, input_sets[0])
        _assert_truncated_weights_are_named(folder, manifest, input_sets[0])
    if name == "t5":  # no attention_mask: all ones, as generate() documents
        ids = input_sets[0]["input_ids"][:1]
        assert torch.equal(generator.generate(ids, max_new_tokens=4), generator.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4))
    if name == "llava":  # the folder's image encoder needs its image
        assert manifest["parts"]["image_encoder"]["extra"] == {"modality": "image", "input": "pixel_values", "per_item": True}
        text_only = {k: v for k, v in input_sets[0].items() if k != "pixel_values"}
        with pytest.raises(InputError, match=r"^the encoder takes \['pixel_values'\]; missing \['pixel_values'\]$"):
            generator.generate(**text_only, max_new_tokens=2)


@pytest.mark.slow
def test_executorch_parts_as_one_program_equal_one_program_per_part(tmp_path):
    """ExecuTorch ``one_program`` (the default) against ``one_program=False``: the folder holds one ``.pte``
    whose weights are stored once (the two files hold them twice), and both give eager's ids."""
    pytest.importorskip("executorch.runtime", reason="the ExecuTorch generation tests need the executorch extra")
    import dataclasses

    model, input_sets = MODELS["llama"]()
    exporter = make_exporter("executorch")
    folders = {}
    for one in (True, False):
        config = dataclasses.replace(make_config(exporter, True, None), one_program=one)
        folders[one] = tmp_path / f"one-program-{one}"
        manifest = export_for_generation(exporter, model, input_sets[0], config).save_pretrained(folders[one])
        assert [part["file"] for part in manifest["parts"].values()] == (["model.pte"] * 2 if one else ["prefill/model.pte", "decode/model.pte"])
        assert all(("method" in part) == one for part in manifest["parts"].values())
        _assert_same_ids(model, ExportedGenerator.from_pretrained(folders[one]), input_sets)
    together = (folders[True] / "model.pte").stat().st_size
    apart = sum((folders[False] / name / "model.pte").stat().st_size for name in ("prefill", "decode"))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert apart - together > 0.9 * weights, (together, apart, weights)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_static_cache_h15(backend, tmp_path):
    """H15: StaticCache (max_cache_len 16) as graph input and output, one graph for prefill and decode."""
    if backend == "executorch":
        pytest.importorskip("executorch.runtime", reason="the ExecuTorch generation tests need the executorch extra")
    config = tf.GenerationConfig(cache_implementation="static", max_cache_len=16, eos_token_id=None)
    model, input_sets, folder, manifest = _export_folder("llama", backend, tmp_path, config)
    assert manifest["parts"]["decode"]["cache"]["kind"] == "static"
    generator = ExportedGenerator.from_pretrained(folder)
    _assert_same_ids(model, generator, input_sets, config)


def test_sampling_runs_with_logits_processors(tmp_path):
    """Sampling uses the generation config's warpers; with top_k=1 it must equal greedy."""
    model, input_sets, folder, _ = _export_folder("llama", "dynamo", tmp_path)
    generator = ExportedGenerator.from_pretrained(folder)
    inputs = input_sets[1]
    greedy = generator.generate(**inputs, max_new_tokens=NEW_TOKENS)
    torch.manual_seed(0)
    sampled = generator.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=True, top_k=1)
    assert sampled.tolist() == greedy.tolist()
    # stop tokens: the first greedy token as eos ends generation after one step
    stop = int(greedy[0, inputs["input_ids"].shape[1]])
    config = tf.GenerationConfig(eos_token_id=stop, pad_token_id=0, max_new_tokens=NEW_TOKENS)
    stopped = generator.generate(**inputs, generation_config=config)
    assert stopped.shape[1] == inputs["input_ids"].shape[1] + 1
    with torch.no_grad():
        eager = model.generate(**inputs, generation_config=config)
    assert stopped.tolist() == eager.tolist()
    # a generation setting given as a keyword overrides the config, as transformers' generate(**kwargs) does
    longer = generator.generate(**inputs, generation_config=config, min_new_tokens=3)
    with torch.no_grad():
        eager = model.generate(**inputs, generation_config=config, min_new_tokens=3)
    assert longer.tolist() == eager.tolist() and longer.shape[1] >= inputs["input_ids"].shape[1] + 3
    # a length-aware processor (forced EOS at the last position) sees generate()'s max_length
    forced = tf.GenerationConfig(forced_eos_token_id=7, max_new_tokens=NEW_TOKENS, pad_token_id=0)
    got = generator.generate(**inputs, generation_config=forced)
    with torch.no_grad():
        eager = model.generate(**inputs, generation_config=forced)
    assert got.tolist() == eager.tolist()
    assert got.shape[1] == inputs["input_ids"].shape[1] + NEW_TOKENS and got[:, -1].tolist() == [7] * got.shape[0]
    shutil.rmtree(folder)


# ── Folder and manifest ───────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    _, _, folder, manifest = _export_folder("llama", "dynamo", tmp_path_factory.mktemp("gen"))
    return folder, manifest


def test_folder_contents(llama_folder):
    folder, manifest = llama_folder
    names = {p.name for p in folder.iterdir()}
    assert {"export.json", "config.json", "generation_config.json", "prefill", "decode"} <= names
    assert manifest["source_model"] is None and manifest["trust_remote_code"] is None  # a model object: not known
    decode = manifest["parts"]["decode"]
    assert decode["role"] == "decode" and decode["file"] == "decode/model.pt2"
    assert decode["cache"]["kind"] == "dynamic" and decode["cache"]["layers"] == 2
    assert [i["name"] for i in decode["inputs"]][:3] == ["input_ids", "attention_mask", "past_key_values_0"]
    assert decode["outputs"][:2] == ["logits", "present_0"]
    assert decode["dynamic_axes"]["past_key_values_0"] == [0, 2]
    assert decode["parity"]["ok"]


def test_a_model_in_training_mode_is_exported_in_eval_mode_and_given_back(tmp_path):
    """Generation parts are captured, traced and checked in eval mode (attention dropout off, so the parity check
    passes); afterwards every submodule's ``training`` flag is the caller's again."""
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**TINY, eos_token_id=None, attention_dropout=0.5))
    model.train()
    model.model.layers[0].eval()  # a mixed state, given back as it was
    flags = [m.training for m in model.modules()]
    exporter = make_exporter("dynamo")
    artifacts = export_for_generation(exporter, model, _text_inputs(2, 6, pad_left=2), make_config(exporter, True, None))
    assert [m.training for m in model.modules()] == flags
    manifest = artifacts.save_pretrained(tmp_path / "out")
    assert [m.training for m in model.modules()] == flags and model.training and not model.model.layers[0].training
    assert all(part["parity"]["ok"] and part["parity"]["max_abs_diff"] < 1e-4 for part in manifest["parts"].values())
    parts = build_parts(model, _text_inputs(1, 5))
    assert list(parts) == ["prefill", "decode"] and [m.training for m in model.modules()] == flags


def _copy_with(folder, tmp_path, edit):
    target = tmp_path / "edited"
    shutil.copytree(folder, target)
    manifest = json.loads((target / "export.json").read_text())
    edit(manifest, target)
    (target / "export.json").write_text(json.dumps(manifest))
    return target


def test_manifest_unknown_schema_version(llama_folder, tmp_path):
    target = _copy_with(llama_folder[0], tmp_path, lambda m, _: m.update(schema_version=99))
    with pytest.raises(ManifestError, match="schema_version"):
        ExportedGenerator.from_pretrained(target)


def test_manifest_missing_file(llama_folder, tmp_path):
    target = _copy_with(llama_folder[0], tmp_path, lambda m, t: (t / m["parts"]["decode"]["file"]).unlink())
    with pytest.raises(ManifestError, match="missing"):
        ExportedGenerator.from_pretrained(target)


def test_manifest_path_leaving_folder(llama_folder, tmp_path):
    def edit(manifest, _):
        manifest["parts"]["decode"]["file"] = "../../etc/passwd"

    target = _copy_with(llama_folder[0], tmp_path, edit)
    with pytest.raises(ManifestError, match="outside the folder"):
        read_manifest(target)


def _assert_truncated_weights_are_named(folder, manifest, inputs):
    """A truncated ``.onnx.data``: one error naming the part that loads it first and the file, from the load or
    the first run. The parts share one weights file, so the first part to load it (prefill) is the one named."""
    from hf_exporters.errors import ArtifactRunError

    data = [f for f in manifest["parts"]["decode"]["files"] if f.endswith(".data")]
    assert data == ["model.onnx.data"], manifest["parts"]["decode"]["files"]
    assert data[0] in manifest["parts"]["prefill"]["files"], manifest["parts"]["prefill"]["files"]
    path = folder / data[0]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises((ManifestError, ArtifactRunError), match=r"part 'prefill'.*model\.onnx\.data"):
        ExportedGenerator.from_pretrained(folder).generate(**inputs, max_new_tokens=3)


def _edit_file(name, content):
    def edit(manifest, target):
        (target / name).write_text(content)

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_edit_file("config.json", '{"model_type": "llama", '), r"config\.json cannot be read: "),
        (_edit_file("generation_config.json", "not json"), r"generation_config\.json cannot be read: "),
        (lambda m, _: m["parts"]["decode"].update(role="speculate"), r"part 'decode' has an unknown role 'speculate' \(known: encoder, prefill, decode\)$"),
        (lambda m, _: m["parts"].pop("decode"), r"no part has the role 'decode'; a generation folder needs a prefill and a decode part$"),
        (lambda m, _: m["parts"]["decode"].update(role="prefill"), r"two parts share a role \(prefill\)$"),
        (lambda m, _: m["parts"]["decode"].update(method="hf_exporters_input_static_axes"),
         r"part 'decode' has a 'method' that is not a method name: 'hf_exporters_input_static_axes'$"),
    ],
    ids=["corrupt-config", "corrupt-generation-config", "unknown-role", "no-decode", "two-prefills", "own-constant-method"],
)
def test_a_broken_folder_is_one_manifest_error(llama_folder, tmp_path, edit, message):
    target = _copy_with(llama_folder[0], tmp_path, edit)
    with pytest.raises(ManifestError, match=message):
        ExportedGenerator.from_pretrained(target)


def _foreign_artifact(llama_folder, tmp_path, backend, suffix, content):
    """The dynamo folder relabelled as ``backend`` with ``content`` as each part's file."""

    def edit(manifest, target):
        manifest["backend"] = backend
        for part in manifest["parts"].values():
            new = part["file"].rsplit(".", 1)[0] + suffix
            (target / new).write_bytes(content)
            part["file"], part["files"] = new, [new]

    return _copy_with(llama_folder[0], tmp_path, edit)


def test_random_onnx_bytes_are_one_manifest_error(llama_folder, tmp_path):
    target = _foreign_artifact(llama_folder, tmp_path, "onnx", ".onnx", os.urandom(4096))
    with pytest.raises(ManifestError, match=r"prefill/model\.onnx: part 'prefill' cannot be loaded by the onnx runtime \(corrupt or truncated file\?\): "):
        ExportedGenerator.from_pretrained(target)


@pytest.mark.parametrize("content", ["random", "truncated"])
def test_a_bad_pte_never_aborts_the_process(llama_folder, tmp_path, content):
    """Random bytes handed to the ExecuTorch runtime aborted the process (SIGABRT, exit 134): now they
    are refused before the runtime sees them. Run in a child process, so an abort cannot end the suite."""
    pytest.importorskip("executorch.runtime", reason="the .pte checks need the executorch extra")
    import subprocess
    import sys

    if content == "random":
        data = b"\x00\x01\x02\x03" + os.urandom(8188)
    else:  # a real .pte header promising more than the file holds
        data = b"\x1c\x00\x00\x00ET12eh00" + (32).to_bytes(4, "little") + (10**6).to_bytes(8, "little") + bytes(8) + bytes(8) + bytes(64)
    target = _foreign_artifact(llama_folder, tmp_path, "executorch", ".pte", data)
    _write_tokenizer(target)
    command = os.path.join(os.path.dirname(sys.executable), "hf-exporters")
    proc = subprocess.run([command, "generate", str(target), "-p", "a b c"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    expected = "is not an ExecuTorch program (.pte): no 'ET' file identifier at bytes 4-8" if content == "random" else "is truncated: 104 bytes where its header promises 1000000"
    assert last.startswith(f"error: {target / 'prefill' / 'model.pte'}: part 'prefill' cannot be loaded by the executorch runtime"), last
    assert last.endswith(expected), last


def test_manifest_missing(tmp_path):
    with pytest.raises(ManifestError, match="export.json is missing"):
        ExportedGenerator.from_pretrained(tmp_path)


def test_image_inputs_to_a_text_only_model_are_refused_clearly():
    model, inputs = llama()[0], {"input_ids": torch.ones(1, 3, dtype=torch.long), "pixel_values": torch.zeros(1, 3, 4, 4)}
    with pytest.raises(InputError, match=r"generate\(\) failed for LlamaForCausalLM .*not used by the model.*pixel_values"):
        build_parts(model, inputs)


# ── CLI ───────────────────────────────────────────────────────────────────────


def test_cli_generate_compare_eager(tmp_path):
    """``generate DIR --prompt ... --compare-eager`` prints text, tokens/s and the eager comparison."""
    import typer
    from typer.testing import CliRunner

    from hf_exporters.cli_generate import register
    from hf_exporters.generation import export_generation_folder

    model = llama()[0]
    checkpoint = tmp_path / "ckpt"
    model.save_pretrained(checkpoint)
    _write_tokenizer(checkpoint)
    out = tmp_path / "gen"
    export_generation_folder(checkpoint, "dynamo", out)
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps typer from collapsing the app into one command
        pass

    result = CliRunner().invoke(app, ["generate", str(out), "--prompt", "a b c d", "--max-new-tokens", "8", "--compare-eager"])
    assert result.exit_code == 0, result.output
    assert "tokens/s" in result.output
    assert "equal to eager generate(): yes" in result.output

    bad = CliRunner().invoke(app, ["generate", str(tmp_path / "nowhere"), "--prompt", "x"])
    assert bad.exit_code != 0 and "export.json is missing" in bad.output

    empty = CliRunner().invoke(app, ["generate", str(out), "--prompt", "  "])
    assert empty.exit_code == 1 and empty.output.strip() == "error: the prompt is empty: give --prompt some text to continue"
    # a checkpoint that is not there is refused before generating (nothing printed but the error)
    missing = CliRunner().invoke(app, ["generate", str(out), "--prompt", "a b", "--compare-eager", "--model", str(tmp_path / "gone")])
    assert missing.exit_code == 1 and missing.output.strip() == f"error: --compare-eager --model {tmp_path / 'gone'}: no such checkpoint folder"
    runtime = CliRunner().invoke(app, ["generate", str(out), "--prompt", "a b", "--runtime", "gpu"])
    assert runtime.exit_code == 2  # a choice outside --runtime's is a usage error
    # ids that differ from eager have their own status (3), apart from errors (1) and usage errors (2)
    other = tmp_path / "other"
    _spread_weights(tf.LlamaForCausalLM(tf.LlamaConfig(**TINY, eos_token_id=None)), seed=1).save_pretrained(other)
    differ = CliRunner().invoke(app, ["generate", str(out), "--prompt", "a b c d", "-n", "8", "--compare-eager", "--model", str(other)])
    assert differ.exit_code == 3, differ.output
    assert "equal to eager generate(): no" in differ.output


def _write_tokenizer(folder) -> None:
    """A word-level tokenizer over the tiny vocabulary (no hub access)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{chr(ord("a") + i): 3 + i for i in range(26)}}
    vocab.update({f"w{i}": i for i in range(len(vocab), 64)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = tf.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(folder)


def test_a_hybrid_cache_carries_recurrent_states_beside_keys_and_values(tmp_path):
    """Jamba's cache holds a Mamba layer's convolution and state-space states (fixed size) and an
    attention layer's keys and values. The folder's decode step takes them as one flat list, named in
    the manifest, with a dynamic sequence axis on keys and values only; the states it returns are
    the next step's inputs, and 8 greedy tokens equal eager generate() (test_greedy_ids_equal_eager)."""
    model, input_sets = jamba()
    exporter = make_exporter("dynamo")
    artifacts = export_for_generation(exporter, model, input_sets[0], make_config(exporter, True, None))
    manifest = artifacts.save_pretrained(tmp_path / "jamba")
    cache = manifest["parts"]["decode"]["cache"]
    assert cache["layers"] == 2
    assert cache["tensors"] == ["conv.0 0", "recurrent.0 0", "key 1", "value 1"]
    past = [i for i in manifest["parts"]["decode"]["inputs"] if i["name"].startswith("past_key_values")]
    assert len(past) == 4
    spec = artifacts.parts["decode"].dynamic_shapes["past_key_values"]
    assert [sorted(axes) for axes in spec] == [[0], [0], [0, 2], [0, 2]]
    generator = ExportedGenerator.from_pretrained(tmp_path / "jamba")
    _assert_same_ids(model, generator, input_sets)


def test_a_hybrid_cache_with_sliding_window_layers_is_refused_by_name():
    """A recurrent layer paired with sliding-window attention (Inkling2) is not carried yet: the error
    names the layer kind and the kinds that are."""
    model = build("Inkling2ForCausalLM")
    inputs = {k: v for k, v in example_inputs(model).items() if k in ("input_ids", "attention_mask")}
    with pytest.raises(InputError, match=r"^Inkling2ForCausalLM: generate\(\)'s cache holds recurrent state beside layers of kind "
                       r"LinearAttentionAndSlidingWindowAttentionLayer; only DynamicLayer, LinearAttentionLayer, "
                       r"LinearAttentionAndFullAttentionLayer, DummyLayer layers are supported in a hybrid cache yet$"):
        build_parts(model, inputs)


def test_a_model_without_a_cache_is_refused_by_name():
    """OpenAI GPT's forward takes no cache: generate() hands one through ``**kwargs`` and the model
    leaves it empty, recomputing the sequence each step; the error says so (not a cache-kind error).
    RWKV carries its own ``state`` list, which the error names."""
    model = tf.OpenAIGPTLMHeadModel(tf.OpenAIGPTConfig(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2)).eval()
    with pytest.raises(InputError, match=r"^OpenAIGPTLMHeadModel: forward takes no cache \(neither past_key_values nor cache_params\); "
                       r"generate\(\) recomputes the whole sequence at every step, so there is no decode step to export$"):
        build_parts(model, {"input_ids": torch.randint(3, 64, (1, 5), generator=torch.Generator().manual_seed(0))})
    rwkv = tf.RwkvForCausalLM(tf.RwkvConfig(vocab_size=64, context_length=32, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32)).eval()
    with pytest.raises(InputError, match=r"^RwkvForCausalLM: forward carries its recurrent state as `state` \(not a transformers cache\); "
                       r"a decode step over it is not exported yet$"):
        build_parts(rwkv, {"input_ids": torch.randint(3, 64, (1, 5), generator=torch.Generator().manual_seed(0))})


def test_flattened_image_patches_are_refused_by_name():
    """Qwen-VL-style towers take every image's patches as one (patches, patch_dim) tensor beside an
    (images, 3) grid; the per-image encoder split does not apply, and the error says so."""
    model, _ = qwen3_5()
    vision = model.config.vision_config
    ids = torch.tensor([[5, 6, model.config.vision_start_token_id, *[model.config.image_token_id] * 4, model.config.vision_end_token_id, 7]])
    inputs = {
        "input_ids": ids, "attention_mask": torch.ones_like(ids), "image_grid_thw": torch.tensor([[1, 4, 4]]),
        "pixel_values": torch.randn(16, vision.in_channels * vision.temporal_patch_size * vision.patch_size**2),
    }
    with pytest.raises(InputError, match=r"^Qwen3_5ForConditionalGeneration: its image encoder takes flattened patches \(pixel_values of "
                       r"shape \(16, 1536\)\) with image_grid_thw; generation with image inputs of this layout is not supported yet "
                       r"\(text-only generation is\)$"):
        build_parts(model, inputs)


def test_a_failed_genai_renaming_leaves_the_folder_as_exported(tmp_path, monkeypatch):
    """The onnxruntime-genai renaming failing on the second part: no graph is renamed, the export stands, and
    export.json says why there is no genai_config.json; the folder generates eager's ids."""
    from hf_exporters.generation import genai

    renamed = []
    apply = genai.apply_genai_layout

    def failing(path, layers, out=None):
        if renamed:
            raise OSError(28, "No space left on device")
        renamed.append(path)
        return apply(path, layers, out)

    monkeypatch.setattr(genai, "apply_genai_layout", failing)
    model, input_sets, folder, manifest = _export_folder("llama", "onnx", tmp_path, eos_token_id=UNUSED_LLAMA_TOKEN)
    assert renamed  # the first part was renamed beside the original before the second failed
    assert manifest["onnxruntime_genai"] == {
        "layout": False,
        "config": None,
        "reason": "the renaming for onnxruntime-genai failed: OSError: [Errno 28] No space left on device",
    }
    assert not (folder / "genai_config.json").exists() and not (folder / ".genai-layout").exists()
    assert manifest["parts"]["decode"]["inputs"][2]["name"] == "past_key_values_0"
    # the weights are still stored once at the root, under the exported (not renamed) graphs
    for name, part in manifest["parts"].items():
        assert part["files"] == [f"{name}.onnx", "model.onnx.data"]
    assert sorted(p.name for p in folder.iterdir() if p.suffix in (".onnx", ".data")) == ["decode.onnx", "model.onnx.data", "prefill.onnx"]
    assert not [p for p in folder.iterdir() if p.is_dir()]
    _assert_same_ids(model, ExportedGenerator.from_pretrained(folder), input_sets[:1])
