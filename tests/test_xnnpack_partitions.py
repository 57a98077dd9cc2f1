"""XNNPACK partitions: attention and LayerNorm lower into one XNNPACK partition (static shapes).

The smallest model that hits the pattern: projections, SDPA with a boolean padding mask, LayerNorm.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch.runtime", reason="XNNPACK lowering needs the executorch extra")

from hf_exporters import ExecutorchConfig, ExecutorchExporter  # noqa: E402
from hf_exporters.runtime.et_runner import ExecutorchRunner  # noqa: E402
from hf_exporters.workarounds.executorch.xnnpack_partitions import (  # noqa: E402
    attention_for_xnnpack,
    layer_norm_for_xnnpack,
    select_for_xnnpack,
)
from workaround_helpers import without_workarounds  # noqa: E402


class Block(torch.nn.Module):
    """(B, S, 32) -> 4-head self-attention with a (B, S) padding mask -> LayerNorm -> (B, S, 32), and
    a pooler over the first token (B, 32)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))
        self.out = torch.nn.Linear(32, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        batch, length, _ = hidden.shape
        q, k, v = (proj(hidden).view(batch, length, 4, 8).transpose(1, 2) for proj in (self.q, self.k, self.v))
        mask = attention_mask[:, None, None, :].bool()
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        normed = self.norm(hidden + self.out(attended.transpose(1, 2).reshape(batch, length, 32)))
        return normed, torch.tanh(self.out(normed[:, 0]))  # a pooler: the first token


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    hidden = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    return hidden, mask


def _partitions(manager) -> int:
    return sum(
        getattr(n.target, "__name__", "") == "executorch_call_delegate"
        for n in manager.exported_program().graph.nodes
        if n.op == "call_function"
    )


def test_attention_and_layer_norm_lower_as_one_partition():
    hidden, mask = _inputs()
    model = Block().eval()
    manager = ExecutorchExporter().export(model, {"hidden": hidden, "attention_mask": mask}, ExecutorchConfig())
    assert _partitions(manager) == 1
    got = ExecutorchRunner(manager.buffer)({"hidden": hidden, "attention_mask": mask})
    with torch.no_grad():
        want = model(hidden, mask)
    assert [float((g - w).abs().max()) < 1e-5 for g, w in zip(got, want)] == [True, True]
    # without the workaround, torch's decomposition splits the graph at the attention and the norm
    with without_workarounds("_patch_xnnpack_attention_and_layer_norm_decompositions"):
        split = ExecutorchExporter().export(model, {"hidden": hidden, "attention_mask": mask}, ExecutorchConfig())
    assert _partitions(split) >= 3


def test_attention_decomposition_equals_torch_including_fully_masked_rows():
    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=generator) for _ in range(3))
    mask = torch.rand(2, 1, 5, 5, generator=generator) > 0.3
    mask[0, 0, 2] = False  # a query that may attend to no key: torch returns zeros there
    got = attention_for_xnnpack(q, k, v, mask)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert float((got - want).abs().max()) < 1e-6
    assert float(got[0, :, 2].abs().max()) == 0.0
    assert got.permute(2, 0, 1, 3).is_contiguous()  # the layout of torch's CPU flash kernel, which a traced view may rely on
    unmasked = attention_for_xnnpack(q, k, v, None, scale=0.5)
    assert float((unmasked - torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.5)).abs().max()) < 1e-6
    # what it does not handle gets torch's own decomposition (the same values)
    additive = torch.zeros(2, 1, 5, 5).masked_fill(~mask, float("-inf"))
    for kwargs in ({"attn_mask": additive}, {"is_causal": True}):
        got = attention_for_xnnpack(q, k, v, **kwargs)
        assert float((got - torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)).nan_to_num().abs().max()) < 1e-6


def test_layer_norm_decomposition_equals_torch():
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(3)) * 3 + 1
    weight, bias = torch.randn(16), torch.randn(16)
    out, mean, rstd = layer_norm_for_xnnpack(x, [16], weight, bias, 1e-5)
    want, want_mean, want_rstd = torch.ops.aten.native_layer_norm.default(x, [16], weight, bias, 1e-5)
    assert float((out - want).abs().max()) < 1e-5
    assert float((mean - want_mean).abs().max()) < 1e-6 and float((rstd - want_rstd).abs().max()) < 1e-5
    assert layer_norm_for_xnnpack(x, [7, 16], None, None, 1e-5) is NotImplemented


def test_select_decomposition_equals_torch():
    x = torch.randn(2, 5, 4)
    assert torch.equal(select_for_xnnpack(x, 1, 0), x[:, 0]) and torch.equal(select_for_xnnpack(x, -2, -1), x[:, -1])
    assert select_for_xnnpack(x.long(), 1, 0) is NotImplemented
