"""Models and input sets of the cases in ../shared/cases/cases.yaml (tiny configs, trigger fields kept).

Each builder returns ``(model, input_sets, dynamic)``: the first input set is the export input, the
others are the later ``run_with`` sizes run through the same exported program.
"""

from __future__ import annotations

import torch
import transformers as tf

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def _ids(batch: int, seq: int, vocab: int = 64) -> torch.Tensor:
    return torch.randint(1, vocab, (batch, seq))


def _text(batch: int, seq: int) -> dict:
    return {"input_ids": _ids(batch, seq), "attention_mask": torch.ones(batch, seq, dtype=torch.long)}


def h1_phi3_longrope():
    """H1: longrope picks short or long factors by comparing the sequence length with original_max_position_embeddings."""
    cfg = tf.Phi3Config(
        **TINY,
        num_key_value_heads=2,
        max_position_embeddings=32,
        original_max_position_embeddings=8,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [2.0, 2.1, 2.2, 2.3]},
        pad_token_id=0,
    )
    model = tf.Phi3ForCausalLM(cfg).eval()
    return model, [_text(1, 5), _text(1, 12)], True


def h2_mixtral_moe():
    """H2: mixture-of-experts loop over experts selected with nonzero()."""
    cfg = tf.MixtralConfig(**TINY, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    return tf.MixtralForCausalLM(cfg).eval(), [_text(1, 7), _text(2, 3)], True


def h3_mistral_decode():
    """H3: decode step with a DynamicCache already holding earlier positions; outputs include the cache."""
    cfg = tf.MistralConfig(**TINY, num_key_value_heads=2, sliding_window=None)
    model = tf.MistralForCausalLM(cfg).eval()

    def decode(past: int) -> dict:
        with torch.no_grad():
            prefill = model(input_ids=_ids(1, past), use_cache=True)
        return {
            "input_ids": _ids(1, 1),
            "attention_mask": torch.ones(1, past + 1, dtype=torch.long),
            "past_key_values": prefill.past_key_values,
        }

    return model, [decode(3), decode(9)], True


def h5_bert_masked_row():
    """H5: a boolean attention mask with one batch row masking every key."""
    cfg = tf.BertConfig(**TINY, attn_implementation="sdpa")
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1] = 0
    return tf.BertModel(cfg).eval(), [{"input_ids": _ids(2, 6), "attention_mask": mask}], False


def h6_swin():
    """H6: window attention and patch merging."""
    cfg = tf.SwinConfig(image_size=32, patch_size=4, window_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2])
    return tf.SwinModel(cfg).eval(), [{"pixel_values": torch.randn(1, 3, 32, 32)}], False


def h7_bert_dynamic():
    """H7: batch and sequence axes stay dynamic; one export serves every size, batch 1 and one token included."""
    cfg = tf.BertConfig(**TINY)
    return tf.BertModel(cfg).eval(), [_text(1, 5), _text(3, 17), _text(2, 1)], True


def h8_gpt2():
    """H8: non-persistent buffers must not become graph inputs."""
    cfg = tf.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32)
    return tf.GPT2Model(cfg).eval(), [_text(1, 4)], True


def h11_qwen2_vl():
    """H11: vision rotary positions computed with .item() over the image grid sizes."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    image_token = 64 - 1
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
            "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0},
        },
        vision_config={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 32,
            "num_heads": 4,
            "mlp_ratio": 2,
            "patch_size": 4,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        image_token_id=image_token,
        video_token_id=64 - 2,
        vision_start_token_id=64 - 3,
        vision_end_token_id=64 - 4,
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config).eval()
    # trigger: one image; a 4x4 patch grid merged 2x2 gives 4 image tokens
    grid = torch.tensor([[1, 4, 4]])
    patches = int(grid.prod())
    pixel_values = torch.randn(patches, 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(0))
    ids = torch.cat(
        [
            torch.tensor([[5, 6, 64 - 3]]),
            torch.full((1, patches // 4), image_token),
            torch.tensor([[64 - 4, 7, 8]]),
        ],
        dim=1,
    )
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values": pixel_values,
        "image_grid_thw": grid,
        # what the processor returns beside input_ids: 1 marks image tokens (multimodal RoPE needs it)
        "mm_token_type_ids": (ids == image_token).long(),
    }
    return model, [inputs], False


def h12_phi_vmap_mask():
    """H12: the causal mask of the masking utilities (default attention implementation)."""
    cfg = tf.PhiConfig(**TINY)
    return tf.PhiModel(cfg).eval(), [_text(1, 4), _text(1, 11)], True


def h14_efficientnet():
    """H14: a convolutional vision model whose outputs change size with the input's height and width."""
    cfg = tf.EfficientNetConfig(image_size=32, width_coefficient=0.25, depth_coefficient=0.2, hidden_dim=64)
    model = tf.EfficientNetModel(cfg).eval()
    return model, [{"pixel_values": torch.randn(1, 3, 32, 32)}, {"pixel_values": torch.randn(1, 3, 48, 40)}], True


def h15_llama_static_cache():
    """H15: a StaticCache (max_cache_len 16) passed as an input together with dynamic shapes."""
    cfg = tf.LlamaConfig(**TINY, num_key_value_heads=2)
    model = tf.LlamaForCausalLM(cfg).eval()

    def step(seq: int) -> dict:
        return {
            "input_ids": _ids(1, seq),
            "past_key_values": tf.StaticCache(config=cfg, max_cache_len=16),
            "cache_position": torch.arange(seq),
        }

    return model, [step(1), step(4)], True


CASES = {
    "H1": h1_phi3_longrope,
    "H2": h2_mixtral_moe,
    "H3": h3_mistral_decode,
    "H5": h5_bert_masked_row,
    "H6": h6_swin,
    "H7": h7_bert_dynamic,
    "H8": h8_gpt2,
    "H11": h11_qwen2_vl,
    "H12": h12_phi_vmap_mask,
    "H14": h14_efficientnet,
    "H15": h15_llama_static_cache,
}


def unexpected_static(static_axes, case: str | None = None) -> list:
    """Static axes other than those the model fixes by design: a cache tensor's head and head-size
    axes (1 and 3 of (batch, kv_heads, sequence, head_dim)), and its length for a fixed-size
    StaticCache (H15). Batch and sequence axes must stay dynamic."""
    fixed = (1, 2, 3) if case == "H15" else (1, 3)
    return [a for a in static_axes if not (a.input.startswith("past_key_values") and a.axis in fixed)]
