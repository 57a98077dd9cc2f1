"""Tiny configs for every config class, built generically from the class's defaults.

The defaults of a config class describe a full-size checkpoint. :func:`tiny_config` shrinks widths,
depths, head counts (keeping divisibility and the query/key-value head ratio), vocabularies, expert
counts, image and audio sizes, in the config and in every sub-config (text, vision, audio, backbone),
and keeps the fields that select a code path (attention kind, rope scaling, layer types, experts).
:func:`keep_width_relations` then carries each changed width and image side over to the fields that
held the same value anywhere in the config tree (projection sizes, channel lists, feature-map sides).
Fields derived from those follow them: a field named as a width that held one of the config's widths
becomes the new width (any other ``*hidden_size`` / ``*intermediate_size`` field becomes WIDTH / FFN), lists of parts of the width keep summing to it, per-stage lists keep one entry per
stage, ``d_head`` and the rotary width (``rotary_dim``, multimodal ``mrope_section``) follow the new head
width, adapter feature-layer indices stay inside the shrunk tower, and counts the defaults leave unset
(vocabulary, head width, key/value heads, the experts, top-k and shared experts of a mixture, the window of
sliding-window layers, prediction length) get tiny values, and a forecaster's decoder start window
(``label_length``) stays within the context. Key/value head counts under any name (per side,
per layer) keep their ratio to the query heads, head lists stay powers of two, and spatial sizes stay
consistent with what the model cuts the image into: a shifted window no wider than the last stage's grid, a
grid that splits into num_windows windows or pixel-shuffles by scale_factor, one patch left at output_stride.
Compound-scaled convolution stacks (width and depth coefficients) and filter counts doubled per down-sampling
stage are kept small.

Where the generic rule cannot serve a family, :data:`FAMILY_OVERRIDES` sets fields by hand; each
entry says why.

Signal (:mod:`~hf_exporters.sweep.signal_check`): a tiny model must compute something a parity check can see.
:data:`INIT_FLOORS` raises the init scales a config spells too small for a tiny, untrained model (a tower
drawn at 1e-10, residual branches scaled by 1e-6) and :func:`calibrate_running_stats` gives batch
normalisations the statistics of the activations they see, as training would (left at mean 0 and variance 1,
a stack of convolutions drawn at the init scale shrinks the signal at each layer to 1e-28 and below).
"""

from __future__ import annotations

import copy
import math
from typing import Any

#: width every hidden size becomes (divisible by :data:`HEADS`; head_dim = WIDTH // HEADS)
WIDTH = 64
FFN = 128
HEADS = 4
HEAD_DIM = WIDTH // HEADS
LAYERS = 2
VOCAB = 256
POSITIONS = 128
EXPERTS = 4
#: a model whose tiny config still has more parameters than this is refused (tiny config stage)
MAX_PARAMETERS = 40_000_000

_WIDTH_KEYS = {
    "hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "dim", "d_embed", "model_dim",
    "word_embed_proj_dim", "embedding_size", "projection_dim", "encoder_hidden_size", "text_embed_dim",
    "vision_embed_dim", "hidden_dim_size", "proj_dim", "output_hidden_size", "classifier_proj_size",
    "d_inner_embed", "projection_hidden_size", "text_hidden_size", "vision_hidden_size", "emb_dim", "d_latents",
}
_FFN_KEYS = {
    "intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "d_ff", "hidden_dim",
    "decoder_intermediate_size", "ff_dim", "inner_dim", "feed_forward_size", "mlp_dim", "dim_feedforward",
    "encoder_ffn_size", "decoder_ffn_size",
}
_SMALL_FFN_KEYS = {"moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size", "moe_hidden_size", "expert_ffn_hidden_size"}
_LAYER_KEYS = {
    "num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
    "num_decoder_layers", "num_encoder_layers", "decoder_num_layers", "encoder_num_layers",
    "num_text_layers", "num_vision_layers", "encoder_num_hidden_layers", "decoder_num_hidden_layers",
    "pred_num_hidden_layers",
}
_HEAD_KEYS = {
    "num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "decoder_attention_heads",
    "decoder_num_attention_heads", "num_decoder_attention_heads", "encoder_num_attention_heads",
    "pred_num_attention_heads",
}
_KV_HEAD_KEYS = {"num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num", "decoder_num_key_value_heads", "encoder_num_key_value_heads"}
_VOCAB_KEYS = {"vocab_size", "text_vocab_size", "decoder_vocab_size", "target_vocab_size", "src_vocab_size", "tgt_vocab_size", "n_words"}
_POSITION_KEYS = {"max_position_embeddings", "n_positions", "max_target_positions", "n_ctx", "max_seq_len", "max_sequence_length"}
_EXPERT_KEYS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts", "zero_expert_num"}
_TOPK_KEYS = {"num_experts_per_tok", "moe_topk", "top_k", "num_selected_experts", "moe_k", "top_k_experts", "num_experts_per_token"}
#: multi-head latent attention (DeepSeek-V2/V3 and descendants)
_MLA = {"kv_lora_rank": 32, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "qk_head_dim": 16}

#: codebook entries of the tiny image tokenizers (VQ models that turn an image into vocabulary tokens)
CODEBOOK = 64


def _chameleon_vocabulary_map() -> dict[str, int]:
    """Image token and codebook entries of the tiny vocabulary, named as the Chameleon tokenizer names them
    (``IMGIMG`` + the entry's digits spelled ``A``-``J`` + ``Z``), at the top of the vocabulary."""
    spelled = {str(i): chr(ord("A") + i) for i in range(10)}
    entries = {"IMGIMG" + "".join(spelled[c] for c in str(i)) + "Z": VOCAB - 1 - CODEBOOK + i for i in range(CODEBOOK)}
    return {"<image>": VOCAB - 1, **entries}


def _emu3_vocabulary_map() -> dict[str, int]:
    """Image, end-of-line and codebook tokens of the tiny vocabulary, named as the Emu3 tokenizer names them."""
    entries = {f"<|visual token{i:06d}|>": VOCAB - 2 - CODEBOOK + i for i in range(CODEBOOK)}
    return {"<image>": VOCAB - 1, "<|extra_200|>": VOCAB - 2, **entries}


def _intraclass_block() -> dict[str, list[Any]]:
    """(kernel, stride, padding) of each convolution of an intra-class block: long vertical, horizontal and
    square kernels of three lengths, each padded to keep the feature map's size (their outputs are summed)."""
    block: dict[str, list[Any]] = {"reduce_channel": [1, 1, 0], "return_channel": [1, 1, 0]}
    for ratio, k in (("longratio", 7), ("midratio", 5), ("shortratio", 3)):
        block[f"vertical_long_to_small_conv_{ratio}"] = [[k, 1], 1, [k // 2, 0]]
        block[f"horizontal_small_to_long_conv_{ratio}"] = [[1, k], 1, [0, k // 2]]
        block[f"symmetric_conv_long_{ratio}"] = [k, 1, k // 2]
    return block


def _text_line_blocks() -> list[list[list[Any]]]:
    """The PP-LCNetV3 backbone's default blocks (kernel, in, out, stride, squeeze-excitation) with a text-line
    recogniser's strides: after the stem, the height halves three times (``[2, 1]``) and the width once
    (``[1, 2]``), so a 48-pixel line leaves 3 rows (the defaults halve both sides at every stage, for detection)."""
    return [
        [[3, 16, 32, 1, False]],
        [[3, 32, 64, 1, False], [3, 64, 64, 1, False]],
        [[3, 64, 128, [2, 1], False], [3, 128, 128, 1, False]],
        [[3, 128, 256, [1, 2], False]] + [[5, 256, 256, 1, False]] * 4,
        [[5, 256, 512, [2, 1], True], [5, 512, 512, 1, True], [5, 512, 512, [2, 1], False], [5, 512, 512, 1, False]],
    ]


class _Derived:
    def __repr__(self) -> str:
        return "DERIVED"


#: an override value that removes the field: a value the config class derives from other fields when it is not
#: passed (``to_dict()`` passes the full-size derived value back, which the class then keeps)
DERIVED = _Derived()


class Replace:
    """An override value set as a whole, not merged key by key into the default (a sub-config of another kind)."""

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Replace({self.value!r})"


def _resnet_backbone(out_indices: list[int]) -> Replace:
    """A tiny transformers ResNet backbone (four one-block stages, 16 to 64 channels) in place of the DETR
    family's default timm ResNet-50: timm needs torchvision, whose PyPI build links the CUDA torch libraries
    and does not load against the CPU torch this project pins. ``out_indices``: the stages the model reads."""
    return Replace(
        {
            "model_type": "resnet",
            "embedding_size": 16,
            "hidden_sizes": [16, 32, 48, 64],
            "depths": [1, 1, 1, 1],
            "layer_type": "basic",
            "out_indices": out_indices,
        }
    )


#: PP-LCNetV4 stage widths of the tiny text detectors' backbone
_DETECTION_WIDTHS = [16, 32, 48, 64]


def _detection_backbone() -> dict[str, Any]:
    """A tiny PP-LCNetV4 backbone laid out for a text detector: every stage after the first halves both sides
    (the feature pyramid's necks upsample each level by 2 onto the one before), all four stages are outputs, and
    every other stage's second block has squeeze-excitation (both block kinds run). Its derived fields
    (``stage_out_channels``, ``depths``, ``stage_names``) are left to the config class."""
    w = _DETECTION_WIDTHS
    blocks = [[[3, w[0], w[0], 1, False]]]
    blocks += [[[3, w[i - 1], w[i], 2, False], [3, w[i], w[i], 1, i % 2 == 1]] for i in range(1, len(w))]
    return {
        "block_configs": blocks,
        "stem_channels": [3, w[0], w[0]],
        "out_features": [f"stage{i}" for i in range(1, len(w) + 1)],
        "out_indices": list(range(1, len(w) + 1)),
        **dict.fromkeys(("stage_out_channels", "depths", "stage_names"), DERIVED),
    }


#: the init scale of the families whose outputs come out of stacks of layers with no normalisation between them
_HEAD_INIT = 0.1
_HEAD_INIT_REASON = (
    "signal: the outputs come through stacks of linear or convolution layers with no normalisation between them"
    " (mask decoders' hypernetwork and IoU heads, audio decoders); drawn at 0.02, each layer of the tiny width (64)"
    " has a gain of about 0.16, so the outputs end below the signal floor (sweep.signal_check); at 0.1 they carry"
    " signal"
)

#: the Mamba time-step range of the Zamba families, and why (see :data:`RECURRENT_STATE_INIT`)
_ZAMBA_TIME_STEPS = {"time_step_min": 0.1, "time_step_max": 1.0, "time_step_floor": 0.01}
_ZAMBA_TIME_STEPS_REASON = (
    "signal: the state of a Mamba mixer grows with its time steps, which Zamba draws from [0.001, 0.1]; at that range"
    " the state stays below the signal floor (sweep.signal_check) however the weights are drawn, at [0.1, 1.0] it is"
    " above 0.03"
)

#: model_type -> (fields to set after the generic rule, why the generic rule cannot serve the family)
FAMILY_OVERRIDES: dict[str, tuple[dict[str, Any], str]] = {
    **{
        model_type: (
            {"backbone_config": _resnet_backbone(out_indices)},
            "the default backbone is timm's ResNet-50, and timm cannot be installed next to the CPU torch build"
            " (its torchvision dependency loads the CUDA libraries); a transformers ResNet takes its place",
        )
        for model_type, out_indices in (
            ("detr", [1, 2, 3, 4]),
            ("conditional_detr", [1, 2, 3, 4]),
            ("table-transformer", [1, 2, 3, 4]),
            ("dab-detr", [1, 2, 3, 4]),
            ("deformable_detr", [2, 3, 4]),
        )
    },
    "zamba": (
        {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"],
         "attention_hidden_size": 2 * WIDTH, "attention_head_dim": 2 * WIDTH // HEADS, **_ZAMBA_TIME_STEPS},
        "the hybrid layers share one attention block whose weights are tied from the first hybrid layer to the"
        " others: keeping one layer of each kind leaves no layer to tie into, which the model rejects; that block"
        " reads the hidden states concatenated with the embeddings, twice the width. " + _ZAMBA_TIME_STEPS_REASON
        + " (its state leaves were 6.6e-7 at the common init, 2.6e-3 at the recurrent-state init)",
    ),
    "whisper": (
        {"max_source_positions": 32},
        "the encoder requires exactly 2 * max_source_positions input frames; 32 keeps the inputs small",
    ),
    "paddleocr_vl_text": (
        {"rope_parameters": {"mrope_section": [2, 3, 3]}},
        "the model reads mrope_section with a full-size code default and the config class does not declare it",
    ),
    "ernie4_5_vl_moe_text": (
        {"rope_parameters": {"mrope_section": [3, 3, 2]}},
        "the height and width sections must be equal (their frequencies interleave), which the 2:3:3 split is not",
    ),
    "fun_asr_nano": (
        {"adaptor_config": {"intermediate_size": WIDTH // 4}},
        "the config checks the adaptor's intermediate_size against text hidden_size // 4",
    ),
    "layoutlmv3": (
        {"coordinate_size": 12, "shape_size": 8, "input_size": 64},
        "the four coordinate and two shape embeddings are concatenated to the hidden size (4 * 12 + 2 * 8 = 64);"
        " input_size is the image side, which no generic rule knows by that name",
    ),
    "lilt": (
        {"hidden_size": 48},
        "the six layout embeddings of hidden_size // 6 each are concatenated back to the hidden size: it must divide by 6",
    ),
    "dbrx": (
        {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
        "the attention reads rope_theta from the attention sub-config, whose class does not declare it, and"
        " clamps the projections with clip_qkv, whose unset default it passes on as both bounds",
    ),
    "moonshine_streaming": (
        {"num_key_value_heads": HEADS},
        "the decoder reads num_key_value_heads, which the config class does not declare (one per query head)",
    ),
    "t5gemma2_text": (
        {"dropout_rate": 0.0},
        "the MLP reads dropout_rate, which only the encoder-decoder config sets on its text config",
    ),
    "gemma2": (
        {"sliding_window": 4},
        "the default window (4096 tokens) is wider than the sweep's inputs, so the sliding-window layers would"
        " never drop a token; a window of 4 makes them slide, in the model and in the cache it returns",
    ),
    "lfm2": (
        {"layer_types": ["conv", "full_attention"]},
        "the default config makes every layer attention (full_attn_idxs defaults to every layer), where LFM2"
        " checkpoints mix short-convolution and attention layers; one of each keeps the hybrid model and its cache",
    ),
    "lfm2_moe": (
        {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
        "the config has no default layer_types (the kinds are family names); one dense layer keeps a sparse one",
    ),
    "deepseek_ocr2_text": (
        {"mlp_layer_types": ["dense", "sparse"]},
        "the config has no default mlp_layer_types; one dense and one sparse layer",
    ),
    "qwen4_exp_text": (
        {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": HEAD_DIM, "indexer_budget": 8, "indexer_compress_ratio": 4},
        "the indexed attention builds its indexer from fields the defaults leave unset; the config requires one"
        " key/value head, a budget divisible by the compress ratio and an index head as wide as the rotary part",
    ),
    "chameleon": (
        {"vocabulary_map": _chameleon_vocabulary_map(), "image_token_id": VOCAB - 1, "vq_config": {"num_embeddings": CODEBOOK}},
        "the defaults leave the tokenizer's vocabulary map unset; the model maps codebook entries to vocabulary"
        " tokens through it, so the tiny codebook gets tokens of the tiny vocabulary",
    ),
    "emu3": (
        {"vocabulary_map": _emu3_vocabulary_map(), "image_token_id": VOCAB - 1, "vq_config": {"codebook_size": CODEBOOK}},
        "the defaults leave the tokenizer's vocabulary map unset; the model maps codebook entries to vocabulary"
        " tokens through it, so the tiny codebook gets tokens of the tiny vocabulary",
    ),
    "qwen2_5_omni_thinker": (
        {"vision_start_token_id": VOCAB - 1 - (151652 % 32)},
        "get_rope_index reads vision_start_token_id, which the thinker config class does not declare; the"
        " checkpoints' id (151652), mapped into the tiny vocabulary as every other token id",
    ),
    "qwen3_omni_moe_thinker": (
        {"vision_start_token_id": VOCAB - 1 - (151652 % 32)},
        "get_rope_index reads vision_start_token_id, which the thinker config class does not declare; the"
        " checkpoints' id (151652), mapped into the tiny vocabulary as every other token id",
    ),
    "esm": (
        {"pad_token_id": 1, "mask_token_id": 32},
        "the defaults leave pad_token_id unset; the embeddings derive position ids from the padding token",
    ),
    "granite4_vision": (
        {"downsample_rate": "1/2", "deepstack_layer_map": [[0, 0], [-1, 1]], "spatial_target_layers": [0, 0, 1, 1]},
        "the defaults leave the projector's downsample rate and vision-to-text layer map unset, and the spatial"
        " target layers index the full-size text model",
    ),
    "cohere_compass_text": (
        {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
        "the rotary parameters are keyed by layer type and the defaults leave them empty",
    ),
    "gemma3n_text": (
        {
            "num_hidden_layers": 4,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "num_kv_shared_layers": 2,
            "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0],
            "intermediate_size": FFN,
        },
        "the last num_kv_shared_layers layers reuse the cache of an earlier layer of each kind: two layers of"
        " each kind, the second pair sharing",
    ),
    "pp_ocrv6_medium_det": (
        {"intraclass_block_config": _intraclass_block(), "backbone_config": _detection_backbone(), "scale_factor_list": [1, 2, 4, 8]},
        "the defaults leave the intra-class block's convolutions and the levels' upsampling factors unset, and"
        " their backbone is the recogniser's (one output stage, heights halved only) where the neck fuses four"
        " stages, each half the one before (so each level is upsampled by 2 ** level onto the first)",
    ),
    "pp_ocrv6_small_det": (
        {"backbone_config": _detection_backbone(), "layer_list_out_channels": _DETECTION_WIDTHS},
        "the defaults' backbone is the recogniser's (one output stage, heights halved only) where the neck fuses"
        " four stages, each half the one before, reading layer_list_out_channels channels from each",
    ),
    "pp_ocrv5_server_det": (
        {"intraclass_block_config": _intraclass_block(), "scale_factor_list": [1, 2, 4, 8]},
        "the defaults leave the intra-class block's convolutions and the levels' upsampling factors unset (the"
        " neck's four levels are each half the one before, so each is upsampled by 2 ** level onto the first)",
    ),
    "clap_audio_model": (
        {"patch_embeds_hidden_size": WIDTH // 8},
        "the audio tower doubles patch_embeds_hidden_size at each of its four stages and its projection reads"
        " hidden_size: the two keep hidden_size = 8 * patch_embeds_hidden_size",
    ),
    "dac": (
        {"encoder_hidden_size": 8},
        "the encoder doubles encoder_hidden_size at each of its down-sampling stages (64 -> 1024 channels)",
    ),
    "seamless_m4t": (
        {"unit_embed_dim": WIDTH, "lang_embed_dim": 16, "spkr_embed_dim": 16, "upsample_initial_channel": WIDTH},
        "the vocoder's unit, language and speaker embeddings and its first up-sampling width are named as no generic rule knows",
    ),
    "seamless_m4t_v2": (
        {"unit_embed_dim": WIDTH, "lang_embed_dim": 16, "spkr_embed_dim": 16, "upsample_initial_channel": WIDTH},
        "the vocoder's unit, language and speaker embeddings and its first up-sampling width are named as no generic rule knows",
    ),
    "align_vision_model": (
        {"hidden_dim": 2, "initializer_range": 0.3},
        "hidden_dim is only the pooler's kernel size; one larger than the (2 x 2) last feature map of the tiny image"
        " pools past its edge, which gives undefined values. The convolutions of few channels, drawn at the default"
        " 0.02 spread, shrink the activations 1e4-fold per stage until the normalised image embedding is inf",
    ),
    "lw_detr": (
        {"projector_scale_factors": [1.0], "projector_in_channels": [WIDTH], "num_feature_levels": 1},
        "the defaults leave the feature pyramid without levels, so the decoder gets no features at all",
    ),
    "bamba": (
        {"attn_layer_indices": [1]},
        "the default config has no attention layer (every layer Mamba), and then eager generate() fails in the"
        " model's own code (get_seq_length on a cache of recurrent layers only); one attention layer keeps both"
        " kinds, as the released checkpoints have",
    ),
    "granitemoehybrid": (
        {"layer_types": ["linear_attention", "full_attention"]},
        "the default config has no attention layer (every layer Mamba), and then eager generate() fails in the"
        " model's own code (get_seq_length on a cache of recurrent layers only); one attention layer keeps both"
        " kinds, as the released checkpoints have",
    ),
    "recurrent_gemma": (
        {"num_hidden_layers": 3},
        "the block pattern (recurrent, recurrent, attention) repeats over the layers: two layers would keep no"
        " attention layer, and eager generate() then fails in the model's own code",
    ),
    "zamba2": (
        {"attention_hidden_size": 2 * WIDTH, "attention_head_dim": 2 * WIDTH // HEADS, "mamba_headdim": 2 * WIDTH // 8, "kv_channels": HEAD_DIM,
         "num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"], "hybrid_layer_ids": [1, 2],
         **_ZAMBA_TIME_STEPS},
        "the config derives these widths from hidden_size, then sets the full-size values to_dict() passes back;"
        " as for zamba, the shared attention block is tied across hybrid layers, so two of them are kept. "
        + _ZAMBA_TIME_STEPS_REASON + " (its state leaves were 8.2e-6 at the common init, 6.0e-3 at the recurrent-state init)",
    ),
    "bros": (
        {"dim_bbox_projection": HEAD_DIM},
        "the projected box embedding is added to each attention head: its width is the head width",
    ),
    "step3p5": (
        {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4, "num_sliding_attention_heads": HEADS,
         "mlp_layer_types": ["dense", "sparse"]},
        "the model builds a sliding-window mask whatever the layer kinds, and the defaults give every layer full"
        " attention and no window; the tiny model keeps one layer of each attention and MLP kind",
    ),
    "tvp": (
        {"max_img_size": 64, "visual_prompt_size": 8},
        "the visual prompt is a mask of max_img_size pixels a side laid over the frames: the tiny frame's side",
    ),
    "depth_pro": (
        {"patch_size": 16, **{f"{k}_model_config": {"patch_size": 8} for k in ("image", "patch", "fov")}},
        "the image is cut into patch_size-pixel crops at a quarter of its side and each crop is a sub-model's"
        " image (the config sets their image_size to it): 16-pixel crops of 8-pixel patches for a 64-pixel image",
    ),
    "efficientloftr": (
        {
            "rope_parameters": {"partial_rotary_factor": HEADS / 2},
            **dict.fromkeys(("stage_block_out_channels", "stage_block_in_channels", "fine_fusion_dims"), DERIVED),
        },
        "the 2-D rotary table is hidden_size // 2 wide, half of it per image axis: head_dim * partial_rotary_factor"
        " must stay hidden_size / 2, so the factor is half the head count (4.0 for the defaults' 8 heads); the"
        " per-block channel lists and fusion widths are derived from out_features",
    ),
    "pp_ocrv5_mobile_rec": (
        {"backbone_config": {"block_configs": _text_line_blocks()}},
        "the config's default backbone is the detection one, which cuts a 48-pixel text line to 2 rows; the model"
        " pools the last feature map with a (3, 2) window, which needs the recogniser's 3 rows",
    ),
    "uvdoc": (
        {"backbone_config": {"out_features": [f"stage{i}" for i in range(1, 7)], "out_indices": list(range(1, 7))}},
        "the head concatenates the outputs of all six bridge stages (bridge_connector reads six times its width),"
        " and the backbone's defaults output the last stage only",
    ),
    "xcodec": (
        {"codebook_dim": DERIVED, "initializer_range": _HEAD_INIT},
        "the codebook is as wide as the acoustic and semantic hidden sizes together, which the config derives when"
        " codebook_dim is not passed. " + _HEAD_INIT_REASON + " (with its codebooks calibrated, the decoded audio"
        " still moved 2e-3 at most with the input)",
    ),
    "xcodec2": (
        {"quantization_dim": 2 * WIDTH, "initializer_range": _HEAD_INIT},
        "the quantizer projects the acoustic and semantic features concatenated: quantization_dim is hidden_size"
        " plus the semantic model's hidden size, both WIDTH in the tiny config. " + _HEAD_INIT_REASON
        + " (the decoder's waveform was exactly 0 at 0.02)",
    ),
    "neucodec": (
        {"quantization_dim": 2 * WIDTH, "initializer_range": _HEAD_INIT},
        "the quantizer projects the acoustic and semantic features concatenated: quantization_dim is hidden_size"
        " plus the semantic model's hidden size, both WIDTH in the tiny config. " + _HEAD_INIT_REASON
        + " (the decoder's waveform was exactly 0 at 0.02)",
    ),
    **{
        model_type: (
            {"mask_decoder_config": {"initializer_range": _HEAD_INIT}, "detr_decoder_config": {"initializer_range": _HEAD_INIT}},
            f"{_HEAD_INIT_REASON} (the DETR decoder's presence logits and the mask decoder's masks: {what})",
        )
        for model_type, what in (
            ("sam3", "6.4e-4 and 8.3e-3 at most, and the masks did not move with the image"),
            ("sam3_lite_text", "2.3e-3 and 6.6e-3 at most, and the masks did not move with the image"),
        )
    },
    "kosmos-2": (
        {"text_config": {"init_std": _HEAD_INIT}},
        "signal: the image embeddings are the latent queries' cross-attention over the projected image features,"
        " two projections drawn at the text model's init_std with no normalisation between them; at 0.02 they were"
        " 8.6e-3 at most, below the signal floor (sweep.signal_check); at 0.1 they are 0.5",
    ),
    "clvp_encoder": (
        {"num_attention_heads": 2},
        "the rotary part of each head is at least 32 wide whatever the head width: two heads of 32",
    ),
    "deberta-v2": (
        {"position_buckets": 16},
        "relative position buckets must not exceed max_position_embeddings after shrinking",
    ),
    **{
        model_type: ({"initializer_range": _HEAD_INIT}, f"{_HEAD_INIT_REASON} ({what})")
        for model_type, what in (
            ("sam", "the mask decoder's masks were 6e-4 at most and its IoU scores moved 8e-4 with the image"),
            ("sam_hq", "the masks were 3e-3 at most and the IoU scores moved 8e-4 with the image"),
            ("sam2", "the masks were 5e-4 at most and the IoU scores moved 7e-5 with the image"),
            ("sam3_vision_model", "the first feature-pyramid level was 1.5e-3 at most"),
            ("sam3_tracker", "the masks were 6e-4 at most and the IoU scores did not move with the image"),
            ("vibevoice_acoustic_tokenizer", "the decoded audio was 2e-5 at most"),
            ("vibevoice_acoustic_tokenizer_decoder", "the decoded audio was 1.3e-4 at most"),
            ("vibevoice_acoustic_tokenizer_encoder", "the latents were 1.4e-3 at most"),
            ("lightglue", "the matching scores were 5e-5 at most"),
            ("superglue", "the matching scores were 3.8e-4 at most"),
            ("pp_doclayout_v4", "the reading-order logits were 3e-3 at most"),
            ("fastspeech2_conformer_hifigan", "the vocoder's waveform was 2e-3 at most"),
            ("nemotron3_diarization", "the speaker logits of Nemotron 3.5 Transcribe's diarization head were 5e-3 at most"),
            *((vision, "the patch merger's pooled output was 4e-3 at most") for vision in (
                "glm4v_vision", "glm4v_moe_vision", "glm5_next_vision", "glm_ocr_vision")),
            ("pe_audio_encoder", "the encoder's output moved 4e-3 at most with the audio"),
            ("qwen3_asr_encoder", "the encoder's output moved 9e-3 at most with the audio"),
            ("nemotron3_5_asr", "the transducer's logits were 2e-3 at most"),
        )
    },
}


_NAMED = _WIDTH_KEYS | _FFN_KEYS | _SMALL_FFN_KEYS | _LAYER_KEYS | _HEAD_KEYS | _KV_HEAD_KEYS | _VOCAB_KEYS | _POSITION_KEYS | set(_MLA)

#: the split of the multimodal rotary sections (temporal, height, width) a config gets when its class
#: leaves ``mrope_section`` to the model's code default
_MROPE_RATIO = [2, 3, 3]


def _is_subconfig(value: Any) -> bool:
    return isinstance(value, dict) and "model_type" in value


def _scale_list(values: list[Any], target_first: int) -> list[Any]:
    """A list of widths scaled so its first entry is ``target_first``, keeping the ratios between entries."""
    first = values[0] or 1
    return [max(1, int(round(v * target_first / first))) for v in values]


def _merge(fields: dict[str, Any], changes: dict[str, Any]) -> None:
    """``changes`` set into ``fields``, dictionaries (sub-configs, rope parameters) merged key by key; a field set
    to :data:`DERIVED` is removed, a :class:`Replace` value set as a whole."""
    for key, value in changes.items():
        if value is DERIVED:
            fields.pop(key, None)
        elif isinstance(value, Replace):
            fields[key] = copy.deepcopy(value.value)
        elif isinstance(value, dict) and isinstance(fields.get(key), dict):
            _merge(fields[key], value)
        else:
            fields[key] = copy.deepcopy(value)


def _split(values: list[int], total: int) -> list[int]:
    """``values`` scaled to positive integers that sum to ``total``, keeping their ratios as far as rounding allows."""
    whole = sum(values) or 1
    exact = [v * total / whole for v in values]
    parts = [max(1, int(x)) for x in exact]
    by_remainder = sorted(range(len(values)), key=lambda i: parts[i] - exact[i])
    i = 0
    while sum(parts) != total:
        j = by_remainder[i % len(parts)]
        if sum(parts) < total:
            parts[j] += 1
        elif parts[j] > 1:
            parts[j] -= 1
        i += 1
    return parts


def _old_widths(fields: dict[str, Any]) -> set[int]:
    """Every value a width field has anywhere in the config (sub-configs included), before shrinking."""
    found: set[int] = set()
    for key, value in fields.items():
        if isinstance(value, dict):
            found |= _old_widths(value)
        elif key in _WIDTH_KEYS and isinstance(value, int) and not isinstance(value, bool) and value > WIDTH:
            found.add(value)
    return found


def _follows_width(key: str) -> bool:
    """Whether a field not named in the tables is, by its name, a width another module must match."""
    if key in _NAMED or key.startswith(("num_", "n_")):
        return False
    if any(part in key for part in ("head", "rope", "lora", "vocab", "window", "patch", "kernel", "codebook_size", "feature_size")):
        return False
    return "hidden" in key or key.endswith(("_dim", "_input_size", "_groups"))


def _reads_mrope_default(model_type: Any) -> bool:
    """Whether the config class of ``model_type`` takes a ``mrope_section`` its model reads with a code default."""
    from transformers import CONFIG_MAPPING

    try:
        config_class = CONFIG_MAPPING[model_type]
    except (KeyError, TypeError):
        return False
    return "mrope_section" in getattr(config_class, "ignore_keys_at_rope_validation", ())


def _clamp_layers(value: int | list[int]) -> int | list[int]:
    """Indices of tower layers (feature layers taken by an adapter) valid for a tower of :data:`LAYERS`
    layers, keeping their order; negative ones count from the end."""
    values = [value] if isinstance(value, int) else list(value)
    ranks = {v: i for i, v in enumerate(sorted(v for v in values if v >= 0))}
    out = [min(ranks[v], LAYERS - 1) if v >= 0 else max(v, -LAYERS) for v in values]
    return out[0] if isinstance(value, int) else out


def _layer_selection(layer_types: list[Any]) -> list[int]:
    """Indices of the first layer of each kind, at least :data:`LAYERS` of them."""
    chosen: list[int] = []
    seen = set()
    for i, kind in enumerate(layer_types):
        key = repr(kind)
        if key not in seen:
            seen.add(key)
            chosen.append(i)
    for i in range(len(layer_types)):
        if len(chosen) >= LAYERS:
            break
        if i not in chosen:
            chosen.append(i)
    return sorted(chosen)


def shrink(fields: dict[str, Any], widths: set[int] | None = None) -> dict[str, Any]:
    """The generic rule on one level of a config's ``to_dict()`` (sub-configs recursively).

    ``widths``: the widths of the whole config before shrinking (default: those of ``fields``); a field
    that by its name is a width and held one of them follows the width (it must match that module).
    """
    d = copy.deepcopy(fields)
    widths = _old_widths(fields) if widths is None else widths
    old_heads = next((d[k] for k in (*_HEAD_KEYS, "num_heads") if isinstance(d.get(k), int) and d[k] > 0), None)
    old_layers = next((d[k] for k in _LAYER_KEYS if isinstance(d.get(k), int) and d[k] > 0), None)
    old_width = next((d[k] for k in ("hidden_size", "d_model", "n_embd") if isinstance(d.get(k), int) and d[k] > 0), None)
    old_width = old_width or 0
    old_head_dim = d["head_dim"] if isinstance(d.get("head_dim"), int) else (old_width // old_heads if old_width and old_heads else None)
    if isinstance(d.get("depths"), list) and len(d["depths"]) == old_layers:
        old_layers = None  # the layer count is the stage count: per-stage lists keep their length, depths shrink

    # layers: keep one layer of each kind in layer_types (and per-layer lists in step)
    selection: list[int] | None = None
    kinds_key = next((k for k in ("layer_types", "layers_block_type") if isinstance(d.get(k), list) and d[k]), None)
    if kinds_key is not None:
        selection = _layer_selection(d[kinds_key])
    elif old_layers:
        selection = list(range(min(old_layers, LAYERS)))
    for key in _LAYER_KEYS:
        if isinstance(d.get(key), int) and d[key] > 0 and selection is not None:
            d[key] = len(selection) if d[key] == old_layers else min(d[key], LAYERS)
    if selection is not None and old_layers:
        for key, value in list(d.items()):
            if isinstance(value, list) and len(value) == old_layers and key not in ("hidden_sizes", "depths"):
                d[key] = [value[i] for i in selection if i < len(value)]
    if isinstance(d.get("first_k_dense_replace"), int):
        d["first_k_dense_replace"] = min(d["first_k_dense_replace"], 1)
    # layer kinds placed by period and offset (layer i is of the kind when i % period == offset):
    # an offset past the shrunk depth would drop the kind, so the last layer becomes the one of that kind
    depth = next((d[k] for k in _LAYER_KEYS if isinstance(d.get(k), int) and d[k] > 0), None)
    for key in [k for k in d if k.endswith("_layer_period")]:
        offset_key = key[: -len("period")] + "offset"
        period, offset = d.get(key), d.get(offset_key)
        if depth and isinstance(period, int) and isinstance(offset, int) and period > 0 and (offset >= depth or period > depth):
            d[key], d[offset_key] = depth, depth - 1

    for key, value in list(d.items()):
        if isinstance(value, bool) or value is None:
            continue
        if _is_subconfig(value):
            d[key] = shrink(value, widths)
            if value.get("model_type") in FAMILY_OVERRIDES:
                _merge(d[key], FAMILY_OVERRIDES[value["model_type"]][0])
        elif key in _WIDTH_KEYS and isinstance(value, int) and value > WIDTH:
            d[key] = WIDTH
        elif key in _FFN_KEYS and isinstance(value, int) and value > FFN:
            d[key] = FFN
        elif key in _SMALL_FFN_KEYS and isinstance(value, int) and value > 32:
            d[key] = 32
        elif key in _HEAD_KEYS and isinstance(value, int) and value > HEADS:
            d[key] = HEADS
        elif key in _VOCAB_KEYS and isinstance(value, int) and value > VOCAB:
            d[key] = VOCAB
        elif key in _POSITION_KEYS and isinstance(value, int) and value > POSITIONS:
            d[key] = POSITIONS
        elif key == "max_source_positions" and isinstance(value, int) and value > 64:
            d[key] = 64
        elif key in _EXPERT_KEYS and isinstance(value, int) and value > EXPERTS:
            d[key] = EXPERTS
        elif key in _TOPK_KEYS and isinstance(value, int) and value > 2:
            d[key] = 2
        elif key in _MLA and isinstance(value, int) and value > 0:  # a zero dim selects a path (no rotary part)
            d[key] = _MLA[key]
        elif key == "head_dim" and isinstance(value, int) and value > HEAD_DIM:
            d[key] = HEAD_DIM
        elif key in ("hidden_sizes", "embed_dims", "conv_dim", "dims", "hidden_dims", "neck_hidden_sizes") and isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            d[key] = _scale_list(value, 16) if key != "conv_dim" else [32] * len(value)
        elif key == "depths" and isinstance(value, list) and all(isinstance(v, int) for v in value):
            d[key] = [1] * len(value)
        elif key == "num_heads" and isinstance(value, list) and all(isinstance(v, int) for v in value):
            # a power of two: it divides the stage widths whether they double per stage or stay the same
            d[key] = [1 << (min(v, 2**i).bit_length() - 1) if v > 0 else v for i, v in enumerate(value)]
        elif key == "num_heads" and isinstance(value, int) and value > HEADS:
            d[key] = HEADS
        elif key == "image_size":
            patch = d.get("patch_size")
            patch = patch[0] if isinstance(patch, (list, tuple)) else patch
            side = max(2 * patch, 32) if isinstance(patch, int) and patch > 0 else 64
            if isinstance(value, int) and value > side:
                d[key] = side
            elif isinstance(value, (list, tuple)) and all(isinstance(v, int) and v > side for v in value):
                d[key] = [side] * len(value)
        elif key.endswith("hidden_size") and key not in _NAMED and isinstance(value, int) and value > WIDTH:
            d[key] = WIDTH  # a width by its name (output, projector or decoder width)
        elif key.endswith(("intermediate_size", "ffn_hidden_size")) and key not in _NAMED and isinstance(value, int) and value > FFN:
            d[key] = 32 if "expert" in key else FFN  # a feed-forward width by its name
        elif key == "base_channels" and isinstance(value, int) and value > 32:
            d[key] = 32  # the stage widths are base_channels times a multiplier; 32 keeps group norms of 32 groups
        elif key == "num_conv_pos_embeddings" and isinstance(value, int) and value > 16:
            d[key] = 16
        elif key.endswith(("_token_id", "_token_index")) and isinstance(value, int) and value >= VOCAB:
            d[key] = VOCAB - 1 - (value % 32)
        elif key.endswith(("vocab_size", "_vocab")) or key.startswith("vocab_size"):
            if isinstance(value, int) and value > VOCAB:
                d[key] = VOCAB
        elif isinstance(value, int) and value in widths and _follows_width(key):
            d[key] = WIDTH
        elif isinstance(value, (list, tuple)) and len(value) > 1 and all(isinstance(v, int) and not isinstance(v, bool) for v in value) and sum(value) == old_width and old_width > WIDTH:
            d[key] = _split(list(value), WIDTH)  # parts of the width (axial embeddings) keep summing to it
        elif key.endswith(("_features", "_channels")) and isinstance(value, list) and value and all(isinstance(v, int) for v in value) and value[-1] == old_width and old_width > WIDTH:
            d[key] = _scale_list(value[::-1], WIDTH)[::-1]  # stage widths ending at the model width end at the new one
        elif ("feature_layer" in key or key.endswith("hook_ids")) and (isinstance(value, int) or (isinstance(value, list) and all(isinstance(v, int) for v in value))):
            d[key] = _clamp_layers(value)

    # fields derived from the depth: regenerated by the config class from the new depth
    if selection is not None and old_layers and len(selection) != old_layers:
        for key in ("out_features", "out_indices", "stage_names"):
            d.pop(key, None)
        kept = set(range(len(selection)))
        for key, value in list(d.items()):
            if isinstance(value, dict) and value and all(str(k).lstrip("-").isdigit() for k in value):
                d[key] = {k: v for k, v in value.items() if int(k) in kept}
    # state-space blocks: heads * head_dim must equal expand * hidden_size
    width = d.get("hidden_size") if isinstance(d.get("hidden_size"), int) else None
    if width and isinstance(d.get("expand"), int) and isinstance(d.get("num_heads"), int) and isinstance(d.get("head_dim"), int):
        d["num_heads"] = max(1, width * d["expand"] // d["head_dim"])
    if width and isinstance(d.get("mamba_expand"), int) and isinstance(d.get("mamba_n_heads"), int):
        d["mamba_n_heads"] = HEADS
        d["mamba_d_head"] = width * d["mamba_expand"] // HEADS
    if width and isinstance(d.get("mamba_d_ssm"), int) and isinstance(d.get("mamba_expand"), int):
        d["mamba_d_ssm"] = width * d["mamba_expand"]  # the config checks heads * head width against it
    if isinstance(d.get("mamba_d_state"), int) and d["mamba_d_state"] > 16:
        d["mamba_d_state"] = 16

    # stage widths attended over by num_attention_heads heads stay divisible by it
    if isinstance(d.get("hidden_sizes"), list) and isinstance(d.get("num_attention_heads"), int) and d["num_attention_heads"] > 0:
        n = d["num_attention_heads"]
        d["hidden_sizes"] = [max(n, -(-v // n) * n) if isinstance(v, int) else v for v in d["hidden_sizes"]]
    # group normalisation over stage widths that shrank below the group count
    if isinstance(d.get("num_groups"), int) and isinstance(d.get("hidden_sizes"), list) and d.get("hidden_sizes") != fields.get("hidden_sizes"):
        d["num_groups"] = 1
    # compound-scaled convolution stacks: every channel count is scaled by width_coefficient (the last stage's
    # 320 channels become 64, the projection width) and every stage's block count by depth_coefficient; the
    # head width hidden_dim, a scaled channel count too, keeps its ratio to width_coefficient
    old_coefficient = fields.get("width_coefficient")
    if isinstance(old_coefficient, (int, float)) and old_coefficient > 0.2:
        d["width_coefficient"] = 0.2
        if isinstance(fields.get("hidden_dim"), int):
            divisor = d.get("depth_divisor") if isinstance(d.get("depth_divisor"), int) else 8
            d["hidden_dim"] = max(divisor, round(fields["hidden_dim"] * 0.2 / old_coefficient / divisor) * divisor)
    if isinstance(d.get("depth_coefficient"), (int, float)) and d["depth_coefficient"] > 0.1:
        d["depth_coefficient"] = 0.1
    # convolution stages doubling num_filters per down-sampling ratio: the widest stage stays within 512 channels
    ratios = d.get("downsampling_ratios") or d.get("upsampling_ratios")
    if isinstance(d.get("num_filters"), int) and isinstance(ratios, list) and d["num_filters"] << len(ratios) > 512:
        d["num_filters"] = max(1, 256 >> len(ratios))
    # a last stage at output_stride that still cuts its feature map into patch_size patches: at least one patch
    stride, patch, side = d.get("output_stride"), d.get("patch_size"), d.get("image_size")
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (stride, patch, side)) and side < stride * patch:
        d["image_size"] = stride * patch
    # shifted-window stages halving the patch grid: a window wider than the last stage's grid is clamped to
    # that grid by the model while its relative-position table keeps the configured width, so the window
    # becomes the last stage's side (at least 2, the image growing to give it)
    window, patch, side, depths = d.get("window_size"), d.get("patch_size"), d.get("image_size"), d.get("depths")
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (window, patch, side)) and isinstance(depths, list) and depths:
        last = (side // patch) >> (len(depths) - 1)
        if last < window:
            if last < 2:
                d["image_size"] = (2 * patch) << (len(depths) - 1)
                last = 2
            d["window_size"] = min(window, last)
    # square windows over the (smaller) image: the config checks image_size / num_windows against the window side
    if isinstance(d.get("num_windows"), int) and d["num_windows"] > 4:
        d["num_windows"] = 4
    if isinstance(d.get("num_windows_side"), int) and isinstance(d.get("num_windows"), int):
        d["num_windows_side"] = max(1, math.isqrt(d["num_windows"]))  # num_windows counts the windows of a square grid
    # ... and the patch grid splits into num_windows windows a side, each at least 2 patches wide
    windows, patch, side = d.get("num_windows"), _side(d.get("patch_size")), _side(d.get("image_size"))
    if isinstance(windows, int) and windows > 0 and patch and side and isinstance(d["image_size"], int):
        grid = side // patch
        if grid < 2 * windows or grid % windows:
            d["image_size"] = patch * windows * max(2, -(-grid // windows))
    # a vision tower whose patch grid is pixel-shuffled by scale_factor: the grid side divides by it
    scale = d.get("scale_factor")
    vision = d.get("vision_config") if isinstance(d.get("vision_config"), dict) else d
    if isinstance(scale, int) and not isinstance(scale, bool) and scale > 1:
        patch, side = _side(vision.get("patch_size")), _side(vision.get("image_size"))
        if patch and side and isinstance(vision["image_size"], int) and (side // patch) % scale:
            vision["image_size"] = patch * scale * max(1, -(-(side // patch) // scale))
    # grouped routing: the (fewer) experts still split into n_group groups, of which topk_group are kept
    for key in ("n_group", "num_expert_group"):
        if isinstance(d.get(key), int) and d[key] > 2:
            d[key] = 2
            if isinstance(d.get("topk_group"), int):
                d["topk_group"] = min(d["topk_group"], 1)
    # fields the defaults leave unset that the model needs
    if "vocab_size" in d and d["vocab_size"] is None:
        d["vocab_size"] = VOCAB
    kinds = d.get("layer_types") if isinstance(d.get("layer_types"), list) else []
    if "sliding_window" in d and d["sliding_window"] is None and any("sliding" in str(kind) for kind in kinds):
        d["sliding_window"] = 4  # sliding-window layers the defaults give no window: narrower than the inputs
    if "prediction_length" in d and d["prediction_length"] is None:
        d["prediction_length"] = 4
    # the decoder's start window is cut from the end of the context (which defaults to the prediction length)
    context = d.get("context_length") if isinstance(d.get("context_length"), int) else d.get("prediction_length")
    if isinstance(d.get("label_length"), int) and isinstance(context, int) and d["label_length"] > context:
        d["label_length"] = context
    # a mixture whose counts the defaults leave unset (the expert width declared, set or not)
    if any(k in d and (d[k] is None or isinstance(d[k], int)) for k in _SMALL_FFN_KEYS) and any(k in d for k in _EXPERT_KEYS):
        for key in _EXPERT_KEYS | _SMALL_FFN_KEYS:
            if key in d and d[key] is None:
                d[key] = EXPERTS if key in _EXPERT_KEYS else 32
    if any(isinstance(d.get(k), int) and d[k] > 0 for k in _EXPERT_KEYS):
        for key in _TOPK_KEYS:
            if key in d and d[key] is None:
                d[key] = 2
        if "n_shared_experts" in d and d["n_shared_experts"] is None:
            d["n_shared_experts"] = 1
    # query / key-value head ratio
    new_heads = next((d[k] for k in (*_HEAD_KEYS, "num_heads") if isinstance(d.get(k), int) and d[k] > 0), None)
    if old_heads and new_heads and "num_key_value_heads" in d and d["num_key_value_heads"] is None:
        d["num_key_value_heads"] = old_heads  # unset: one key/value head per query head, as the configs read it
    for key in _KV_HEAD_KEYS:
        kv = d.get(key)
        # the query heads of the same side (encoder_/decoder_) when the config names them apart
        side = key[: key.index("num_")] if key.startswith(("encoder_", "decoder_")) else ""
        pair = side + "num_attention_heads"
        old_q = fields.get(pair) if side and isinstance(fields.get(pair), int) else old_heads
        new_q = d.get(pair) if side and isinstance(d.get(pair), int) else new_heads
        if isinstance(kv, int) and kv > 0 and old_q and new_q:
            ratio = max(1, old_q // kv)
            new_kv = max(1, new_q // ratio)
            while new_q % new_kv:
                new_kv -= 1
            d[key] = new_kv
    # key/value head counts under other names (per layer, or per attention kind) keep the ratio as well
    for key, kv in list(d.items()):
        if key in _KV_HEAD_KEYS or "key_value" not in key or "head" not in key or not (old_heads and new_heads):
            continue
        values = kv if isinstance(kv, list) else [kv]
        if values and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            scaled = []
            for v in values:
                new_kv = max(1, new_heads // max(1, old_heads // v))
                while new_heads % new_kv:
                    new_kv -= 1
                scaled.append(new_kv)
            d[key] = scaled if isinstance(kv, list) else scaled[0]
    # an explicit head_dim smaller than WIDTH/HEADS stays; a missing one follows from the width
    new_width = next((d[k] for k in ("hidden_size", "d_model", "n_embd") if isinstance(d.get(k), int) and d[k] > 0), None)
    if "head_dim" in d and d["head_dim"] is None and new_width and new_heads and new_width % new_heads == 0:
        d["head_dim"] = new_width // new_heads  # unset: some models read it without deriving it from the width
    if isinstance(d.get("d_head"), int) and new_width and new_heads:
        d["d_head"] = new_width // new_heads  # the config checks d_head == d_model // n_head
    # multi-head latent attention: a head_dim equal to the rotary part of the query/key heads follows it
    if isinstance(d.get("qk_rope_head_dim"), int) and isinstance(d.get("head_dim"), int) and fields.get("head_dim") == fields.get("qk_rope_head_dim"):
        d["head_dim"] = d["qk_rope_head_dim"]
    head_dim = d["head_dim"] if isinstance(d.get("head_dim"), int) else (new_width // new_heads if new_width and new_heads else None)
    # a rotary part narrower than the head keeps its share of the (smaller) head, an even width
    if isinstance(d.get("rotary_dim"), int) and d["rotary_dim"] > 0 and old_head_dim and head_dim:
        d["rotary_dim"] = max(2, 2 * round(d["rotary_dim"] * head_dim / old_head_dim / 2))
    # multimodal rotary sections: (temporal, height, width) split of the rotary half of the head
    rope = d.get("rope_parameters")
    if isinstance(rope, dict) and head_dim and "rope_type" in rope:
        section = rope.get("mrope_section")
        if section is None and _reads_mrope_default(d.get("model_type")):
            section = _MROPE_RATIO
        if isinstance(section, list) and section and all(isinstance(v, int) for v in section):
            factor = rope.get("partial_rotary_factor") or d.get("partial_rotary_factor") or 1.0
            half = int(head_dim * factor) // 2
            if half >= len(section):  # each section keeps at least one frequency
                rope["mrope_section"] = _split(section, half)
    _shrink_query_counts(d)
    return d


def _shrink_query_counts(d: dict[str, Any]) -> None:
    """Object queries are picked by top-k among the tiny image's few feature positions: keep them fewer."""
    for key in ("num_queries", "num_select"):
        if isinstance(d.get(key), int) and not isinstance(d[key], bool) and d[key] > 16:
            d[key] = 16


# --- widths that must keep their relation to other widths -----------------------------------------
#: name parts of fields that hold a width (a channel count, an embedding or projection size)
_RELATED_PARTS = ("hidden", "dim", "channel", "width", "projection", "embed", "size")
#: name parts of fields that hold something else (spatial sizes, vocabularies, counts of things)
_UNRELATED_PARTS = (
    "image", "patch", "kernel", "window", "vocab", "position", "chunk", "bucket", "num_channels",
    "batch", "stride", "feature_size", "sample", "hop", "fft", "frame", "max_", "head", "layer", "group",
    "codebook", "expert", "rank", "seq", "length", "pad", "scale", "ratio", "input_channels", "in_chans",
)


def _is_width_field(key: str) -> bool:
    lower = key.lower()
    return any(p in lower for p in _RELATED_PARTS) and not any(p in lower for p in _UNRELATED_PARTS)


def _width_changes(original: dict[str, Any], shrunk: dict[str, Any], scalars: dict[int, int], lists: dict[int, int]) -> None:
    """Collects, over the whole config tree, each width the generic rule changed: old value -> new value."""
    for key, old in original.items():
        new = shrunk.get(key)
        if _is_subconfig(old) and isinstance(new, dict):
            _width_changes(old, new, scalars, lists)
        elif isinstance(old, int) and not isinstance(old, bool) and isinstance(new, int) and new != old:
            if key in _WIDTH_KEYS or key in _FFN_KEYS:
                scalars.setdefault(old, new)
        elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and old != new:
            if all(isinstance(v, int) and not isinstance(v, bool) for v in old + new) and _is_width_field(key):
                for o, n in zip(old, new):
                    lists.setdefault(o, n)


def _scaled(value: int, factor: float) -> int:
    return value if value <= 4 else max(4, int(round(value * factor)))


def _follow_widths(original: dict[str, Any], shrunk: dict[str, Any], scalars: dict[int, int], lists: dict[int, int]) -> None:
    """Fields the generic rule left alone that hold a width it changed elsewhere follow that change."""
    for key, old in original.items():
        new = shrunk.get(key)
        if _is_subconfig(old) and isinstance(new, dict):
            _follow_widths(old, new, scalars, lists)
            continue
        if new != old or isinstance(old, bool):
            continue
        if key.endswith("pos_feats") and isinstance(old, int) and 2 * old in scalars:  # half a width
            shrunk[key] = scalars[2 * old] // 2
        elif not _is_width_field(key):
            continue
        elif isinstance(old, int) and old > WIDTH and old in scalars:
            shrunk[key] = scalars[old]
        elif isinstance(old, int) and old in lists and (old > WIDTH or "channel" in key):
            shrunk[key] = lists[old]
        elif isinstance(old, list) and old and all(isinstance(v, int) and not isinstance(v, bool) for v in old) and max(old) > 8:
            if all(v in scalars for v in old):
                shrunk[key] = [scalars[v] for v in old]
                continue
            known = next((v for v in old if v in lists or v in scalars), None)
            if known is not None:
                factor = lists.get(known, scalars.get(known)) / known
            elif lists:  # a list of the same kind as the changed lists: their factor
                first = next(iter(lists))
                factor = lists[first] / first
            else:
                continue
            shrunk[key] = [lists.get(v, scalars.get(v, _scaled(v, factor))) for v in old]
            for o, n in zip(old, shrunk[key]):
                lists.setdefault(o, n)


def keep_width_relations(original: dict[str, Any], shrunk: dict[str, Any]) -> dict[str, Any]:
    """``shrunk`` (the generic rule applied to ``original``, a config's ``to_dict()``) with the widths it
    changed carried over to the fields that hold the same width, anywhere in the config tree: a
    projection size equal to a hidden size, a sub-config's input width equal to another's output width,
    a per-stage list of channels holding the stage widths. A list with some entries among the changed
    widths is scaled by the same factor."""
    scalars: dict[int, int] = {}
    lists: dict[int, int] = {}
    _width_changes(original, shrunk, scalars, lists)
    result = copy.deepcopy(shrunk)
    _keep_spelled_depths(original, result)
    for _ in range(2):  # the second pass sees the lists the first one scaled
        _follow_widths(original, result, scalars, lists)
    sides: dict[int, int] = {}
    patches: dict[int, int] = {}
    _image_changes(original, result, sides, patches)
    if sides:
        _same_image_size(original, result, sides)
        old_side, new_side = next(iter(sides.items()))
        patch = patches.get(old_side, 1)
        _follow_image_size(original, result, old_side // patch, new_side // patch)
    return result


def _keep_spelled_depths(original: dict[str, Any], shrunk: dict[str, Any]) -> None:
    """``depths`` stays where another per-stage list spells out each stage's blocks (one entry per
    block): the model reads the blocks from that list, so a shorter depth would not match it."""
    for key, old in original.items():
        if _is_subconfig(old) and isinstance(shrunk.get(key), dict):
            _keep_spelled_depths(old, shrunk[key])
    depths = original.get("depths")
    if not (isinstance(depths, list) and depths and all(isinstance(v, int) for v in depths)):
        return
    for key, value in original.items():
        if key != "depths" and isinstance(value, list) and len(value) == len(depths) and all(isinstance(v, list) for v in value):
            if [len(v) for v in value] == depths:
                shrunk["depths"] = list(depths)
                return


def _side(value: Any) -> int | None:
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _image_changes(original: dict[str, Any], shrunk: dict[str, Any], sides: dict[int, int], patches: dict[int, int]) -> None:
    """Collects each image side the generic rule changed (old -> largest new) and the patch size that
    divides it into a grid."""
    for key, old in original.items():
        new = shrunk.get(key)
        if _is_subconfig(old) and isinstance(new, dict):
            _image_changes(old, new, sides, patches)
        elif key == "image_size" and _side(old) and _side(new) and _side(old) != _side(new):
            sides[_side(old)] = max(sides.get(_side(old), 0), _side(new))
            patch = _side(original.get("patch_size"))
            if patch:
                patches.setdefault(_side(old), patch)


def _same_image_size(original: dict[str, Any], shrunk: dict[str, Any], sides: dict[int, int]) -> None:
    """Sub-configs that saw the same image keep seeing one image: the largest of their tiny sizes."""
    for key, old in original.items():
        new = shrunk.get(key)
        if _is_subconfig(old) and isinstance(new, dict):
            _same_image_size(old, new, sides)
        elif key == "image_size" and _side(old) in sides and _side(new) != sides[_side(old)]:
            side = sides[_side(old)]
            shrunk[key] = [side] * len(new) if isinstance(new, (list, tuple)) else side


def _follow_image_size(original: dict[str, Any], shrunk: dict[str, Any], old_side: int, new_side: int) -> None:
    """Grid sizes (feature-map sides, the image embedding side) derived from the image size follow it:
    a side that was k times the image side (or its patch grid) becomes k times the new one."""

    def follow(value: Any) -> Any:
        if isinstance(value, list):
            return [follow(v) for v in value]
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 8 * old_side:
            return max(1, round(new_side * value / old_side))
        return value

    patch = _side(shrunk.get("patch_size"))
    for key, old in original.items():
        new = shrunk.get(key)
        if _is_subconfig(old) and isinstance(new, dict):
            _follow_image_size(old, new, old_side, new_side)
        elif new == old and ("feature_sizes" in key or key == "image_embedding_size"):
            if key == "image_embedding_size" and patch and _side(shrunk.get("image_size")):
                shrunk[key] = _side(shrunk["image_size"]) // patch
            else:
                shrunk[key] = follow(old)


def _query_placeholder(fields: dict[str, Any]) -> None:
    """A model that splices its ``num_query_tokens`` image (or per-frame video) queries into the text at placeholder
    tokens, with the placeholder id left unset (``None`` compares the ids to ``None``): the id becomes the last of
    the vocabulary."""
    if "num_query_tokens" not in fields:
        return
    for key in ("image_token_index", "image_token_id", "video_token_index", "video_token_id"):
        if key in fields and fields[key] is None:
            fields[key] = VOCAB - 1
            return


def tiny_config(config_class: type, overrides: dict[str, Any] | None = None) -> Any:
    """A tiny instance of ``config_class``: its defaults, shrunk by :func:`shrink` (an unset query placeholder id
    set by :func:`_query_placeholder`, init scales raised by :func:`raise_init_scales`), then the family's
    :data:`FAMILY_OVERRIDES` and ``overrides``.

    Raises:
        Exception: whatever the config class raises on its defaults or on the shrunk fields.
    """
    default = config_class()
    fields = keep_width_relations(default.to_dict(), shrink(default.to_dict()))
    _query_placeholder(fields)
    raise_init_scales(fields)
    model_type = getattr(config_class, "model_type", "")
    if model_type in FAMILY_OVERRIDES:
        _merge(fields, FAMILY_OVERRIDES[model_type][0])
    if overrides:
        fields.update({key: value.value if isinstance(value, Replace) else value for key, value in overrides.items()})
    for key in ("transformers_version", "architectures", "_name_or_path", "model_type", "id2label", "label2id"):
        fields.pop(key, None)
    fields["num_labels"] = 3
    return config_class(**fields)


def parameter_count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


# --- signal: init scales and normalisation statistics ---------------------------------------------------------

#: init-scale fields -> their floor, with why. A positive value below the floor is raised to it, in the config
#: and every sub-config; zero is left alone (it selects a path: no layer scale at all, a zero-initialised gate).
INIT_FLOORS: dict[str, tuple[float, str]] = {
    **dict.fromkeys(
        ("initializer_range", "init_std", "embed_init_std", "embedding_initializer_range"),
        (
            0.02,
            "the std every weight is drawn with: the vision towers of BLIP, BLIP-2, InstructBLIP, SAM, SAM-HQ,"
            " Pix2Struct, GOT-OCR 2 and the OCR models built on SAM's encoder keep 1e-10 (a trained checkpoint"
            " overwrites it), which leaves every output of an untrained tower below 1e-5; the RT-DETR, D-FINE and"
            " HiFi-GAN families' 0.01 and HunYuan's 0.006 shrink each layer's output too; 0.02 is the common default",
        ),
    ),
    **dict.fromkeys(
        ("layer_scale_init_value", "layerscale_value", "layer_scale_initial_scale", "memory_fuser_layer_scale_init_value"),
        (
            0.1,
            "the per-channel scale of each residual branch (ConvNeXt 1e-6, PoolFormer 1e-5, FocalNet 1e-4, Mimi 0.01):"
            " untrained, a branch adds 1e-6 of its output to the residual stream, so the blocks' computation stays"
            " below any tolerance; 0.1 is BEiT's default",
        ),
    ),
}


#: config fields that declare layers keeping a recurrent state: Mamba/Mamba-2 mixers (``mamba_d_state``,
#: ``ssm_state_size``) and gated delta-rule / linear-attention layers (``linear_conv_kernel_dim``)
RECURRENT_STATE_FIELDS = ("mamba_d_state", "ssm_state_size", "linear_conv_kernel_dim")
#: the init scale of a (sub-)config with a :data:`RECURRENT_STATE_FIELDS` field, and why
RECURRENT_STATE_INIT: tuple[float, str] = (
    0.1,
    "signal: the state a recurrent layer returns in the cache is a sum over the tokens of products of two"
    " projections (key x value, or B x x x dt), each about 0.02 x sqrt(width) in size at the common 0.02; the tiny"
    " models' state leaves ended below the signal floor (sweep.signal_check): Qwen3.5 3.0e-3, Jamba 8.1e-3, Bamba"
    " 1.3e-4, Falcon-H1 1.0e-4, Zamba 6.6e-7, with every other output near 3. At 0.1 the state is 0.08 to 1 (Zamba's"
    " mixers, with their own time-step range, keep it below the floor at any init scale tried)",
)


def raise_init_scales(fields: dict[str, Any]) -> list[str]:
    """Raise the init scales of :data:`INIT_FLOORS` to their floor in ``fields`` (a config's ``to_dict()``, sub-configs
    included), in place, and the ``initializer_range`` of a (sub-)config that declares a recurrent state
    (:data:`RECURRENT_STATE_FIELDS`) to :data:`RECURRENT_STATE_INIT`; returns the dotted names of the fields raised."""
    raised: list[str] = []

    def walk(d: dict[str, Any], prefix: str) -> None:
        recurrent = any(key in d for key in RECURRENT_STATE_FIELDS)
        for key, value in d.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif key in INIT_FLOORS and isinstance(value, (int, float)) and not isinstance(value, bool):
                floor = max(INIT_FLOORS[key][0], RECURRENT_STATE_INIT[0] if recurrent and key == "initializer_range" else 0.0)
                if 0 < value < floor:
                    d[key] = floor
                    raised.append(prefix + key)

    walk(fields, "")
    return raised


#: the least running variance a calibrated normalisation keeps: a channel constant on the calibrating inputs
#: (a ReLU that never fires, one value per channel) is scaled up at most 1 / sqrt(1e-4) = 100-fold
RUNNING_VAR_FLOOR = 1e-4
#: ... and at least this share of the mean variance of its module's channels: late stages of a tiny image see one
#: or two values per channel (a batch of 2 at 1 x 1), whose variance is mostly chance; a channel that drew two
#: close values would otherwise be scaled up a hundredfold and amplify any other input (or rounding) as much
RELATIVE_VAR_FLOOR = 0.1
#: values per channel below which a normalisation gets one mean and one variance over all its channels: the
#: statistics of one or two values per channel (a batch of 2 at 1 x 1 in LeViT's last stage) are chance, and centring
#: each channel on its own mean would zero the calibrating inputs' features and blow up any others
MIN_CHANNEL_SAMPLES = 16


def has_running_stats(module: Any) -> bool:
    """Whether ``module`` normalises with running statistics: a batch normalisation (``nn.BatchNorm*``, or a
    frozen one such as DETR's, with ``running_mean`` and ``running_var`` buffers of one value per channel)."""
    import torch

    mean, var = getattr(module, "running_mean", None), getattr(module, "running_var", None)
    return isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor) and mean.dim() == 1 and mean.shape == var.shape


def zero_codebook(module: Any) -> Any:
    """The all-zero codebook tensor of a vector quantizer's codebook module (``embed``, or ``embed_sum`` as Mimi keeps
    it), or None: a module with a ``quantize`` method whose codebook training fills by k-means from its first batch."""
    import torch

    if not callable(getattr(type(module), "quantize", None)):
        return None
    for name in ("embed", "embed_sum"):
        table = module._buffers.get(name, None) if hasattr(module, "_buffers") else None
        if isinstance(table, torch.Tensor) and table.dim() == 2 and table.numel() and not bool(table.any()):
            return table
    return None


def has_calibration(module: Any) -> bool:
    """Whether :func:`calibrate_from_inputs` has something to set in ``module``."""
    return has_running_stats(module) or zero_codebook(module) is not None


def calibrate_running_stats(model: Any, inputs: dict[str, Any]) -> list[str]:
    """Set what a trained model learns from its data and a tiny one lacks, from one eval-mode forward on ``inputs``;
    returns the names of the modules set. (:func:`calibrate_from_inputs` is the same function.)

    - Batch normalisations get the running statistics of the activations they see. A tiny model's keep their init
      statistics (mean 0, variance 1): in eval mode each is then an identity, and a stack of convolutions drawn at
      the init scale (MobileNet, EfficientNet, HGNetV2, LeViT) shrinks the signal at every layer until the outputs
      are 1e-28, where any artifact, zeros included, passes a parity check. Trained, each normalisation holds the
      mean and variance of its input over the data; this gives it those of the sweep's inputs. A hook before each
      module sets them from its input (channels on axis 1, statistics over every other axis, or over all values
      when a channel has fewer than :data:`MIN_CHANNEL_SAMPLES`; a variance at least :data:`RUNNING_VAR_FLOOR` and
      :data:`RELATIVE_VAR_FLOOR` of the channels' mean), so each normalisation sees the already normalised outputs of
      the ones before it.
    - Vector quantizers' codebooks left all zero (Encodec, Mimi, X-codec: training fills them by k-means from the
      first batch) get entries drawn from the vectors they are asked to quantize, each with a little noise (0.1 of
      those vectors' spread). An all-zero codebook maps every frame to entry 0, whatever the audio, so the decoded
      audio is the same for every input: a constant an artifact passes by returning it.

    Deterministic: the same inputs give the same statistics and entries.
    """
    import torch

    from ..shapes import clone_tree

    norms = [(name, module) for name, module in model.named_modules() if has_running_stats(module)]
    codebooks = [(name, module) for name, module in model.named_modules() if zero_codebook(module) is not None]
    if not norms and not codebooks:
        return []
    done: list[str] = []
    generator = torch.Generator().manual_seed(0)

    def hook_for(name: str):  # noqa: ANN202
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            x = args[0] if args else None
            mean, var = module.running_mean, module.running_var
            if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2 or x.shape[1] != mean.numel():
                return
            axes = [d for d in range(x.dim()) if d != 1]
            values = x.detach().to(mean.dtype)
            if values.numel() // mean.numel() < MIN_CHANNEL_SAMPLES:  # too few values per channel: one mean and variance
                centre = values.mean().expand_as(mean)
                spread = values.var(unbiased=False).expand_as(var)
            else:
                centre, spread = values.mean(dim=axes), values.var(dim=axes, unbiased=False)
            floor = max(RUNNING_VAR_FLOOR, RELATIVE_VAR_FLOOR * float(spread.mean()))
            mean.copy_(centre)
            var.copy_(spread.clamp(min=floor))
            done.append(name)

        return hook

    def quantize_for(name: str, module: Any):  # noqa: ANN202
        original = type(module).quantize

        def quantize(hidden_states: Any) -> Any:
            table = zero_codebook(module)
            if table is not None and isinstance(hidden_states, torch.Tensor) and hidden_states.shape[-1] == table.shape[1]:
                rows = hidden_states.detach().reshape(-1, table.shape[1]).to(table.dtype)
                picks = torch.randint(0, rows.shape[0], (table.shape[0],), generator=generator)
                noise = torch.randn(table.shape, generator=generator, dtype=table.dtype) * 0.1 * float(rows.std())
                table.copy_(rows[picks] + noise)
                if "_embed" in vars(module):  # Mimi caches embed_sum / cluster_usage
                    module._embed = None
                done.append(name)
            return original(module, hidden_states)

        return quantize

    handles = [module.register_forward_pre_hook(hook_for(name)) for name, module in norms]
    for name, module in codebooks:
        module.quantize = quantize_for(name, module)  # an instance attribute over the class's method, removed below
    try:
        with torch.no_grad():
            model(**clone_tree(inputs))
    finally:
        for handle in handles:
            handle.remove()
        for _, module in codebooks:
            vars(module).pop("quantize", None)
    return sorted(set(done))


calibrate_from_inputs = calibrate_running_stats
