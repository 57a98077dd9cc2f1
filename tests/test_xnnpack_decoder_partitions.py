"""XNNPACK partitions of a decoder layer (static shapes): RMSNorm, rotary tables, an empty cache, grouped
key/value heads and the LM head's alias lower into one XNNPACK partition.

The smallest model that hits each pattern of ``_patch_xnnpack_decoder_decompositions`` and
``_fix_attention_on_repeated_heads_as_grouped``, written as transformers' Llama writes them.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.runtime", reason="XNNPACK lowering needs the executorch extra")

from hf_exporters import ExecutorchConfig, ExecutorchExporter  # noqa: E402
from hf_exporters.runtime.et_runner import ExecutorchRunner  # noqa: E402
from hf_exporters.workarounds.executorch.xnnpack_partitions import (  # noqa: E402
    alias_for_xnnpack,
    attention_for_xnnpack,
    cat_for_xnnpack,
    mean_for_xnnpack,
    unsqueeze_for_xnnpack,
)
from workaround_helpers import without_workarounds  # noqa: E402


def _rotate(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DecoderLayer(torch.nn.Module):
    """(B, S, 32) and a (B, S) padding mask -> RMSNorm -> rotary 4-query / 2-key-value-head attention
    over an empty cache -> residual -> ``[:, 0:]`` -> (B, S, 32)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.o = torch.nn.Linear(32, 32, bias=False), torch.nn.Linear(32, 32, bias=False)
        self.k, self.v = torch.nn.Linear(32, 16, bias=False), torch.nn.Linear(32, 16, bias=False)
        self.weight = torch.nn.Parameter(torch.rand(32) + 0.5)
        self.register_buffer("inv_freq", 1.0 / 100 ** (torch.arange(0, 8, 2).float() / 8), persistent=False)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        batch, length, _ = hidden.shape
        normed = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        freqs = torch.arange(length, dtype=torch.float32)[None, :, None] * self.inv_freq  # (1, S, 4)
        table = torch.cat((freqs, freqs), dim=-1)
        cos, sin = table.cos().unsqueeze(1), table.sin().unsqueeze(1)  # (1, 1, S, 8)
        q = self.q(normed).view(batch, length, 4, 8).transpose(1, 2)
        k = self.k(normed).view(batch, length, 2, 8).transpose(1, 2)
        v = self.v(normed).view(batch, length, 2, 8).transpose(1, 2)
        q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        k = torch.cat([torch.zeros(batch, 2, 0, 8), k], dim=-2)  # a cache update with an empty past
        v = torch.cat([torch.zeros(batch, 2, 0, 8), v], dim=-2)
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        mask = attention_mask[:, None, None, :].bool()
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = hidden + self.o(attended.transpose(1, 2).reshape(batch, length, 32))
        return out[:, slice(0, None), :]


def _inputs() -> dict[str, torch.Tensor]:
    hidden = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    return {"hidden": hidden, "attention_mask": mask}


def _partitions(manager) -> int:
    return sum(
        getattr(n.target, "__name__", "") == "executorch_call_delegate"
        for n in manager.exported_program().graph.nodes
        if n.op == "call_function"
    )


def test_decoder_layer_lowers_as_one_partition():
    model = DecoderLayer().eval()
    manager = ExecutorchExporter().export(model, _inputs(), ExecutorchConfig())
    assert _partitions(manager) == 1
    got = ExecutorchRunner(manager.buffer)(_inputs())[0]
    with torch.no_grad():
        want = model(**_inputs())
    assert float(want.abs().max()) > 1.0
    assert float((got - want).abs().max()) < 1e-5
    with without_workarounds("_patch_xnnpack_decoder_decompositions", "_fix_attention_on_repeated_heads_as_grouped"):
        split = ExecutorchExporter().export(model, _inputs(), ExecutorchConfig())
    assert _partitions(split) >= 3


def test_mean_unsqueeze_alias_decompositions_equal_torch():
    x = torch.randn(2, 5, 6) * 2 + 1
    assert float((mean_for_xnnpack(x, [-1], True) - x.mean(-1, keepdim=True)).abs().max()) < 1e-6
    assert float((mean_for_xnnpack(x, 2) - x.mean(2)).abs().max()) < 1e-6
    assert mean_for_xnnpack(x, [1], True) is NotImplemented and mean_for_xnnpack(x.unsqueeze(0), [-1]) is NotImplemented
    assert torch.equal(unsqueeze_for_xnnpack(x, 1), x.unsqueeze(1)) and torch.equal(unsqueeze_for_xnnpack(x, -3), x.unsqueeze(-3))
    assert unsqueeze_for_xnnpack(x, -1) is NotImplemented and unsqueeze_for_xnnpack(x.long(), 0) is NotImplemented
    assert torch.equal(alias_for_xnnpack(x), x) and alias_for_xnnpack(x.long()) is NotImplemented


def test_cat_decomposition_drops_empty_and_copies_repeated_inputs():
    a, b = torch.randn(2, 3), torch.randn(2, 4)
    empty = torch.zeros(2, 0)
    lone = cat_for_xnnpack([empty, a], 1)
    assert torch.equal(lone, a) and lone is not a
    twice = cat_for_xnnpack([a, a], 1)
    assert torch.equal(twice, torch.cat([a, a], 1))
    assert torch.equal(cat_for_xnnpack([a, empty, b, a], 1), torch.cat([a, b, a], 1))
    assert cat_for_xnnpack([a, b], 1) is NotImplemented  # nothing to change
    assert cat_for_xnnpack([a.long(), a.long()], 1) is NotImplemented


def test_grouped_attention_equals_torch():
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(2, 6, 5, 8, generator=generator)
    k, v = (torch.randn(2, 2, 7, 8, generator=generator) for _ in range(2))
    mask = torch.rand(2, 1, 5, 7, generator=generator) > 0.3
    mask[1, 0, 3] = False  # a query that attends to no key: zeros, as torch returns
    got = attention_for_xnnpack(q, k, v, mask, enable_gqa=True)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert float((got - want).abs().max()) < 1e-6
    assert float(got[1, :, 3].abs().max()) == 0.0
