"""The sweep: tiny configs, isolated jobs (crash, hang, out-of-memory), resume, error kinds, reports."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from hf_exporters import known_issues  # noqa: E402
from hf_exporters.sweep import classes, report, runner, smoke, tiny  # noqa: E402
from hf_exporters.sweep.job import classify, run_job  # noqa: E402

# ── Tiny configs ─────────────────────────────────────────────────────────────


def test_tiny_config_keeps_the_key_value_head_ratio() -> None:
    config = tiny.tiny_config(transformers.MistralConfig)  # 32 query heads, 8 key/value heads: ratio 4
    assert config.hidden_size == tiny.WIDTH and config.num_hidden_layers == tiny.LAYERS
    assert config.num_attention_heads == tiny.HEADS and config.num_key_value_heads == 1
    assert config.hidden_size % config.num_attention_heads == 0
    assert config.vocab_size == tiny.VOCAB and config.max_position_embeddings <= tiny.POSITIONS


def test_tiny_config_shrinks_a_predictor_s_heads_and_depth() -> None:
    config = tiny.tiny_config(transformers.VJEPA2Config)  # predictor: 384 wide, 12 heads, 12 layers
    assert config.pred_hidden_size % config.pred_num_attention_heads == 0
    assert config.pred_num_attention_heads == tiny.HEADS and config.pred_num_hidden_layers == tiny.LAYERS


def test_tiny_config_keeps_one_layer_of_each_kind() -> None:
    config = tiny.tiny_config(transformers.Gemma2Config)
    assert set(config.layer_types) == {"sliding_attention", "full_attention"}
    assert len(config.layer_types) == config.num_hidden_layers


def test_tiny_config_keeps_layer_kinds_placed_by_period_and_offset() -> None:
    # Jamba places attention at i % 8 == 4 and experts at i % 2 == 1: two layers would keep no attention layer
    jamba = tiny.tiny_config(transformers.JambaConfig)
    assert jamba.num_hidden_layers == tiny.LAYERS
    assert jamba.layers_block_type == ["mamba", "attention"]
    assert (jamba.attn_layer_period, jamba.attn_layer_offset) == (2, 1)
    assert (jamba.expert_layer_period, jamba.expert_layer_offset) == (2, 1)
    # Zamba spells its kinds as a list; the hybrid layers tie one shared block, so two of them are kept
    zamba = tiny.tiny_config(transformers.ZambaConfig)
    assert zamba.layers_block_type == ["linear_attention", "hybrid", "hybrid"]
    model = transformers.ZambaModel(zamba).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[3, 5, 7, 9]])).last_hidden_state
    assert out.shape == (1, 4, zamba.hidden_size) and bool(torch.isfinite(out).all())
    zamba2 = tiny.tiny_config(transformers.Zamba2Config)
    assert zamba2.layers_block_type == ["linear_attention", "hybrid", "hybrid"] and zamba2.hybrid_layer_ids == [1, 2]
    # defaults with no attention layer (Bamba, GraniteMoeHybrid) or an attention layer past two layers
    # (RecurrentGemma's repeating pattern) get one, so generate() runs on the tiny model
    assert tiny.tiny_config(transformers.BambaConfig).layers_block_type == ["linear_attention", "full_attention"]
    assert tiny.tiny_config(transformers.GraniteMoeHybridConfig).layers_block_type == ["linear_attention", "full_attention"]
    assert tiny.tiny_config(transformers.RecurrentGemmaConfig).layers_block_type == ["linear_attention", "linear_attention", "sliding_attention"]


def test_tiny_config_keeps_experts_and_routing() -> None:
    default = transformers.MixtralConfig()
    config = tiny.tiny_config(transformers.MixtralConfig)
    assert config.num_local_experts == tiny.EXPERTS and config.num_experts_per_tok == default.num_experts_per_tok == 2


def test_tiny_config_shrinks_sub_configs_and_images() -> None:
    config = tiny.tiny_config(transformers.CLIPConfig)
    assert config.text_config.hidden_size == tiny.WIDTH and config.vision_config.hidden_size == tiny.WIDTH
    assert config.vision_config.image_size % config.vision_config.patch_size == 0
    assert config.vision_config.image_size < transformers.CLIPVisionConfig().image_size


def test_tiny_config_keeps_widths_related_across_sub_configs() -> None:
    # SAM: the vision neck's output channels (256) feed the mask decoder (hidden 256); the positional
    # features are half of that width; the prompt encoder's grid follows its image size
    sam = tiny.tiny_config(transformers.SamConfig)
    assert sam.vision_config.output_channels == sam.mask_decoder_config.hidden_size == tiny.WIDTH
    assert sam.vision_config.num_pos_feats == tiny.WIDTH // 2
    prompt = sam.prompt_encoder_config
    assert prompt.image_embedding_size == prompt.image_size // prompt.patch_size == 2
    # D-FINE: the encoder's input channels are the backbone's stage widths, scaled by the same factor
    dfine = tiny.tiny_config(transformers.DFineConfig)
    backbone = dfine.backbone_config
    assert backbone.hidden_sizes == [16, 32, 64, 128] and backbone.stage_out_channels[1:] == [32, 64, 128]
    assert backbone.stage_in_channels[1:] == backbone.stage_out_channels[:3]  # each stage feeds the next
    assert dfine.encoder_in_channels == [32, 64, 128]
    # SAM2: per-stage widths follow the hidden size; the channel list and feature-map sides follow
    sam2 = tiny.tiny_config(transformers.Sam2Config)
    assert sam2.vision_config.backbone_config.embed_dim_per_stage == [64, 128, 256, 512]
    assert sam2.vision_config.backbone_channel_list == [512, 256, 128, 64]
    assert sam2.vision_config.backbone_feature_sizes == [[16, 16], [8, 8], [4, 4]]
    assert sam2.prompt_encoder_config.image_size == sam2.vision_config.backbone_config.image_size[0] == 64


def test_tiny_config_scales_mrope_sections_to_the_rotary_half_of_the_head() -> None:
    # the text config leaves mrope_section to the model's code default: it gets one, summing to head_dim / 2
    config = tiny.tiny_config(transformers.Qwen2VLConfig).text_config
    head_dim = config.hidden_size // config.num_attention_heads
    assert config.rope_parameters["mrope_section"] == [2, 3, 3] and sum(config.rope_parameters["mrope_section"]) == head_dim // 2
    # partial rotary: the sections cover head_dim * partial_rotary_factor / 2
    config = tiny.tiny_config(transformers.Glm4vMoeConfig).text_config
    rotary = int(config.hidden_size // config.num_attention_heads * config.rope_parameters["partial_rotary_factor"])
    assert len(config.rope_parameters["mrope_section"]) == 3 and sum(config.rope_parameters["mrope_section"]) == rotary // 2


def test_tiny_config_keeps_derived_head_widths_and_stage_lists_consistent() -> None:
    xlnet = tiny.tiny_config(transformers.XLNetConfig)  # d_head is checked against d_model // n_head
    assert xlnet.d_head == xlnet.d_model // xlnet.n_head == tiny.WIDTH // tiny.HEADS
    gptj = tiny.tiny_config(transformers.GPTJConfig)  # rotary part: 64 of a 256-wide head -> 4 of 16
    assert gptj.rotary_dim == 4 and gptj.rotary_dim <= gptj.n_embd // gptj.n_head
    swin = tiny.tiny_config(transformers.SwinConfig)  # per-stage lists keep one entry per stage
    assert len(swin.depths) == len(swin.num_heads) == len(transformers.SwinConfig().depths) and set(swin.depths) == {1}
    mimi = tiny.tiny_config(transformers.MimiConfig)  # a width another module must match follows the width
    assert mimi.hidden_size == mimi.upsample_groups == tiny.WIDTH


def test_tiny_config_fills_counts_the_defaults_leave_unset() -> None:
    nemotron = tiny.tiny_config(transformers.NemotronConfig)  # no key/value head count: one per query head
    assert nemotron.num_key_value_heads == nemotron.num_attention_heads == tiny.HEADS
    ministral = tiny.tiny_config(transformers.MinistralConfig)  # no head_dim: the width over the heads
    assert ministral.head_dim == tiny.HEAD_DIM
    dots1 = tiny.tiny_config(transformers.Dots1Config)  # expert count, top-k and shared experts all unset
    assert (dots1.n_routed_experts, dots1.num_experts_per_tok, dots1.n_shared_experts) == (tiny.EXPERTS, 2, 1)
    bailing = tiny.tiny_config(transformers.BailingHybridConfig)  # routing under other names: 512 experts, top-8 of 8 groups
    assert (bailing.num_experts, bailing.num_experts_per_tok, bailing.n_group, bailing.topk_group) == (tiny.EXPERTS, 2, 2, 1)


def test_tiny_config_keeps_head_ratios_windows_and_stage_widths_consistent() -> None:
    moonshine = tiny.tiny_config(transformers.MoonshineConfig)  # encoder 8/8 heads, decoder 8/8: each side keeps 1:1
    assert moonshine.encoder_num_key_value_heads == moonshine.encoder_num_attention_heads == tiny.HEADS
    assert moonshine.encoder_num_hidden_layers == moonshine.decoder_num_hidden_layers == tiny.LAYERS
    swin = tiny.tiny_config(transformers.SwinConfig)  # window 7 over a last-stage grid of 1: grid 2, window 2
    assert (swin.image_size, swin.window_size) == (64, 2)
    mobilevit = tiny.tiny_config(transformers.MobileViTV2Config)  # 2-pixel patches at stride 32
    assert mobilevit.image_size == 64
    swin2sr = tiny.tiny_config(transformers.Swin2SRConfig)  # constant-width stages: heads a power of two
    assert all(swin2sr.embed_dim % h == 0 for h in swin2sr.num_heads)
    efficientnet = tiny.tiny_config(transformers.EfficientNetConfig)  # 1280 head channels at width 0.2: 256
    assert (efficientnet.width_coefficient, efficientnet.depth_coefficient, efficientnet.hidden_dim) == (0.2, 0.1, 256)
    vibevoice = tiny.tiny_config(transformers.VibeVoiceAcousticTokenizerConfig)  # 32 filters doubled 6 times
    assert vibevoice.num_filters << len(vibevoice.downsampling_ratios) == 256
    glm = tiny.tiny_config(transformers.Glm4vConfig).vision_config  # a width named *hidden_size, a *intermediate_size
    assert glm.out_hidden_size == tiny.WIDTH and glm.intermediate_size <= tiny.FFN


def test_tiny_config_family_override_is_applied_with_a_reason() -> None:
    config = tiny.tiny_config(transformers.WhisperConfig)
    assert config.max_source_positions == tiny.FAMILY_OVERRIDES["whisper"][0]["max_source_positions"]
    assert all(reason.strip() for _, reason in tiny.FAMILY_OVERRIDES.values())


def test_tiny_config_replaces_a_timm_backbone_with_a_transformers_one() -> None:
    """The DETR family defaults to a timm backbone (timm is not installable next to the CPU torch build); the
    override replaces the whole sub-config, keeping none of the timm fields."""
    from hf_exporters.sweep.job import build_model

    assert transformers.DetrConfig().backbone_config.model_type == "timm_backbone"
    backbone = tiny.tiny_config(transformers.DetrConfig).backbone_config
    assert (backbone.model_type, backbone.hidden_sizes, backbone.out_indices) == ("resnet", [16, 32, 48, 64], [1, 2, 3, 4])
    assert not hasattr(backbone, "features_only")
    deformable = tiny.tiny_config(transformers.DeformableDetrConfig).backbone_config
    assert (deformable.model_type, deformable.out_indices) == ("resnet", [2, 3, 4])
    model = build_model("DetrModel")
    assert type(model.backbone.model).__name__ == "ResNetBackbone"


def test_tiny_models_have_no_tied_scores_from_their_init(tmp_path: Path) -> None:
    """AFMoE zero-initialises its router, RT-DETR draws BatchNorm scales and D-FINE its HGNetV2
    convolutions from N(0, 0.02): the router then scores every expert alike and the detectors'
    features vanish, so their encoders score every anchor alike. Top-k over ties is broken differently by each runtime. The sweep's tiny
    models carry drawn router weights, unit BatchNorm scales and unit-gain convolutions instead, reproducibly, and the
    ONNX program then matches eager in onnxruntime."""
    pytest.importorskip("onnxruntime", reason="the ONNX export is checked in onnxruntime (the onnx extra)")
    pytest.importorskip("onnxscript", reason="torch.onnx lowers with onnxscript (the onnx extra)")
    from hf_exporters import OnnxExporter
    from hf_exporters.runtime import check_parity
    from hf_exporters.sweep.inputs import build_inputs
    from hf_exporters.sweep.job import VANISHING_CONVOLUTIONS, build_model, undo_degenerate_init

    afmoe = build_model("AfmoeModel")
    gate = afmoe.layers[1].mlp.router.gate.weight
    assert gate.any() and torch.equal(gate, build_model("AfmoeModel").layers[1].mlp.router.gate.weight)
    assert 0.01 < float(gate.detach().std()) < 0.03  # N(0, initializer_range)
    assert undo_degenerate_init(afmoe, 0.02) == []  # nothing left to change
    inputs = build_inputs(afmoe)
    exporter = OnnxExporter()
    runner_ = exporter.load_runner(exporter.save(exporter.export(afmoe, inputs), tmp_path))
    (parity,) = check_parity(afmoe, runner_, [inputs], atol=1e-4)
    assert parity.ok and parity.max_abs_diff < 1e-5

    detr = build_model("RTDetrModel")
    modules = [m for m in detr.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    norms = [m.weight for m in modules]
    assert norms and all(bool((w == 1).all()) for w in norms)
    with torch.no_grad():
        scores = detr(**build_inputs(detr)).enc_topk_logits
    assert torch.unique(scores).numel() > scores.numel() // 2  # was one value, the bias, everywhere
    with torch.no_grad():
        for module in modules:  # the init's scales and statistics (the builder calibrates the statistics)
            module.weight.normal_(0.0, 0.02)
            module.reset_running_stats()
        scores = detr(**build_inputs(detr)).enc_topk_logits
    assert float((scores.amax(dim=1) - scores.amin(dim=1)).max()) < 1e-3  # features vanish: every anchor scores alike

    # D-FINE's HGNetV2 convolutions, drawn from N(0, 0.02), vanish the signal the same way
    dfine = build_model("DFineModel")
    convs = [m.weight for m in dfine.modules() if isinstance(m, torch.nn.Conv2d) and m.weight.numel() > 1]
    assert min(float(w.std()) * w[0].numel() ** 0.5 for w in convs) > 0.3  # gain about one
    inputs = build_inputs(dfine)
    with torch.no_grad():
        scores = dfine(**inputs).enc_topk_logits
    assert torch.unique(scores).numel() == scores.numel()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for w in convs:
            w.copy_(torch.randn(w.shape, generator=generator) * 0.02)
        for module in dfine.modules():  # the init's statistics too (the builder calibrates them)
            if isinstance(module, torch.nn.BatchNorm2d):
                module.reset_running_stats()
        scores = dfine(**inputs).enc_topk_logits
    assert float((scores.amax(dim=1) - scores.amin(dim=1)).max()) < 1e-3  # features vanish: every anchor scores alike
    assert "d_fine" in VANISHING_CONVOLUTIONS and "rt_detr" not in VANISHING_CONVOLUTIONS


def test_weight_normalised_convolutions_of_codec_decoders_get_a_gain_of_one() -> None:
    """A weight-normalised convolution of a codec family (transposed too, its fan-in ``in * kernel / stride``) below
    a gain of 0.9 has its ``g`` scaled to a gain of one; a plain module and one already at gain are left alone."""
    from torch.nn.utils.parametrizations import weight_norm

    from hf_exporters.sweep.job import VANISHING_CONVOLUTIONS, _unit_gain_weight_norm_convolutions

    torch.manual_seed(0)
    decoder = torch.nn.Sequential(
        weight_norm(torch.nn.ConvTranspose1d(64, 32, kernel_size=8, stride=4)),
        weight_norm(torch.nn.Conv1d(32, 32, kernel_size=3)),
        torch.nn.Conv1d(32, 32, kernel_size=3),  # not weight-normalised: not this function's
    )
    with torch.no_grad():
        decoder[0].parametrizations.weight.original0.mul_(0.02)
        decoder[1].parametrizations.weight.original0.fill_(1.0)  # |row| = 1 over 96 inputs: a gain of about 1
        plain = decoder[2].weight.clone()
        assert _unit_gain_weight_norm_convolutions(decoder) == ["0.parametrizations.weight.original0"]
    gain = float(decoder[0].weight.std()) * (64 * 8 / 4) ** 0.5
    assert abs(gain - 1.0) < 1e-4
    assert torch.equal(decoder[2].weight, plain)
    assert {"encodec", "dac"} <= set(VANISHING_CONVOLUTIONS)


def test_codec_decoders_and_the_diarization_head_carry_signal() -> None:
    """Encodec's and DAC's decoded audio moved by 3e-5 and 1.5e-5 between two inputs, and Nemotron 3.5
    Transcribe's speaker logits were 5e-3 at most: below the signal floor, degenerate models. Built by the sweep
    they carry signal."""
    from hf_exporters.runtime.compare import eager_outputs
    from hf_exporters.sweep.inputs import build_inputs
    from hf_exporters.sweep.job import build_model, check_signal

    for name in ("EncodecModel", "DacModel", "Nemotron3_5TranscribeAudioModel"):
        model = build_model(name, use_cache=None)
        inputs = build_inputs(model)
        record: dict = {}
        check_signal(model, inputs, eager_outputs(model, inputs), record)
        assert record["signal"]["ok"], (name, record["signal"])
        assert record["signal"]["main_change"] > 0.05, (name, record["signal"]["main_change"])


def test_task_heads_are_drawn_at_a_gain_of_one_and_their_logits_carry_signal() -> None:
    """RoFormer's sequence classifier (dense then out_proj, both at 0.02) gave logits of 7.7e-3 at most: degenerate.
    The sweep draws the head's linears at a gain of one; the base model and its tied weights are untouched."""
    from hf_exporters.runtime.compare import eager_outputs
    from hf_exporters.sweep.inputs import build_inputs
    from hf_exporters.sweep.classes import resolve
    from hf_exporters.sweep.job import build_model, check_signal, unit_gain_task_head
    from hf_exporters.sweep.tiny import tiny_config

    model = build_model("RoFormerForSequenceClassification", use_cache=None)
    for layer in (model.classifier.dense, model.classifier.out_proj):
        assert abs(float(layer.weight.detach().std()) * layer.weight.shape[1] ** 0.5 - 1.0) < 0.25
    inputs = build_inputs(model)
    record: dict = {}
    check_signal(model, inputs, eager_outputs(model, inputs), record)
    assert record["signal"]["ok"] and record["signal"]["leaves"][0]["max_abs"] > 0.1, record["signal"]
    assert unit_gain_task_head(model, "RoFormerForSequenceClassification") == []  # at gain already
    base = build_model("RoFormerModel", use_cache=None)
    assert torch.equal(base.encoder.layer[0].attention.self.query.weight, model.roformer.encoder.layer[0].attention.self.query.weight)
    lm = build_model("RoFormerForMaskedLM", use_cache=None)
    assert unit_gain_task_head(lm, "RoFormerForMaskedLM") == []  # not a head of TASK_HEADS: the init scale stays
    embeddings = lm.roformer.embeddings.word_embeddings.weight.clone()
    # asked as a classifier, its prediction head's dense is drawn, its decoder tied to the embeddings is not
    assert unit_gain_task_head(lm, "RoFormerForSequenceClassification") == ["cls.predictions.transform.dense"]
    assert torch.equal(lm.roformer.embeddings.word_embeddings.weight, embeddings)
    # without a separate base model (base_model is the model), only the children named as heads are drawn
    # (SigLIP's classifier is drawn at a gain of one already: nothing to draw; its vision tower's linears, at 0.16,
    # are the body's and stay)
    for name, body, drawn in (
        ("SiglipForImageClassification", "vision_model", []),
        ("WhisperForAudioClassification", "encoder", ["projector", "classifier"]),
    ):
        torch.manual_seed(0)
        model = resolve(name)(tiny_config(resolve(name).config_class)).eval()
        assert model.base_model is model
        before = {k: v.clone() for k, v in getattr(model, body).state_dict().items()}
        assert unit_gain_task_head(model, name) == drawn
        assert all(torch.equal(v, before[k]) for k, v in getattr(model, body).state_dict().items()), name


def test_single_sample_families_get_batch_one_inputs() -> None:
    """TVP views a (width, hidden) position table as (batch, 1, width, hidden): eager fails on the
    sweep's batch of two ("shape '[2, 1, 1, 64]' is invalid for input of size 64") and runs on one."""
    from hf_exporters.sweep import inputs as sweep_inputs
    from hf_exporters.sweep.job import build_model

    model = build_model("TvpModel")
    inputs = sweep_inputs.build_inputs(model)
    assert {k: v.shape[0] for k, v in inputs.items()} == dict.fromkeys(inputs, 1)
    with torch.no_grad():
        assert model(**inputs).last_hidden_state.shape[0] == 1
    doubled = {k: torch.cat([v, v]) for k, v in inputs.items()}
    with pytest.raises(RuntimeError, match=re.escape("shape '[2, 1, 1, 64]' is invalid for input of size 64")):
        model(**doubled)


def test_tiny_models_run_eager() -> None:
    from hf_exporters.sweep.inputs import build_inputs
    from hf_exporters.sweep.job import build_model

    for name in ("BertModel", "T5Model", "ViTModel"):
        model = build_model(name)
        inputs = build_inputs(model)
        model(**inputs)
        assert sum(p.numel() for p in model.parameters()) < 2_000_000
    assert "decoder_input_ids" in build_inputs(build_model("T5Model"))


def test_inputs_for_a_vision_tower_on_flattened_patches() -> None:
    from hf_exporters.sweep.inputs import build_inputs
    from hf_exporters.sweep.job import build_model

    model = build_model("Qwen2_5_VisionTransformerPretrainedModel")
    config = model.config  # spatial_merge_size 2, temporal_patch_size 2, patch_size 14, in_channels 3
    inputs = build_inputs(model)
    assert inputs["grid_thw"].tolist() == [[1, 4, 4]]
    assert tuple(inputs["hidden_states"].shape) == (16, config.in_channels * config.temporal_patch_size * config.patch_size**2)
    output = model(**inputs)
    assert output.pooler_output.shape[0] == 16 // config.spatial_merge_size**2


def test_inputs_for_a_drafter_mask_span_context_and_window() -> None:
    """A block-diffusion drafter attends from the window to the context and the window: the mask covers both, so
    the traced mask builder sizes the keys as eager does."""
    from hf_exporters.runtime.compare import eager_outputs, eager_outputs_as_traced
    from hf_exporters.sweep.inputs import build_inputs
    from hf_exporters.sweep.job import build_model

    model = build_model("MuseGlimmerAssistantModel")
    inputs = build_inputs(model)
    assert {k: tuple(v.shape) for k, v in inputs.items()} == {
        "noise_embeds": (2, 8, 64),
        "context_hidden_states": (2, 8, 128),
        "attention_mask": (2, 16),
    }
    (_, eager), (_, traced) = eager_outputs(model, inputs)[0], eager_outputs_as_traced(model, inputs)[0]
    assert torch.equal(eager, traced)


def test_inputs_for_video_and_time_series() -> None:
    from hf_exporters.sweep.inputs import BATCH, build_inputs
    from hf_exporters.sweep.job import build_model

    video = build_model("VideoMAEModel")
    clip = build_inputs(video)["pixel_values"]
    config = video.config
    assert tuple(clip.shape) == (BATCH, config.num_frames, config.num_channels, config.image_size, config.image_size)
    video(pixel_values=clip)
    series = build_model("PatchTSTModel")
    values = build_inputs(series)["past_values"]
    assert tuple(values.shape) == (BATCH, series.config.context_length, series.config.num_input_channels)
    series(past_values=values)


def test_audio_inputs_follow_the_front_end_and_the_codec_config() -> None:
    from hf_exporters.sweep.inputs import AUDIO_FRAMES, AUDIO_SAMPLES, BATCH, build_inputs
    from hf_exporters.sweep.job import build_model

    mel_first = build_model("GlmAsrEncoder")  # conv1 reads num_mel_bins (128) channels
    features = build_inputs(mel_first)["input_features"]
    assert tuple(features.shape) == (BATCH, 128, AUDIO_FRAMES)
    mel_first(input_features=features)
    stacked = build_model("GraniteSpeech5Encoder")  # input_linear reads 4 * num_mel_bins (80) features
    features = build_inputs(stacked)["input_features"]
    assert tuple(features.shape) == (BATCH, AUDIO_FRAMES, 4 * 80)
    stacked(input_features=features)
    codec = build_model("PocketTTSAudioTokenizerEncoderModel")  # audio_channels 1: (batch, channels, samples)
    waveform = build_inputs(codec)["input_values"]
    assert tuple(waveform.shape) == (BATCH, 1, AUDIO_SAMPLES)
    codec(input_values=waveform)


def test_inputs_for_code_streams_and_query_placeholders() -> None:
    from hf_exporters.sweep.inputs import BATCH, DECODER_SEQ, SEQ, build_inputs
    from hf_exporters.sweep.job import build_model

    musicgen = build_model("MusicgenModel")  # one embedding table per codebook: codebooks stacked along the batch
    assert tuple(build_inputs(musicgen)["input_ids"].shape) == (BATCH * musicgen.config.num_codebooks, SEQ)
    dia = build_inputs(build_model("DiaModel"))  # one table for 9 channels of codes
    assert tuple(dia["decoder_input_ids"].shape) == (BATCH, DECODER_SEQ, 9) and int(dia["decoder_input_ids"].max()) < 200
    blip = build_model("Blip2Model")
    token, queries = blip.config.image_token_index, blip.config.num_query_tokens
    assert token == tiny.VOCAB - 1
    ids = build_inputs(blip)["input_ids"]
    assert tuple(ids.shape) == (BATCH, queries + SEQ)
    assert (ids[:, :queries] == token).all() and not (ids[:, queries:] == token).any()


def test_inputs_seed_the_draws_a_forward_would_make() -> None:
    from hf_exporters.runtime.compare import eager_outputs
    from hf_exporters.sweep.inputs import BATCH, build_inputs
    from hf_exporters.sweep.job import build_model

    mae = build_model("ViTMAEModel")
    inputs = build_inputs(mae)
    config = mae.config
    assert tuple(inputs["noise"].shape) == (BATCH, (config.image_size // config.patch_size) ** 2)
    assert torch.equal(inputs["noise"], build_inputs(mae)["noise"])  # same seed, same noise
    first, second = eager_outputs(mae, inputs), eager_outputs(mae, inputs)
    assert [name for name, _ in first] == [name for name, _ in second]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(first, second))
    trajectory = build_inputs(build_model("DecisionTransformerModel"))
    assert trajectory["timesteps"][0].tolist() == list(range(trajectory["states"].shape[1]))

def test_classes_come_from_the_auto_mappings() -> None:
    base = classes.base_classes()
    assert base["BertModel"] == "bert" and len(classes.all_classes()) > len(base)
    assert classes.select(base, only="bert") == ["BertModel"]
    shards = [classes.select(base, shard=f"{i}/3") for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(base)


def test_classes_are_model_classes_not_configurations() -> None:
    """modeling_auto also holds CONFIG_MAPPING_NAMES (model type -> configuration class): none of those is a model class."""
    every = classes.all_classes()
    assert not [c for c in every if c.endswith("Config")]
    assert every["BertForMultipleChoice"] == "bert" and "BertConfig" not in every


def test_the_non_base_sample_is_seeded_and_holds_no_base_class() -> None:
    sample = classes.nonbase_sample()
    base = classes.base_classes()
    assert len(sample) == classes.SAMPLE_SIZE == 400
    assert sample == classes.nonbase_sample() and sample != classes.nonbase_sample(seed=classes.SAMPLE_SEED + 1)
    assert not set(sample) & set(base) and set(sample) <= set(classes.all_classes())
    generative = classes.generative_sample()
    assert len(generative) == classes.GENERATIVE_SAMPLE_SIZE == 100 and set(generative) <= set(classes.generative_classes())
    assert generative == classes.generative_sample() and generative != classes.generative_sample(seed=classes.SAMPLE_SEED + 1)


def _tiny_bert_config(**fields: object) -> transformers.BertConfig:
    return transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, **fields)


def test_inputs_for_a_multiple_choice_head_have_a_choice_axis() -> None:
    from hf_exporters.sweep.inputs import BATCH, CHOICES, SEQ, build_inputs

    torch.manual_seed(0)
    model = transformers.BertForMultipleChoice(_tiny_bert_config()).eval()
    inputs = build_inputs(model)
    assert {k: tuple(v.shape) for k, v in inputs.items()} == dict.fromkeys(("input_ids", "attention_mask", "token_type_ids"), (BATCH, CHOICES, SEQ))
    assert not torch.equal(inputs["input_ids"][:, 0], inputs["input_ids"][:, 1])  # each choice its own text
    with torch.no_grad():
        assert model(**inputs).logits.shape == (BATCH, CHOICES)


def test_inputs_for_an_encoder_decoder_classifier_end_each_row_with_eos() -> None:
    from hf_exporters.sweep.inputs import build_inputs

    config = transformers.BartConfig(
        vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_labels=3,
    )
    torch.manual_seed(0)
    model = transformers.BartForSequenceClassification(config).eval()
    inputs = build_inputs(model)
    ids = inputs["input_ids"]
    assert "decoder_input_ids" not in inputs
    assert (ids[:, -1] == config.eos_token_id).all() and int((ids == config.eos_token_id).sum()) == ids.shape[0]
    with torch.no_grad():
        assert model(**inputs).logits.shape == (ids.shape[0], 3)


def test_task_heads_get_the_config_fields_they_read() -> None:
    from hf_exporters.sweep.job import _head_fields

    config = _tiny_bert_config()
    config.pad_token_id = None
    assert _head_fields("BertForSequenceClassification", config) == ["config.pad_token_id = 0"] and config.pad_token_id == 0
    config = _tiny_bert_config(num_labels=3)
    assert _head_fields("BertForQuestionAnswering", config) == ["config.num_labels = 2"] and config.num_labels == 2
    assert _head_fields("BertModel", _tiny_bert_config()) == []


def test_the_sample_is_reported_with_a_wilson_interval_at_its_own_revision() -> None:
    low, high = report.wilson_interval(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert report.wilson_interval(0, 0) == (0.0, 1.0)
    records = [
        {**_record("ours", "onnx", False, "A", "fail", "lowering", "unsupported op"), "revision": "old", "finished": "1"},
        {**_record("ours", "onnx", False, "A", "pass"), "revision": "new", "finished": "2"},
        {**_record("ours", "onnx", False, "B", "fail", "parity", "parity"), "revision": "new", "finished": "3"},
        {**_record("ours", "onnx", False, "Z", "pass"), "revision": "newer", "finished": "4"},  # not in the sample
    ]
    records = [{**r, "cache": "default"} for r in records]
    sample = report.summarize_sample(records, {"forward": ["A", "B", "C"], "cache": {"default": ["A", "B", "C"], "off": []}})
    assert sample["revision"] == "new" and sample["size"] == 3
    (onnx,) = [g for g in sample["groups"] if (g["engine"], g["backend"]) == ("ours", "onnx")]
    assert (onnx["pass"], onnx["fail"], onnx["run"], onnx["not_run"], onnx["pass_rate_of_run"]) == (1, 1, 2, 1, 0.5)
    assert onnx["interval_95"] == [round(v, 4) for v in report.wilson_interval(1, 2)]
    assert "generation" not in sample  # a sample without generation classes
    generation = [
        {**_record("ours", "executorch", False, "G1", "pass"), "mode": "generation", "revision": "gen", "finished": "5"},
        {**_record("ours", "executorch", False, "G2", "fail", "lowering", "unsupported op"), "mode": "generation", "revision": "gen", "finished": "6"},
        {**_record("ours", "dynamo", False, "G1", "pass"), "mode": "generation", "revision": "old", "finished": "0"},
        {**_record("ours", "executorch", False, "G9", "pass"), "mode": "generation", "revision": "gen", "finished": "7"},  # not sampled
    ]
    both = report.summarize_sample(records + generation, {
        "forward": ["A", "B", "C"], "generation": ["G1", "G2", "G3", "G4"], "cache": {"default": ["A", "B", "C"], "off": []},
    })
    assert both["revision"] == "new" and both["generation"]["revision"] == "gen" and both["generation"]["size"] == 4
    by_backend = {g["backend"]: g for g in both["generation"]["groups"]}
    assert [g["engine"] for g in both["generation"]["groups"]] == ["ours"] * len(report.BACKENDS)
    assert (by_backend["executorch"]["pass"], by_backend["executorch"]["fail"], by_backend["executorch"]["not_run"]) == (1, 1, 2)
    assert by_backend["dynamo"]["run"] == 0  # its record is of another revision
    lines = report._sample_lines({"sample": both, "classes_total": 10, "base_classes_total": 4, "generative_classes_total": 303})
    assert "A seeded random sample of **4** of the 303 generative classes" in "\n".join(lines)
    assert "| ours | executorch | 1 / 4 | 2 | 1 | 50.0% of 2 (9.4-90.5%) |" in lines
    # the generative sample's newer records do not move the headline, which forward records choose
    assert report.summarize(records + generation, {}, {"forward": ["A", "B"], "generation": ["G1", "G2", "G9"]})["headline_revision"] == "new"
    assert report.summarize(generation, {}, {"forward": [], "generation": ["G1", "G2"]})["headline_revision"] == "gen"
    summary = report.summarize(records, {}, {"forward": ["Z"]})
    assert summary["headline_revision"] == "newer"
    assert report.summarize(records, {}, {"forward": ["A", "B"]})["headline_revision"] == "new"  # Z's newer record does not move it


# ── Isolated jobs ────────────────────────────────────────────────────────────


def test_a_crash_a_hang_and_an_oom_are_recorded_as_such() -> None:
    spec = {"class": "BertModel", "backend": "dynamo", "dynamic": False}
    crashed = runner.run_forked({**spec, "probe": "crash"}, timeout=30, memory_bytes=2**31)
    assert crashed["outcome"] == "crash" and "SIGABRT" in crashed["message"]
    hung = runner.run_forked({**spec, "probe": "hang"}, timeout=1.5, memory_bytes=2**31)
    assert hung["outcome"] == "timeout" and hung["kind"] == "timeout"
    hog = runner.run_forked({**spec, "probe": "oom"}, timeout=30, memory_bytes=300 * 2**20)
    assert hog["outcome"] == "oom" and hog["kind"] == "out of memory"
    failed = runner.run_forked({**spec, "probe": "raise"}, timeout=30, memory_bytes=2**31)
    assert failed["outcome"] == "fail" and failed["kind"] == "data-dependent guard" and failed["stage"] == "eager"


def test_a_crash_never_loses_another_jobs_result(tmp_path: Path) -> None:
    store = runner.ResultStore(tmp_path / "results.jsonl", {"torch": "x"}, "rev1")
    specs = [
        {"class": "A", "backend": "dynamo", "dynamic": False, "engine": "ours", "probe": "crash"},
        {"class": "B", "backend": "dynamo", "dynamic": False, "engine": "ours", "probe": "raise"},
        {"class": "C", "backend": "dynamo", "dynamic": False, "engine": "ours", "skip": "[all] model-side: needs X"},
    ]
    runner.run_jobs(specs, store, jobs=1, timeout=60, progress=False)
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    outcomes = {json.loads(line)["model_class"]: json.loads(line)["outcome"] for line in lines}
    assert outcomes == {"A": "crash", "B": "fail", "C": "skip"}


def test_resume_skips_jobs_done_under_the_same_versions_and_revision(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    spec = {"class": "BertModel", "backend": "onnx", "dynamic": True, "engine": "ours"}
    old = runner.ResultStore(path, {"torch": "1"}, "rev1")
    old.append({"key": runner.job_key(spec), "outcome": "pass", "versions": {"torch": "1"}, "revision": "rev1"})
    assert runner.ResultStore(path, {"torch": "1"}, "rev1").done() == {"ours|onnx|dynamic|BertModel"}
    assert runner.ResultStore(path, {"torch": "1"}, "rev2").done() == set()
    assert runner.ResultStore(path, {"torch": "2"}, "rev1").done() == set()
    with open(path, "a") as handle:  # a line cut by a kill does not break the resume
        handle.write('{"key": "cut')
    assert len(runner.ResultStore(path, {"torch": "1"}, "rev1").records()) == 1


def test_retry_reruns_jobs_whose_latest_record_ended_at_the_given_stage(tmp_path: Path) -> None:
    store = runner.ResultStore(tmp_path / "results.jsonl", {"torch": "1"}, "rev1")
    for key, outcome, stage in [
        ("ours|dynamo|static|A", "fail", "tiny config"),
        ("ours|dynamo|static|B", "timeout", "timeout"),
        ("ours|dynamo|static|C", "fail", "runtime"),
        ("ours|dynamo|static|D", "fail", "eager"),
        ("ours|dynamo|static|D", "pass", None),  # the latest record of a key decides
    ]:
        store.append({"key": key, "outcome": outcome, "stage": stage, "versions": {"torch": "1"}, "revision": "rev1"})
    keys = {"ours|dynamo|static|" + c for c in "ABCD"}
    assert store.done() == keys
    assert store.done(retry=["tiny config", "eager"]) == keys - {"ours|dynamo|static|A"}
    assert store.done(retry=["timeout"]) == keys - {"ours|dynamo|static|B"}


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a live process; None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else (fields[0], int(fields[1]), int(fields[2]))


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _proc_stat(int(entry))
            if stat is not None and stat[1] == pid:
                out.append(int(entry))
    return out


def _wait_for(condition, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    return condition()


def _job_child(parent: int) -> int | None:
    """The forked job of ``parent`` once it leads its own process group (the runner's child does that first)."""
    for pid in _children(parent):
        stat = _proc_stat(pid)
        if stat is not None and stat[2] == pid:
            return pid
    return None


def test_a_job_killed_from_outside_is_a_crash_naming_the_signal_not_an_oom() -> None:
    """Only the runner's own memory cap makes an ``oom``: a ``kill -9`` from anyone else is a crash."""
    result: dict = {}
    spec = {"class": "BertModel", "backend": "dynamo", "dynamic": False, "probe": "hang"}
    thread = threading.Thread(target=lambda: result.update(runner.run_forked(spec, timeout=120, memory_bytes=2**32)))
    thread.start()
    child = _wait_for(lambda: _job_child(os.getpid()), 60)
    assert child, "the job's child never started"
    os.kill(child, signal.SIGKILL)
    thread.join(60)
    assert (result["outcome"], result["stage"], result["kind"]) == ("crash", "crash", "crash"), result
    assert result["message"] == "killed by signal 9 (SIGKILL)"
    assert runner.signal_label(signal.SIGTERM) == "15 (SIGTERM)" and runner.signal_label(40) == "40"


_SWEEP_SCRIPT = """
import sys
from pathlib import Path
from hf_exporters.sweep import runner
store = runner.ResultStore(Path(sys.argv[1]) / "results.jsonl", {"torch": "x"}, "rev")
spec = {"class": "A", "backend": "dynamo", "dynamic": False, "engine": "ours", "probe": "hang"}
try:
    runner.run_jobs([spec], store, jobs=1, timeout=600, progress=False)
except runner.SweepInterrupted as stopped:
    sys.exit(128 + stopped.signum)
"""


@pytest.mark.parametrize(
    ("sig", "group"),
    [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGKILL, False), (signal.SIGINT, True)],
    ids=["SIGTERM", "SIGINT", "SIGKILL", "ctrl-c"],
)
def test_a_killed_sweep_leaves_no_job_running_and_records_nothing(tmp_path: Path, sig: signal.Signals, group: bool) -> None:
    """The sweep -> zygote -> job chain: killing the sweep (even with SIGKILL) ends its job at once, and
    neither the job's result file nor a record of it is written. ``ctrl-c``: SIGINT to the sweep's whole
    process group, as a terminal sends it (the zygote gets it too)."""
    out, scratch = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch))
    sweep = subprocess.Popen([sys.executable, "-c", _SWEEP_SCRIPT, str(out)], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    found: tuple[int, int] | None = None
    try:
        def job() -> tuple[int, int] | None:
            for zygote in _children(sweep.pid):
                child = _job_child(zygote)
                if child:
                    return zygote, child
            return None

        found = _wait_for(job, 240)
        assert found, f"no job started: {sweep.poll()} {sweep.stderr.read().decode()[-2000:] if sweep.poll() is not None else ''}"
        zygote, child = found
        time.sleep(0.5)  # the job is in its sleep
        (os.killpg if group else os.kill)(sweep.pid, sig)
        sweep.wait(30)
        assert _wait_for(lambda: _proc_stat(child) is None and _proc_stat(zygote) is None, 5), "the job outlived its sweep"
        assert sweep.returncode == (-sig if sig == signal.SIGKILL else 128 + sig)
    finally:
        if sweep.poll() is None:
            sweep.kill()
        sweep.wait()
        for pid in found or ():  # what a failing run left behind
            if _proc_stat(pid) is not None:
                os.kill(pid, signal.SIGKILL)
    assert not (out / "results.jsonl").exists() or (out / "results.jsonl").read_text() == ""
    assert list(scratch.glob("hf-sweep-result-*")) == []  # the job's result file was not left behind either


def _sweep_cli(*args: str):
    from typer.testing import CliRunner

    from hf_exporters.cli import app

    return CliRunner().invoke(app, ["sweep", "--only", "BertModel", "--backend", "dynamo", "--shapes", "static", "--no-progress", *args])


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(folder.rglob("*"))}


def test_a_second_sweep_on_the_same_folder_refuses_and_writes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from hf_exporters.sweep import runner; runner.claim_output(sys.argv[1]); "
         "print('locked', flush=True); sys.stdin.read()", str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        store = runner.ResultStore(folder / "results.jsonl", {"torch": "x"}, "rev")
        store.append({**_record("ours", "dynamo", False, "BertModel", "pass"), "versions": {"torch": "x"}, "revision": "rev"})
        before = _snapshot(folder)
        for args in ([], ["--no-resume"], ["--report-only"]):
            result = _sweep_cli("--output", str(folder), *args)
            assert result.exit_code == 1, result.output
            assert result.stderr == (
                f"error: --output {folder} is in use by another sweep (pid {holder.pid}); "
                "wait for it to end or choose another --output\n"
            )
            assert _snapshot(folder) == before
    finally:
        holder.stdin.close()
        holder.wait(30)
    # the holder is gone (its lock with it): the folder is free again, and the lock is released after a sweep
    result = _sweep_cli("--output", str(folder), "--report-only")
    assert result.exit_code == 0, result.output
    assert (folder / "report.md").exists() and not (folder / runner.LOCK_NAME).exists()
    (folder / runner.LOCK_NAME).write_text("12345\n")  # left by a sweep killed outright: taken over
    with runner.claim_output(folder):
        assert (folder / runner.LOCK_NAME).read_text() == f"{os.getpid()}\n"
    assert runner.foreign_entry(folder) is None


def test_a_sweep_refuses_a_folder_holding_files_it_does_not_write(tmp_path: Path) -> None:
    folder = tmp_path / "thesis"
    (folder / "src").mkdir(parents=True)
    (folder / "thesis.tex").write_text("\\documentclass{article}\n")
    (folder / "src" / "main.py").write_text("print('mine')\n")
    before = _snapshot(folder)
    for args in ([], ["--no-resume"], ["--report-only"]):
        result = _sweep_cli("--output", str(folder), *args)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith(f"error: --output {folder} holds src/main.py, which a sweep does not write;")
        assert result.stderr.endswith("nothing was changed\n") and result.stderr.count("\n") == 1
        assert _snapshot(folder) == before
    # a file named as a sweep's but not one (a report of one's own) is not taken for one
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("# My report\n")
    assert runner.foreign_entry(mine) == "report.md"
    result = _sweep_cli("--output", str(mine / "report.md"))
    assert (result.exit_code, result.stderr) == (1, f"error: --output {mine / 'report.md'} is a file, not a folder\n")
    # a folder of a sweep's own files is one: the sweep appends to it and deletes nothing
    own = tmp_path / "own"
    store = runner.ResultStore(own / "results.jsonl", {"torch": "x"}, "rev")
    store.append({**_record("ours", "dynamo", False, "BertModel", "pass"), "versions": {"torch": "x"}, "revision": "rev"})
    report.write_reports(own, store.records(), {"versions": {"transformers": "x"}})
    (own / "runs.jsonl").write_text(json.dumps({"command": "hf-exporters sweep"}) + "\n")
    assert runner.foreign_entry(own) is None
    result = _sweep_cli("--output", str(own), "--report-only")
    assert result.exit_code == 0, result.output
    assert store.records()[0]["key"] == "ours|dynamo|static|BertModel"


# ── Classification ───────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u0, 1)", "data-dependent guard"),
        ("DispatchError: No ONNX function found for <OpOverload(op='prims.zeta')>", "unsupported op"),
        ("ValueError: axes asked to be dynamic ended static: input_ids[axis 1] = 8", "specialised axis"),
        ("ParityError: outputs differ from eager beyond atol=0.001 for inputs {}: x: max abs diff 0.1", "numeric mismatch"),
        ("ParityError: the model computes differently when traced: eager run as under torch.export (torch.compiler.is_compiling() true) differs from plain eager by 0.742; outputs differ from eager beyond atol=0.001", "eager differs when traced"),
        ("ParityError: the artifact returned 2 outputs where eager returns 3 (a, b, c)", "output structure mismatch"),
        ("RuntimeError: [ONNXRuntimeError] : 1 : FAIL : Load model failed", "onnxruntime error"),
        ("KeyError: 'foo'", "other: KeyError"),
        ("ValueError: Ran into a kwarg keyword mismatch: Got the following keywords ['x'] but expected ['x', 'cu_seqlens']", "input mismatch"),
        ("ImportError: transformers has no attribute VoxtralRealtimeTextModel", "class not importable"),
        ("ImportError: TimmBackbone requires the timm library but it was not found in your environment", "missing dependency"),
        ("RuntimeError: Given groups=1, weight of size [64, 1, 7], expected input[2, 3, 16] to have 1 channels, but got 3 channels instead", "shape error"),
    ],
)
def test_error_kinds(message: str, kind: str) -> None:
    assert classify(message) == kind


def test_a_job_records_stage_kind_and_message() -> None:
    record = run_job({"class": "NoSuchModelClass", "backend": "dynamo", "dynamic": False})
    assert record["outcome"] == "fail" and record["stage"] == "tiny config"
    assert record["message"].startswith("ImportError") and record["kind"]


# ── EXPORT_SKIPS ─────────────────────────────────────────────────────────────


def test_export_skips_are_scoped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(known_issues.EXPORT_SKIPS, "onnx.dynamic", {"FooModel": "model-side: the mask uses .item()"})
    monkeypatch.setitem(known_issues.EXPORT_SKIPS, "all", {"BarModel": "model-side: forward needs X"})
    assert known_issues.skip_reason("FooModel", "onnx", True).startswith("[onnx.dynamic]")
    assert known_issues.skip_reason("FooModel", "onnx", False) is None
    assert known_issues.skip_reason("FooModel", "dynamo", True) is None
    assert known_issues.skip_reason("BarModel", "executorch", False).startswith("[all]")
    specs = runner.plan([("FooModel", "foo")], ["onnx"], ["ours"], [False, True], known_issues.skip_reason)
    assert [bool(s.get("skip")) for s in specs] == [False, True]
    rechecked = runner.plan([("FooModel", "foo")], ["onnx"], ["ours"], [True], known_issues.skip_reason, recheck_skips=True)
    assert rechecked[0].get("recheck") and not rechecked[0].get("skip")


def test_every_export_skip_names_the_model_side_change() -> None:
    for scope, entries in known_issues.EXPORT_SKIPS.items():
        assert scope in known_issues.SKIP_SCOPES
        for model_class, reason in entries.items():
            assert "model-side" in reason, f"{scope}/{model_class}: {reason!r} names no model-side change"


# ── Reports ──────────────────────────────────────────────────────────────────


def _record(engine: str, backend: str, dynamic: bool, cls: str, outcome: str, stage: str | None = None, kind: str | None = None) -> dict:
    return {
        "key": f"{engine}|{backend}|{'dynamic' if dynamic else 'static'}|{cls}",
        "engine": engine, "backend": backend, "dynamic": dynamic, "model_class": cls, "outcome": outcome,
        "stage": stage, "kind": kind, "message": f"{kind}: example" if kind else None,
    }


def test_reports_from_a_synthetic_results_file(tmp_path: Path) -> None:
    records = [
        _record("ours", "onnx", False, "A", "pass"),
        _record("ours", "onnx", False, "B", "fail", "lowering", "unsupported op"),
        _record("ours", "onnx", False, "B", "pass"),  # a rerun replaces the earlier record
        _record("ours", "onnx", False, "C", "skip"),
        _record("ours", "onnx", False, "D", "timeout", "timeout", "timeout"),
        _record("upstream", "onnx", False, "A", "fail", "exporter trace", "data-dependent guard"),
        _record("upstream", "onnx", False, "B", "pass"),
        _record("upstream", "onnx", False, "D", "pass"),
    ]
    summary = report.write_reports(tmp_path, records, {"classes_total": 10, "base_classes_total": 5, "versions": {"transformers": "x"}})
    ours = summary["groups"]["ours|onnx|static|off"]
    assert (ours["selected"], ours["total"], ours["pass"], ours["skip"], ours["fail"], ours["not_run"]) == (4, 4, 2, 1, 1, 0)
    assert ours["failures_by_stage"] == {"timeout": 1} and ours["pass_rate"] == 0.5
    upstream = summary["groups"]["upstream|onnx|static|off"]  # C has no upstream record: not run, still counted
    assert (upstream["selected"], upstream["pass"], upstream["not_run_classes"]) == (4, 2, ["C"])
    assert summary["engine_differences"] == {
        "ours_pass_upstream_fails": ["A (onnx, static, cache off)"],
        "upstream_pass_ours_fails": ["D (onnx, static, cache off)"],
    }
    text = (tmp_path / "report.md").read_text()
    assert "| ours | onnx | static | off | 2 / 4 | 50.0% | 1 | 1 | 0 | 0 | timeout 1 |" in text and "data-dependent guard" in text
    assert "| upstream | onnx | static | off | 2 / 4 | 50.0% | 0 | 1 | 0 | 1 | exporter trace 1 |" in text
    assert (tmp_path / "pass_rates.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert json.loads((tmp_path / "summary.json").read_text())["classes_run"] == 4
    # a dynamic pass without a second input set is named in the report
    one, two = _record("ours", "onnx", True, "A", "pass"), _record("ours", "onnx", True, "B", "pass")
    one["input_sets"], two["input_sets"] = 1, 2
    report.write_reports(tmp_path, [*records, one, two], {"versions": {"transformers": "x"}})
    assert "- ours onnx dynamic cache off: 1 of 2 passes ran one input set only: A." in (tmp_path / "report.md").read_text()


def test_the_report_lists_classes_moved_to_degenerate_and_mended_back(tmp_path: Path) -> None:
    def at(revision: str, record: dict) -> dict:
        return {**record, "revision": revision, "cache": "default"}

    degenerate = ("fail", "signal", "degenerate model")
    records = [
        at("old", _record("ours", "onnx", False, "A", "pass")),  # a pass the signal rule takes away
        at("old", _record("ours", "onnx", False, "B", *degenerate)),  # mended: passes at the headline
        at("old", _record("ours", "onnx", False, "C", *degenerate)),
        at("new", _record("ours", "onnx", False, "A", *degenerate)),
        at("new", _record("ours", "onnx", False, "B", "pass")),
        at("new", _record("ours", "onnx", False, "C", *degenerate)),
        at("new", _record("ours", "onnx", False, "D", "pass")),
        at("newer", _record("ours", "dynamo", False, "D", *degenerate)),  # another revision, newer than the headline
        at("new", _record("ours", "dynamo", False, "D", "pass")),
        at("old", _record("ours", "dynamo", False, "E", *degenerate)),  # degenerate, then another failure: no list
        at("new", _record("ours", "dynamo", False, "E", "fail", "parity", "numeric mismatch")),
        # degenerate known by its stage and message alone (a record written before the kind existed)
        {**at("new", _record("ours", "dynamo", False, "F", "fail", "signal")), "message": "degenerate model: outputs below 0.01"},
    ]
    summary = report.write_reports(tmp_path, records, {"versions": {"transformers": "x"}}, revision="new")
    assert summary["signal_changes"] == {
        "degenerate": {
            "A": ["ours onnx static cache default"], "C": ["ours onnx static cache default"],
            "F": ["ours dynamo static cache default"],
        },
        "moved": {"A": ["ours onnx static cache default"]},
        "mended": {"B": ["ours onnx static cache default"], "D": ["ours dynamo static cache default"]},
    }
    text = (tmp_path / "report.md").read_text()
    assert "### Degenerate at the headline revision: 3 classes (3 jobs)\n\n- A (1 job: ours onnx static cache default)\n- C (1 job" in text
    assert "### Mended back to passes (degenerate at another revision): 2 classes (2 jobs)\n\n- B (1 job: ours onnx static cache default)\n" in text


def test_the_headline_table_gives_base_all_classes_and_generation_with_not_run_counts(tmp_path: Path) -> None:
    def at(record: dict, **extra) -> dict:
        return {**record, "revision": "r1", "cache": "default", **extra}

    records = [
        at(_record("ours", "onnx", False, "A", "pass")),
        at(_record("ours", "onnx", False, "B", "fail", "parity", "numeric mismatch")),
        at(_record("ours", "onnx", False, "X", "pass")),  # a class outside the base selection: the all-classes row
        at(_record("ours", "onnx", True, "A", "pass")),
        {**_record("ours", "onnx", True, "G", "pass"), "key": "ours|onnx|generation|G", "mode": "generation", "revision": "r1"},
        # none of these counts in the all-classes row: another revision, the cache off kind, the C++ runtime, and
        # a generation job of a class of the universe
        {**_record("ours", "onnx", False, "Y", "pass"), "revision": "r0", "cache": "default", "finished": "0"},
        {**_record("ours", "onnx", False, "Y", "pass"), "key": "ours|onnx|static|Y|off", "revision": "r1", "cache": "off"},
        {**_record("ours", "onnx", False, "Y", "pass"), "key": "ours|onnx|static|Y|cpp", "revision": "r1", "cache": "default", "runtime": "cpp"},
        {**_record("ours", "onnx", True, "Y", "pass"), "key": "ours|onnx|generation|Y", "mode": "generation", "revision": "r1"},
    ]
    selection = {"forward": ["A", "B"], "generation": ["G", "H"], "cache": {"default": ["A", "B"], "off": []}}
    summary = report.write_reports(
        tmp_path, records, {"versions": {"transformers": "x"}, "classes_total": 4, "class_set": "base"}, selection,
        revision="r1", universe=["A", "B", "X", "Y"],
    )
    rows = {row["scope"]: row["cells"] for row in summary["scopes"]}
    assert rows["base static"]["ours onnx"] == {"pass": 1, "selected": 2, "not_run": 0}
    assert rows["base dynamic"]["ours onnx"] == {"pass": 1, "selected": 2, "not_run": 1}
    assert rows["all static"]["ours onnx"] == {"pass": 2, "selected": 4, "not_run": 1}
    assert rows["all static"]["upstream dynamo"] == {"pass": 0, "selected": 4, "not_run": 4}
    assert rows["generation"]["ours onnx"] == {"pass": 1, "selected": 2, "not_run": 1}
    text = (tmp_path / "report.md").read_text()
    assert "| 2 base classes, static | 0 / 2, 2 not run (none run) | 1 / 2 (50.0%) | 0 / 2, 2 not run (none run) |" in text
    assert "| all 4 classes, static | 0 / 4, 4 not run (none run) | 2 / 4, 1 not run (66.7% of the 3 run) | not planned |" in text
    assert "| generation (token ids), 2 generative classes | 0 / 2, 2 not run (none run) | 1 / 2, 1 not run (100.0% of the 1 run) |" in text
    assert "not planned (our engine only)" in text


def test_failure_kinds_rank_by_classes_and_split_setup_from_export() -> None:
    records = [
        _record("ours", "onnx", False, "A", "fail", "eager", "shape error"),
        _record("ours", "dynamo", False, "A", "fail", "eager", "shape error"),
        _record("ours", "onnx", True, "A", "fail", "eager", "shape error"),
        _record("ours", "onnx", False, "B", "fail", "lowering", "unsupported op"),
        _record("ours", "onnx", False, "C", "fail", "runtime", "unsupported op"),
        _record("upstream", "onnx", False, "D", "fail", "exporter trace", "data-dependent guard"),
    ]
    ranked = report.top_failure_kinds(records)
    assert [(k["kind"], k["classes"], k["count"]) for k in ranked] == [
        ("unsupported op", 2, 2), ("shape error", 1, 3), ("data-dependent guard", 1, 1),
    ]
    export = report.top_failure_kinds(records, engine="ours", export_side=True)
    assert [(k["kind"], k["classes"], k["examples"]) for k in export] == [("unsupported op", 2, ["B", "C"])]


def test_smoke_regressions_against_the_baseline() -> None:
    assert 18 <= len(smoke.smoke_classes()) <= 24
    baseline = {"ours|onnx|static|A": "pass", "ours|onnx|static|B": "fail"}
    records = [_record("ours", "onnx", False, "A", "fail", "parity", "numeric mismatch"), _record("ours", "onnx", False, "B", "pass")]
    assert [r.split(":")[0] for r in smoke.regressions(records, baseline)] == ["ours|onnx|static|A"]


def test_a_class_several_types_reuse_is_listed_under_its_own_type() -> None:
    from hf_exporters.sweep import classes

    base = classes.base_classes()
    assert base["LlamaModel"] == "llama"
    assert classes.select(base, "llama") == ["LlamaModel"]
    with pytest.raises(ValueError, match="^--only nomatch-xyz: no model class or model type matches$"):
        classes.select(base, "nomatch-xyz")


# ── Generation mode ──────────────────────────────────────────────────────────


def test_generative_classes_take_the_full_model_of_encoder_decoder_types() -> None:
    generative = classes.generative_classes()
    assert generative["LlamaForCausalLM"] == "llama"
    assert generative["T5ForConditionalGeneration"] == "t5"
    assert generative["WhisperForConditionalGeneration"] == "whisper"
    assert "WhisperForCausalLM" not in generative and "BartForCausalLM" not in generative
    assert generative["LlavaForConditionalGeneration"] == "llava"


def test_generation_jobs_are_planned_for_our_engine_with_their_own_keys() -> None:
    specs = runner.plan([("LlamaForCausalLM", "llama")], ["dynamo", "onnx"], ["ours", "upstream"], ["generation"])
    assert [runner.job_key(s) for s in specs] == ["ours|dynamo|generation|LlamaForCausalLM", "ours|onnx|generation|LlamaForCausalLM"]
    assert all(s["mode"] == "generation" and s["dynamic"] for s in specs)


def test_a_generation_job_compares_token_ids_with_eager_generate() -> None:
    record = run_job({"class": "LlamaForCausalLM", "backend": "dynamo", "dynamic": True, "mode": "generation"})
    assert record["outcome"] == "pass", record
    assert record["new_tokens"] == 8 and record["inputs"]["input_ids"] == [2, 8]
    mamba = run_job({"class": "MambaForCausalLM", "backend": "dynamo", "dynamic": True, "mode": "generation"})
    assert mamba["outcome"] == "pass", mamba  # the state-space cache (cache_params) carried as fixed-size tensors
    assert mamba["new_tokens"] == 8
    hybrid = run_job({"class": "Inkling2ForCausalLM", "backend": "dynamo", "dynamic": True, "mode": "generation"})
    assert (hybrid["outcome"], hybrid["stage"]) == ("fail", "exporter decompose")
    assert hybrid["message"] == (
        "InputError: Inkling2ForCausalLM: generate()'s cache holds recurrent state beside layers of kind "
        "LinearAttentionAndSlidingWindowAttentionLayer; only DynamicLayer, LinearAttentionLayer, "
        "LinearAttentionAndFullAttentionLayer, DummyLayer layers are supported in a hybrid cache yet"
    )


def test_a_seq2seq_model_whose_encoder_output_has_its_own_class_generates_from_the_export() -> None:
    """Moonshine's decoder reads ``encoder_outputs.attention_mask``, a field of its encoder's own output
    class: the exported decoder step builds that class, and 8 greedy tokens match eager generate()."""
    record = run_job({"class": "MoonshineForConditionalGeneration", "backend": "dynamo", "dynamic": True, "mode": "generation"})
    assert record["outcome"] == "pass", record
    assert record["new_tokens"] == 8 and record["inputs"]["input_values"] == [2, 3200]


def test_seq2seq_generation_bounds_the_cache_length_by_the_position_table() -> None:
    """A decoder with a learned position table of ``max_position_embeddings`` rows guards the cache
    length below it (M2M100: ``past <= 127``); the named ``past`` dimension takes that bound, and the
    exported decode step generates the same tokens as eager."""
    from hf_exporters.generation.parts import _MAX_PAST, _past_limit
    from hf_exporters.sweep.job import build_model

    model = build_model("M2M100ForConditionalGeneration", use_cache=True)
    assert model.config.max_position_embeddings < _MAX_PAST
    assert _past_limit(model) == model.config.max_position_embeddings - 1
    record = run_job({"class": "M2M100ForConditionalGeneration", "backend": "dynamo", "dynamic": True, "mode": "generation"})
    assert record["outcome"] == "pass", record


def test_generation_rows_have_their_own_group_in_the_reports(tmp_path: Path) -> None:
    records = [
        _record("ours", "onnx", True, "A", "pass"),
        {**_record("ours", "onnx", True, "A", "fail", "parity", "token id mismatch"), "mode": "generation", "key": "ours|onnx|generation|A"},
    ]
    summary = report.write_reports(tmp_path, records, {"classes_total": 1, "base_classes_total": 1, "versions": {}})
    assert summary["groups"]["ours|onnx|dynamic|off"]["pass"] == 1
    generation = summary["groups"]["ours|onnx|generation|default"]
    assert (generation["total"], generation["fail"], generation["failures_by_stage"]) == (1, 1, {"parity": 1})
    assert "| ours | onnx | generation | default | 0 / 1 | 0.0% | 0 | 1 | 0 | 0 | parity 1 |" in (tmp_path / "report.md").read_text()
    assert classify("ParityError: token ids differ from eager generate() (shapes [2, 16] vs [2, 16]; first 9 positions equal)") == "token id mismatch"


def test_a_dynamic_job_requires_batch_and_length_axes_only() -> None:
    from hf_exporters.sweep.job import _unexpected_static, expected_dynamic_axes

    ids = torch.ones(2, 8, dtype=torch.long)
    pixels = torch.zeros(2, 3, 32, 32)
    audio = torch.zeros(2, 3200)
    assert expected_dynamic_axes("input_ids", ids) == {0, 1}
    assert expected_dynamic_axes("pixel_values", pixels) == {0}
    assert expected_dynamic_axes("input_values", audio) == {0, 1}
    assert expected_dynamic_axes("input_values", torch.zeros(2, 1, 3200)) == {0, 2}
    assert expected_dynamic_axes("input_values", torch.zeros(2, 64, 128)) == {0, 1}  # (batch, frames, mel bins)
    grid = torch.tensor([[1, 4, 4]])  # (images, 3): a (t, h, w) row per image, not a token sequence
    assert expected_dynamic_axes("image_grid_thw", grid) == {0}
    assert expected_dynamic_axes("spatial_shapes", torch.tensor([[4, 4], [4, 4]])) == {0}
    assert expected_dynamic_axes("token_type_ids", ids) == {0, 1}
    fixed = [("pixel_values", 1, 3), ("pixel_values", 2, 32), ("input_ids", 1, 8)]
    assert _unexpected_static(fixed, {"input_ids": ids, "pixel_values": pixels}) == [("input_ids", 1, 8)]
    assert _unexpected_static([("image_grid_thw", 1, 3)], {"image_grid_thw": grid}) == []
    one = torch.ones(1, 8, dtype=torch.long)  # one sample: torch.export specialises size 1 whatever is asked
    assert _unexpected_static([("input_ids", 0, 1), ("input_ids", 1, 8)], {"input_ids": one}) == [("input_ids", 1, 8)]


def test_zygotes_preload_executorch_only_for_runs_with_executorch_jobs() -> None:
    assert runner.preload_for([{"backend": "dynamo"}, {"backend": "onnx"}]) == ()
    assert "executorch.exir" in runner.preload_for([{"backend": "onnx"}, {"backend": "executorch"}])


class _MaskedPatches(torch.nn.Module):
    """MAE's pattern: ``noise`` (batch, patches) must be as long as the image has patches, a tie made
    through data (a gather by its argsort), which no guard records."""

    def forward(self, pixel_values: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        patches = pixel_values.reshape(pixel_values.shape[0], 4, -1)
        order = torch.argsort(noise, dim=1)
        return torch.gather(patches.sum(-1), 1, order)


def test_a_dynamic_job_grows_only_sizes_the_model_accepts() -> None:
    from hf_exporters.runtime import resized_inputs
    from hf_exporters.sweep.job import expected_dynamic_axes

    model = _MaskedPatches()
    inputs = {"pixel_values": torch.randn(2, 16), "noise": torch.rand(2, 4)}
    dims = {"pixel_values": {0: torch.export.Dim("batch")}, "noise": {0: torch.export.Dim("batch"), 1: torch.export.Dim.AUTO}}
    program = torch.export.export(model, (), inputs, dynamic_shapes=dims)
    grown = resized_inputs(program, inputs)
    assert grown["noise"].shape == (5, 7) and grown["pixel_values"].shape == (5, 16)
    with pytest.raises(RuntimeError, match=r"index \d is out of bounds for dimension 1 with size 4"):
        model(**grown)
    batch_only = resized_inputs(program, inputs, axes=expected_dynamic_axes)
    assert batch_only["noise"].shape == (5, 4) and batch_only["pixel_values"].shape == (5, 16)
    assert model(**batch_only).shape == (5, 4)
    # sweep jobs grow the batch and length axes only, for both engines: the MAE model passes on two sets
    record = run_job({"class": "ViTMAEModel", "backend": "dynamo", "dynamic": True})
    assert (record["outcome"], record["input_sets"]) == ("pass", 2), record


def test_a_model_without_forward_is_named_so():
    from hf_exporters.errors import InputError
    from hf_exporters.sweep.inputs import build_inputs
    from hf_exporters.sweep.job import build_model, classify

    with pytest.raises(InputError) as caught:
        build_inputs(build_model("BarkModel"))  # generate-only: its sub-models have forwards, it has none
    assert str(caught.value) == "BarkModel defines no forward (it is called through other methods, e.g. generate or encode)"
    assert classify(f"InputError: {caught.value}") == "no forward"


# ── Signal: no vacuous passes ────────────────────────────────────────────────


class _Scaled(torch.nn.Module):
    """``features -> scale * proj(features)`` (+ ``offset``): a healthy model at scale 1, one whose outputs vanish
    (about 1e-20, as a tiny MobileNet's reach 1e-28) at scale 1e-20, and one that ignores its input at scale 0."""

    def __init__(self, scale: float, offset: float = 0.0):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.scale, self.offset = scale, offset

    def forward(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = self.proj(features) * self.scale + self.offset
        return {"last_hidden_state": hidden, "pooled": hidden.mean(dim=1)}


def _tiny_job(monkeypatch: pytest.MonkeyPatch, model: torch.nn.Module, extra: dict | None = None) -> None:
    """Make ``run_job`` build ``model`` and draw its inputs from the seed, whatever the class named."""
    from hf_exporters.sweep import inputs as sweep_inputs
    from hf_exporters.sweep import job

    torch.manual_seed(0)
    model.eval()
    monkeypatch.setattr(job, "build_model", lambda name, use_cache=False: model)

    def draw(_model: torch.nn.Module, seed: int = 0) -> dict[str, torch.Tensor]:
        return {"features": torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(seed)), **(extra or {})}

    monkeypatch.setattr(sweep_inputs, "build_inputs", draw)


def test_a_model_whose_outputs_carry_no_signal_is_a_degenerate_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs of about 1e-20 pass any parity check (an artifact returning zeros would too): the job is the setup
    failure ``degenerate model`` at stage ``signal``, with the figures it was judged on; so is a model whose output
    does not change with its input. A healthy model passes, its figures and relative error recorded."""
    from hf_exporters.sweep.signal_check import SIGNAL_FLOOR

    _tiny_job(monkeypatch, _Scaled(1e-20))
    record = run_job({"class": "Vanishing", "backend": "dynamo", "dynamic": False})
    assert (record["outcome"], record["stage"], record["kind"]) == ("fail", "signal", "degenerate model"), record
    assert record["message"].startswith("degenerate model: outputs below 0.01 in magnitude: last_hidden_state (max |x| ")
    signal_figures = record["signal"]
    assert signal_figures["ok"] is False and signal_figures["floor"] == SIGNAL_FLOOR == 0.01
    assert signal_figures["silent"] == ["last_hidden_state", "pooled"] and signal_figures["main"] == "last_hidden_state"
    leaf = signal_figures["leaves"][0]
    assert leaf["name"] == "last_hidden_state" and 0 < leaf["max_abs"] < 1e-18 and leaf["std"] > 0 and leaf["change"] < 1e-18
    assert "max_abs_diff" not in record  # nothing was exported

    _tiny_job(monkeypatch, _Scaled(0.0, offset=3.0))  # large outputs, the same whatever the input
    record = run_job({"class": "Constant", "backend": "dynamo", "dynamic": False})
    assert (record["stage"], record["kind"]) == ("signal", "degenerate model"), record
    assert "the main output last_hidden_state does not change with the input" in record["message"]
    assert record["signal"]["silent"] == [] and record["signal"]["main_change"] == 0.0

    _tiny_job(monkeypatch, _Scaled(1.0))
    record = run_job({"class": "Healthy", "backend": "dynamo", "dynamic": False})
    assert record["outcome"] == "pass", record
    assert record["signal"]["ok"] and record["signal"]["main_change"] >= SIGNAL_FLOOR
    assert all(leaf["max_abs"] >= SIGNAL_FLOOR for leaf in record["signal"]["leaves"])
    assert 0 <= record["max_rel_diff"] <= record["max_abs_diff"] / 0.01 and record["max_rel_diff"] < 1e-5


def test_the_signal_floor_is_ten_times_the_loosest_backend_tolerance() -> None:
    from hf_exporters.exporters.dynamo import DynamoExporter
    from hf_exporters.exporters.onnx import OnnxExporter
    from hf_exporters.sweep import signal_check

    loosest = max(DynamoExporter.default_atol, OnnxExporter.default_atol, 1e-3)  # ExecuTorch's is 1e-3
    assert signal_check.LOOSEST_ATOL == loosest and signal_check.SIGNAL_FLOOR == 10 * loosest
    # integer outputs: judged by the change of the main output only; a structural zero output is silent
    ids = [("codes", torch.tensor([[1, 2]]))]
    assert signal_check.judge(ids, [("codes", torch.tensor([[1, 3]]))])["ok"]
    assert not signal_check.judge(ids, [("codes", torch.tensor([[1, 2]]))])["ok"]
    # a leaf exactly zero on both sets (a scaler's loc) is exempt and listed; the main output is preferred by name,
    # and one whose length follows the input changed
    first = [("loss", torch.tensor(1e-3)), ("loc", torch.zeros(2, 1)), ("last_hidden_state", torch.randn(2, 5))]
    second = [("loss", torch.tensor(1e-3)), ("loc", torch.zeros(2, 1)), ("last_hidden_state", torch.randn(2, 7))]
    verdict = signal_check.judge(first, second)
    assert (verdict["main"], verdict["zero"], verdict["silent"], verdict["main_change"]) == ("last_hidden_state", ["loc"], ["loss"], float("inf"))
    assert verdict["reason"].startswith("degenerate model: outputs below 0.01 in magnitude: loss (max |x| 0.001)")
    assert classify("degenerate model: outputs below 0.01 in magnitude: x (max |x| 1e-28)") == "degenerate model"


def test_tiny_models_of_vanishing_families_carry_signal() -> None:
    """MobileNetV1's convolutions, drawn at the init scale over untrained batch norms, shrank its outputs to
    7.8e-28; SAM's and BLIP's vision towers keep initializer_range=1e-10; ConvNeXt scales each residual branch by
    1e-6; SAM's mask decoder heads (no normalisation) end below 1e-3; Mimi's all-zero codebooks give every audio
    the same codes; Kosmos-2's image embeddings (two projections, no normalisation) were 8.6e-3; PE Audio multiplies
    its audio-text logits by a scale initialised to 0. The tiny builder raises the init scales to a floor (SAM's
    and Kosmos-2's text init to 0.1), sets a zero logit scale to 1, calibrates the batch norms and the codebooks on
    the sweep's inputs, and the tiny models' outputs carry signal."""
    from hf_exporters.runtime.compare import eager_outputs
    from hf_exporters.sweep.inputs import build_inputs
    from hf_exporters.sweep.job import _signal_inputs, build_model
    from hf_exporters.sweep.signal_check import judge

    assert transformers.SamVisionConfig().initializer_range == 1e-10
    assert tiny.tiny_config(transformers.SamVisionConfig).initializer_range == 0.02
    assert tiny.tiny_config(transformers.BlipConfig).vision_config.initializer_range == 0.02
    assert tiny.tiny_config(transformers.ConvNextConfig).layer_scale_init_value == 0.1
    assert tiny.tiny_config(transformers.DinatConfig).layer_scale_init_value == 0.0  # zero selects a path: kept
    assert all(reason.strip() for _, reason in tiny.INIT_FLOORS.values())
    for name in ("MobileNetV1Model", "SamVisionModel", "SamModel", "MimiModel", "Kosmos2Model", "PeAudioModel"):
        model = build_model(name)
        inputs = build_inputs(model)
        verdict = judge(eager_outputs(model, inputs), eager_outputs(model, _signal_inputs(model, inputs)))
        assert verdict["ok"], (name, verdict)
    norms = [m for m in build_model("MobileNetV1Model").modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(not bool((m.running_var == 1).all()) for m in norms)  # calibrated, not the init's 1


def test_tiny_hybrid_models_return_a_recurrent_state_with_signal() -> None:
    """A recurrent layer's state in the returned cache is a sum of products of two projections: at the common
    init of 0.02 the tiny Qwen3.5 text model's delta-rule state was 3.0e-3 and Bamba's Mamba-2 state 1.3e-4, below
    the signal floor. A (sub-)config declaring a recurrent state gets the recurrent-state init; Zamba also gets a
    wider time-step range."""
    from hf_exporters.runtime.compare import eager_outputs
    from hf_exporters.sweep.inputs import build_inputs
    from hf_exporters.sweep.job import _register_outputs, _signal_inputs, build_model
    from hf_exporters.sweep.signal_check import judge

    fields = {"initializer_range": 0.02, "text_config": {"initializer_range": 0.02, "linear_conv_kernel_dim": 4}, "vision_config": {"initializer_range": 0.02}}
    assert tiny.raise_init_scales(fields) == ["text_config.initializer_range"]
    assert (fields["initializer_range"], fields["text_config"]["initializer_range"], fields["vision_config"]["initializer_range"]) == (0.02, 0.1, 0.02)
    assert tiny.tiny_config(transformers.BambaConfig).initializer_range == tiny.RECURRENT_STATE_INIT[0] == 0.1
    assert tiny.tiny_config(transformers.BertConfig).initializer_range == 0.02
    assert tiny.tiny_config(transformers.ZambaConfig).time_step_min == 0.1
    for name in ("Qwen3_5TextModel", "BambaModel", "ZambaModel"):
        model = build_model(name, use_cache=None)
        inputs = build_inputs(model)
        _register_outputs(model, inputs, "ours")
        first = eager_outputs(model, inputs)
        verdict = judge(first, eager_outputs(model, _signal_inputs(model, inputs)))
        assert verdict["ok"], (name, verdict["reason"])
        assert len(first) > 1 and min(float(t.abs().max()) for _, t in first) > 0.01


# ── Every selected class counted, one revision ───────────────────────────────


def test_every_selected_class_is_counted_and_the_headline_is_one_revision(tmp_path: Path) -> None:
    """A selected class without a record is ``not run`` and counted in the denominator; the headline takes the
    records of one revision (the newest), the others are history only."""
    old = {**_record("ours", "onnx", False, "C", "pass"), "revision": "rev1", "finished": "2026-01-01T00:00:00"}
    records = [
        old,
        {**_record("ours", "onnx", False, "A", "pass"), "revision": "rev2", "finished": "2026-01-02T00:00:00"},
        {**_record("ours", "onnx", False, "B", "fail", "signal", "degenerate model"), "revision": "rev2", "finished": "2026-01-02T00:00:01"},
    ]
    selection = {"forward": ["A", "B", "C", "D"], "generation": []}
    summary = report.write_reports(tmp_path, records, {"versions": {"transformers": "x"}}, selection)
    assert summary["headline_revision"] == "rev2"
    group = summary["groups"]["ours|onnx|static|off"]
    assert (group["selected"], group["pass"], group["fail"], group["degenerate"], group["not_run"]) == (4, 1, 1, 1, 2)
    assert group["not_run_classes"] == ["C", "D"] and group["pass_rate"] == 0.25
    assert (summary["records_history"], summary["revisions_history"]) == (1, 1)
    text = (tmp_path / "report.md").read_text()
    assert "| ours | onnx | static | off | 1 / 4 | 25.0% | 0 | 1 | 1 | 2 | signal 1 |" in text
    assert "- ours onnx static cache off: 2 not run: C, D." in text
    assert "Headline revision: `rev2`" in text and "**1** records of 1 other revisions are kept as history only" in text
    # another revision asked for: its records make the headline
    summary = report.summarize(records, {}, selection, revision="rev1")
    assert (summary["groups"]["ours|onnx|static|off"]["pass"], summary["groups"]["ours|onnx|static|off"]["not_run"]) == (1, 3)


def test_smoke_fails_a_pass_without_signal_and_a_planned_job_not_run() -> None:
    baseline = {"ours|onnx|static|A": "pass", "ours|onnx|static|B": "pass", "ours|onnx|static|C": "pass"}
    vacuous = _record("ours", "onnx", False, "A", "pass")  # no signal verdict: recorded before the rule
    healthy = {**_record("ours", "onnx", False, "B", "pass"), "signal": {"ok": True}}
    bad = smoke.regressions([vacuous, healthy], baseline, planned=set(baseline))
    assert [line.split(":")[0] for line in bad] == ["ours|onnx|static|A", "ours|onnx|static|C"]
    assert "without the signal check" in bad[0] and bad[1].endswith("expected pass, not run")


# ── Upstream runs its artifacts on the inputs its preparation left ───────────


class _Normalised(torch.nn.Module):
    """A forward that computes ``scale`` with ``.tolist()`` unless given it, as the vision towers on flattened
    patches compute ``cu_seqlens``: upstream's export precomputes it into the sample inputs."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, features: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        if scale is None:
            scale = torch.tensor(features.abs().amax(dim=-1, keepdim=True).tolist())
        return self.proj(features / scale)


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_upstream_artifacts_run_on_the_inputs_its_preparation_left(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """Upstream's ``prepare_for_export`` adds the inputs it precomputes to the mapping it is given and traces
    with them; the sweep ran the artifact on its own inputs ("kwarg keyword mismatch", "the ONNX model takes 2
    inputs"). It runs it on the prepared copy, and grows the second input set from its own inputs, prepared again."""
    pytest.importorskip("onnxruntime", reason="the ONNX leg needs the onnx extra")
    from transformers.exporters import utils as upstream_utils

    def prepare(model: torch.nn.Module, inputs: dict) -> None:
        inputs["scale"] = inputs["features"].abs().amax(dim=-1, keepdim=True)

    monkeypatch.setitem(upstream_utils._EXPORT_INPUT_PREPARERS, ("features",), prepare)
    _tiny_job(monkeypatch, _Normalised())
    for dynamic in (False, True):
        record = run_job({"class": "Normalised", "backend": backend, "dynamic": dynamic, "engine": "upstream"})
        assert record["outcome"] == "pass", record
        assert record["upstream_prepared_inputs"] == ["scale"]
    assert record["input_sets"] == 2  # the grown set, prepared by upstream again


def test_an_unknown_class_set_is_a_usage_error(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hf_exporters.cli import app

    result = CliRunner().invoke(app, ["sweep", "--classes", "bogus", "--report-only", "--output", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "--classes: unknown bogus; choose from base, all, sample" in result.output
    assert not (tmp_path / "out").exists()


def test_inputs_for_an_x_vector_head_are_long_enough_for_its_time_delay_layers() -> None:
    from hf_exporters.sweep.inputs import AUDIO_SAMPLES, build_inputs

    config = transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(10, 20), conv_kernel=(10, 20), num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2,
        tdnn_dim=(16, 16, 16), tdnn_kernel=(5, 3, 3), tdnn_dilation=(1, 2, 3), xvector_output_dim=8,
    )
    torch.manual_seed(0)
    head, base = transformers.Wav2Vec2ForXVector(config).eval(), transformers.Wav2Vec2Model(config).eval()
    inputs = build_inputs(head)
    assert inputs["input_values"].shape == (2, (1 + 4 + 4 + 6 + 4) * 200)  # frames the time-delay layers take, by the strides' 200
    assert build_inputs(base)["input_values"].shape == (2, AUDIO_SAMPLES)  # the base model keeps the common length
    with torch.no_grad():
        assert head(**inputs).embeddings.shape == (2, 8)
