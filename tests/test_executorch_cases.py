"""Cases H1, H2, H3, H5, H6, H7, H12, H14, H15 of cases.yaml through the ExecuTorch exporter (XNNPACK).

Each case builds its model from a tiny config that keeps the case's trigger fields, exports ONCE
(with the first ``run_with`` input), then runs every ``run_with`` input, each built explicitly, in
executorch.runtime and compares every output with eager PyTorch (atol 1e-3, all elements).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import transformers

pytest.importorskip("executorch", reason="the ExecuTorch tests need the executorch extra")

from hf_exporters import ExecutorchConfig  # noqa: E402
from hf_exporters.exporters.executorch import ExecutorchExporter  # noqa: E402
from hf_exporters.pytree import materialize_caches  # noqa: E402
from hf_exporters.runtime import check_parity  # noqa: E402
from hf_exporters.shapes import tensor_leaves  # noqa: E402

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)


def _ids(batch: int, seq_len: int, vocab: int = 128, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(seed + 31 * seq_len + batch))


def _text(batch: int, seq_len: int) -> dict:
    return {"input_ids": _ids(batch, seq_len), "attention_mask": torch.ones(batch, seq_len, dtype=torch.long)}


def _model(cls, config):
    torch.manual_seed(0)
    return cls(config).eval()


# ── case builders: (model, [inputs per run_with entry], dynamic) ─────────────


def case_h1():
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    config = transformers.Phi3Config(
        **TINY,
        num_key_value_heads=2,
        max_position_embeddings=32,
        original_max_position_embeddings=8,
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(head_dim // 2)],
            "long_factor": [2.0 + 0.5 * i for i in range(head_dim // 2)],
        },
        pad_token_id=0,
    )
    model = _model(transformers.Phi3ForCausalLM, config)
    return model, [_text(1, 5), _text(1, 12)], True


def case_h2():
    config = transformers.MixtralConfig(**TINY, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    model = _model(transformers.MixtralForCausalLM, config)
    return model, [_text(1, 7), _text(2, 3)], True


def _mistral_decode(model, past_len: int) -> dict:
    """One new token after a DynamicCache filled by an eager prefill of ``past_len`` tokens."""
    prefill = _ids(1, past_len, seed=1)
    with torch.no_grad():
        cache = model(input_ids=prefill, use_cache=True).past_key_values
    return {
        "input_ids": _ids(1, 1, seed=2),
        "attention_mask": torch.ones(1, past_len + 1, dtype=torch.long),
        "position_ids": torch.tensor([[past_len]]),
        "past_key_values": cache,
    }


def case_h3():
    config = transformers.MistralConfig(**TINY, num_key_value_heads=2, sliding_window=None)
    model = _model(transformers.MistralForCausalLM, config)
    return model, [_mistral_decode(model, 3), _mistral_decode(model, 9)], True


def _bert(attn: str = "sdpa"):
    config = transformers.BertConfig(**TINY, max_position_embeddings=64, attn_implementation=attn)
    return _model(transformers.BertModel, config)


def case_h5():
    inputs = _text(2, 6)
    inputs["attention_mask"][1] = 0  # a padding row that masks every key
    return _bert("sdpa"), [inputs], False


def case_h6():
    config = transformers.SwinConfig(
        image_size=32, patch_size=4, window_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2], num_channels=3
    )
    model = _model(transformers.SwinModel, config)
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return model, [{"pixel_values": pixels}], False


def case_h7():
    return _bert(), [_text(1, 5), _text(3, 17), _text(2, 1)], True


def case_h12():
    config = transformers.PhiConfig(**TINY, max_position_embeddings=64)
    model = _model(transformers.PhiModel, config)
    return model, [_text(1, 4), _text(1, 11)], True


def _pixels(height: int, width: int) -> dict:
    return {"pixel_values": torch.randn(1, 3, height, width, generator=torch.Generator().manual_seed(height * width))}


def _torch_default_init(model: torch.nn.Module) -> None:
    """torch's default initialisation and non-trivial BatchNorm statistics: with transformers' std-0.02
    init, the activations of a deep convolutional stack vanish to exact zeros, and parity checks nothing."""
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            module.reset_parameters()
        elif isinstance(module, torch.nn.BatchNorm2d):
            module.weight.data.uniform_(0.5, 1.5, generator=generator)
            module.bias.data.normal_(0.0, 0.1, generator=generator)
            module.running_mean.normal_(0.0, 0.1, generator=generator)
            module.running_var.uniform_(0.5, 1.5, generator=generator)


def case_h14():
    from transformers.models.efficientnet.modeling_efficientnet import round_filters

    config = transformers.EfficientNetConfig(image_size=32, width_coefficient=0.1, depth_coefficient=0.1, num_channels=3)
    config.hidden_dim = round_filters(config, 1280)  # the top convolution's width
    model = _model(transformers.EfficientNetModel, config)
    _torch_default_init(model)
    return model, [_pixels(32, 32), _pixels(48, 40)], True


def _static_cache_inputs(model, seq_len: int) -> dict:
    inputs = {
        "input_ids": _ids(1, seq_len),
        "cache_position": torch.arange(seq_len),
        "past_key_values": transformers.StaticCache(config=model.config, max_cache_len=16),
        "use_cache": True,
    }
    materialize_caches(model, inputs)  # the runtime takes the cache tensors as inputs
    return inputs


def case_h15():
    config = transformers.LlamaConfig(**TINY, num_key_value_heads=2, max_position_embeddings=64)
    model = _model(transformers.LlamaForCausalLM, config)
    return model, [_static_cache_inputs(model, 1), _static_cache_inputs(model, 4)], True


CASES = {
    "H1": case_h1,
    "H2": case_h2,
    "H3": case_h3,
    "H5": case_h5,
    "H6": case_h6,
    "H7": case_h7,
    "H12": case_h12,
    "H14": case_h14,
    "H15": case_h15,
}

XFAIL: dict[str, str] = {}


def _params():
    for name in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL else []
        yield pytest.param(name, id=name, marks=marks)


def _varying_axes(input_sets: list[dict]) -> set[tuple[str, int]]:
    """``(input name, axis)`` of every axis whose size differs between the ``run_with`` inputs."""
    shapes = [{name: tuple(t.shape) for name, t in tensor_leaves(inputs)} for inputs in input_sets]
    return {
        (name, axis)
        for name, shape in shapes[0].items()
        for axis in range(len(shape))
        if any(other[name][axis] != shape[axis] for other in shapes[1:])
    }


@pytest.mark.parametrize("case", list(_params()))
def test_case_xnnpack_parity(case, tmp_path):
    model, input_sets, dynamic = CASES[case]()
    exporter = ExecutorchExporter()
    result = exporter.run(model, input_sets[0], ExecutorchConfig(backend="xnnpack", dynamic=dynamic))
    manager = result.program
    # one export serves every run_with input: no axis that varies between them was specialised
    assert {(a.input, a.axis) for a in result.static_axes} & _varying_axes(input_sets) == set()
    runner = exporter.load_runner(exporter.save(manager, tmp_path))
    reports = check_parity(model, runner, input_sets, atol=exporter.default_atol)
    assert [r.input_shapes for r in reports] == [{n: list(t.shape) for n, t in tensor_leaves(i)} for i in input_sets]
    for report in reports:
        assert report.ok and report.max_abs_diff <= 1e-3, report.describe_failure()
        assert all(leaf.max_abs_diff <= 1e-3 for leaf in report.leaves)
