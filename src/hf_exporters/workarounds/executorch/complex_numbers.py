"""Complex-number arithmetic ExecuTorch has no dtype for: patches of ExecutorchExporter's Stage 2
(Torch patches), active during the trace.

Pattern: model code that computes in complex numbers only to take a real result: rotary embeddings
built with ``torch.polar`` and applied through ``view_as_complex`` (DeepSeek-V2, Llama 4), the real
part of a 2-D FFT (FNet). ExecuTorch has no complex tensors and no FFT kernels; the patches write the
same products in real arithmetic, (cos, sin) pairs and cosine/sine tables.
"""

from __future__ import annotations

from typing import Any

import torch

from ...registry import register_patch


@register_patch(
    "executorch",
    "transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2RotaryEmbedding.forward",
    "transformers.models.llama4.modeling_llama4.Llama4TextRotaryEmbedding.forward",
    stage="Stage 2: Torch patches",
    loaded_only=True,
)
def _patch_deepseek_v2_rotary_as_real_pairs(_original: Any) -> Any:
    """DeepSeek-V2's and Llama 4's rotary table as real (cos, sin) pairs instead of complex numbers;
    paired with :func:`_patch_deepseek_v2_apply_rotary_real` and :func:`_patch_llama4_apply_rotary_real`,
    which rotate with them.

    Pattern: ``torch.polar`` builds a complex table and ``apply_rotary_emb`` multiplies
    ``view_as_complex`` queries and keys by it. ExecuTorch has no complex dtype: ``aten.polar`` is not
    core ATen and ``view_as_complex_copy`` fails the lowering ("does not support automatic
    differentiation for outputs with complex dtype"). The table becomes (batch, seq, head_dim / 2, 2)
    with ``[..., 0] = cos``, ``[..., 1] = sin`` (times the attention scaling), the same numbers the
    complex product uses. Llama 4's text rotary is the same code.
    Models: DeepseekV2Model, DeepseekV2ForCausalLM, Llama4TextModel, Llama4ForConditionalGeneration.
    Upstream: executorch (no complex tensors in the edge dialect or the portable kernels);
        transformers models/deepseek_v2/modeling_deepseek_v2.py, models/llama4/modeling_llama4.py
        (complex rotary)
    Remove when: DeepSeek-V2 and Llama 4 apply their rotary embeddings with cos/sin like the Llama family.
    """

    from transformers.modeling_rope_utils import dynamic_rope_update

    @torch.no_grad()
    @dynamic_rope_update  # as the original: dynamic and long-context rope types switch inv_freq here
    def forward(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        # position_ids (batch, seq) -> (batch, seq, head_dim / 2, 2)
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        return torch.stack([torch.cos(freqs), torch.sin(freqs)], dim=-1) * self.attention_scaling

    return forward


@register_patch("executorch", "transformers.models.deepseek_v2.modeling_deepseek_v2.apply_rotary_emb", stage="Stage 2: Torch patches", loaded_only=True)
def _patch_deepseek_v2_apply_rotary_real(_original: Any) -> Any:
    """DeepSeek-V2's rotary product in real arithmetic over (cos, sin) pairs: for a feature pair
    ``(a, b)`` and angle pair ``(c, s)``, ``(a c - b s, a s + b c)``, the complex product written out.

    Pattern: see :func:`_patch_deepseek_v2_rotary_as_real_pairs` (the two patches come together: this
    one reads the table that one writes).
    Models: DeepseekV2Model, DeepseekV2ForCausalLM.
    Upstream: executorch (no complex tensors in the edge dialect or the portable kernels)
    Remove when: DeepSeek-V2 applies its rotary embedding with cos/sin like the Llama family.
    """

    def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # xq, xk (batch, heads, seq, rope_dim); freqs_cis (batch, seq, rope_dim / 2, 2)
        table = freqs_cis.unsqueeze(1)
        return _rotate_pairs(xq, table), _rotate_pairs(xk, table)

    return apply_rotary_emb


def _rotate_pairs(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``x`` (..., dim) rotated pair by pair by ``table`` (..., dim / 2, 2) of (cos, sin), broadcast
    against ``x``'s leading axes: ``(a, b)`` -> ``(a c - b s, a s + b c)``, in float32, returned in
    ``x``'s dtype."""
    cos, sin = table[..., 0], table[..., 1]
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).type_as(x)


@register_patch("executorch", "transformers.models.llama4.modeling_llama4.apply_rotary_emb", stage="Stage 2: Torch patches", loaded_only=True)
def _patch_llama4_apply_rotary_real(_original: Any) -> Any:
    """Llama 4's text rotary product in real arithmetic over (cos, sin) pairs (:func:`_rotate_pairs`).

    Pattern: as DeepSeek-V2 (:func:`_patch_deepseek_v2_rotary_as_real_pairs` writes the table), with
    queries and keys still (batch, seq, heads, head_dim) and the table broadcast over the heads.
    Without it the lowering fails with "view_as_complex_copy does not support automatic
    differentiation for outputs with complex dtype".
    Models: Llama4TextModel, Llama4ForConditionalGeneration (text inputs).
    Upstream: executorch (no complex tensors in the edge dialect or the portable kernels)
    Remove when: Llama 4 applies its rotary embedding with cos/sin like the Llama family.
    """

    def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # xq, xk (batch, seq, heads, head_dim); freqs_cis (batch, seq, head_dim / 2, 2)
        table = freqs_cis[:, :, None]
        return _rotate_pairs(xq, table), _rotate_pairs(xk, table)

    return apply_rotary_emb


def _real_dft2(x: torch.Tensor) -> torch.Tensor:
    """The real part of the 2-D discrete Fourier transform of ``x`` over axes 1 and 2, from matrix
    products: ``Re(F_s x F_h) = C_s x C_h - S_s x S_h`` with ``C[j, k] = cos(2 pi j k / n)`` and
    ``S[j, k] = sin(2 pi j k / n)`` (``F = C - i S``, symmetric).

    Shapes: ``x`` (batch, seq, hidden) -> (batch, seq, hidden), computed in float32 and returned in
    ``x``'s dtype. The phase ``j k`` is reduced modulo ``n`` in integers before it becomes an angle,
    so long axes keep their precision.
    """

    def cos_sin(n: Any) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.arange(n, device=x.device)
        angle = ((k[:, None] * k[None, :]) % n).to(torch.float32) * (2 * torch.pi / n)
        return angle.cos(), angle.sin()

    cos_s, sin_s = cos_sin(x.shape[1])
    cos_h, sin_h = cos_sin(x.shape[2])
    values = x.float()
    return (cos_s @ values @ cos_h - sin_s @ values @ sin_h).to(x.dtype)


@register_patch("executorch", "transformers.models.fnet.modeling_fnet.FNetBasicFourierTransform.forward", stage="Stage 2: Torch patches", loaded_only=True)
def _patch_fnet_fourier_as_real_matmuls(_original: Any) -> Any:
    """FNet's token mixing, the real part of a 2-D Fourier transform over (sequence, hidden), as four
    real matrix products (:func:`_real_dft2`) instead of complex FFTs.

    Pattern: ``torch.fft.fftn(hidden_states, dim=(1, 2)).real`` (or the TPU path's complex DFT
    matrices, or ``fftn`` one axis at a time: the same numbers) traces to ``aten._fft_r2c`` and
    ``aten._fft_c2c``, which are not core ATen ("SpecViolationError: Operator
    torch._ops.aten._fft_c2c.default is not in Core ATen opset"), over complex tensors ExecuTorch has
    no dtype for. Only the real part is used, and it is real arithmetic: cosine and sine tables times
    the hidden states. Cost ``O(seq**2 * hidden + seq * hidden**2)`` instead of the FFT's
    ``O(seq * hidden * log)``, which XNNPACK runs as matrix products.
    Models: FNetModel and its heads (executorch in the sweep).
    Upstream: executorch (no complex tensors or FFT kernels in the edge dialect and the portable
        kernels); pytorch/pytorch core ATen opset (``_fft_c2c``/``_fft_r2c`` are not in it)
    Remove when: ExecuTorch lowers ``_fft_r2c``/``_fft_c2c`` (or FNet offers a real DFT path).
    """

    def forward(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor]:
        return (_real_dft2(hidden_states),)

    return forward
