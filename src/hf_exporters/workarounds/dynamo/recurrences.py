"""Recurrences over the sequence written as Python loops: model patches (DynamoExporter Stage 2,
applied for every backend).

Pattern: ``for t in range(seq_len)`` updating a state (Mamba's selective scan, RecurrentGemma's
RG-LRU, RWKV's linear attention, torch's own ``nn.LSTM``/``nn.GRU`` decompositions): under export the
loop is unrolled and fixes the sequence length. The patches express the same step as one
``torch.ops.higher_order.scan`` (or torch's ``while_loop`` decompositions), which keeps the length
symbolic and lowers to ONNX ``Scan`` and an ExecuTorch loop.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ...registry import register_patch


def _linear_recurrence(decay: torch.Tensor, drive: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``state = decay[t] * state + drive[t]`` for each position ``t``, as one
    ``torch.ops.higher_order.scan`` (a symbolic length under export, ONNX ``Scan``, an ExecuTorch loop).

    Shapes: ``decay``, ``drive`` (length, *S); ``state`` (*S), the state before position 0. Returns the
    last state (*S) and every position's state (length, *S), in the dtype of ``decay * state + drive``.
    """
    from torch._higher_order_ops.scan import scan

    def step(state: torch.Tensor, position: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        decay, drive = position
        state = decay * state + drive
        return state, state.clone()  # a scan output may not alias the carry

    state = state.to(torch.result_type(decay, drive))
    return scan(step, state, [decay, drive])


_SELECTIVE_SCANS = tuple(
    f"transformers.models.{family}.modeling_{family}.mamba_selective_scan" for family in ("mamba", "falcon_mamba", "jamba", "zamba")
)


@register_patch("dynamo", *_SELECTIVE_SCANS, loaded_only=True)
def _patch_selective_scan_as_scan_op(_original: Any) -> Any:
    """Mamba's selective scan (the reference path, without the ``mamba_ssm`` kernel) as one
    ``torch.ops.higher_order.scan`` over the sequence instead of a Python loop.

    Pattern: ``for index in range(seq_len)`` updating the SSM state one position at a time. Under
    export the loop is unrolled, so the sequence length is fixed by the loop count ("axes asked to
    be dynamic ended static: input_ids[axis 1]") and the graph grows with the length. The scan op
    runs the same step per position with a symbolic length; torch.onnx translates it to ONNX
    ``Scan`` and ExecuTorch emits it as a loop. transformers' own alternative,
    ``use_associative_scan``, is off under export because its op has no ONNX translation.

    Shapes: ``hidden_states``, ``dt``, ``z`` (batch, intermediate, length); ``A`` (intermediate,
    state); ``B``, ``C`` (batch, state, length); ``D``, ``delta_bias`` (intermediate,). Returns
    (batch, intermediate, length) and, with ``return_last_state``, the state (batch, intermediate,
    state). Same state update per step as the loop (float32); the readout by ``C`` is one matmul over all
    states, in the input dtype. Memory: every position's state is kept, (length, batch, intermediate,
    state) in float32, the size of the discretised ``A`` the loop also builds; a readout inside the scan
    step would keep less, but a matmul in the step body fails torch.onnx's decomposition of the scan.
    Models: MambaModel, FalconMambaModel, JambaModel, ZambaModel and their heads.
    Upstream: transformers models/mamba/modeling_mamba.py (``mamba_selective_scan``, copied into
        falcon_mamba, jamba and zamba); pytorch/pytorch#105279 (a Python loop over a dynamic length specialises it)
    Remove when: the reference path uses a scan op under export (or the associative scan gets an
        ONNX translation).
    """
    def mamba_selective_scan(
        hidden_states: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        D: torch.Tensor | None = None,
        z: torch.Tensor | None = None,
        delta_bias: torch.Tensor | None = None,
        delta_softplus: bool = False,
        return_last_state: bool = False,
        **_kernel_options: Any,
    ) -> Any:
        input_dtype = hidden_states.dtype
        if delta_bias is not None:
            dt = dt + delta_bias.to(dt.dtype)[..., None]
        if delta_softplus:
            dt = torch.nn.functional.softplus(dt)
        # length first for the scan: decay, drive (length, batch, intermediate, state)
        decay = torch.exp(A[None, :, None, :] * dt[..., None]).permute(2, 0, 1, 3)
        drive = (dt[..., None] * B.transpose(1, 2)[:, None].float() * hidden_states[..., None].float()).permute(2, 0, 1, 3)
        state = torch.zeros(hidden_states.shape[0], hidden_states.shape[1], A.shape[-1], dtype=input_dtype, device=hidden_states.device)
        state, states = _linear_recurrence(decay, drive, state)
        # states (length, batch, intermediate, state) read out by C (batch, state, length): (batch, intermediate, length)
        out = torch.matmul(states.permute(1, 0, 2, 3).to(input_dtype), C.transpose(1, 2)[..., None])[..., 0].transpose(1, 2)
        if D is not None:
            out = out + hidden_states * D[None, :, None]
        if z is not None:
            out = out * torch.nn.functional.silu(z)
        return (out, state) if return_last_state else out

    return mamba_selective_scan


@register_patch("dynamo", "transformers.models.recurrent_gemma.modeling_recurrent_gemma.RecurrentGemmaRglru._rnn_scan", loaded_only=True)
def _patch_rglru_scan_as_scan_op(original: Any) -> Any:
    """RecurrentGemma's RG-LRU recurrence over a prompt as one ``torch.ops.higher_order.scan``
    (:func:`_linear_recurrence`) instead of a Python loop.

    Pattern: ``for t in range(hidden_states.shape[1])`` over the sequence: under export the loop is
    unrolled and fixes the length ("axes asked to be dynamic ended static: input_ids[axis 1]"). Same
    arithmetic per step (``a_t * h + x_t`` accumulated in ``acc_dtype``); a one-token call (decoding)
    keeps transformers' own path.
    Shapes: ``hidden_states`` (batch, length, lru_width); ``recurrent_gate``, ``reset`` broadcastable to
    it; ``recurrent_states`` (batch, lru_width) or None. Returns (batch, length, lru_width) in the
    input dtype and the last state (batch, lru_width) in ``acc_dtype``.
    Models: RecurrentGemmaModel, RecurrentGemmaForCausalLM.
    Upstream: transformers models/recurrent_gemma/modeling_recurrent_gemma.py (``RecurrentGemmaRglru._rnn_scan``);
        pytorch/pytorch#105279 (a Python loop over a dynamic length specialises it)
    Remove when: the prompt path uses a scan op (or a parallel scan) under export.
    """

    def _rnn_scan(
        self: Any,
        hidden_states: torch.Tensor,
        recurrent_gate: torch.Tensor,
        reset: torch.Tensor,
        recurrent_states: torch.Tensor | None,
        acc_dtype: torch.dtype = torch.float32,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if hidden_states.shape[1] == 1:
            return original(self, hidden_states, recurrent_gate, reset, recurrent_states, acc_dtype)
        decay = (recurrent_gate * ~reset).type(acc_dtype).expand_as(hidden_states).transpose(0, 1)
        if recurrent_states is None:
            recurrent_states = torch.zeros(hidden_states[:, 0].shape, dtype=acc_dtype, device=hidden_states.device)
        last, states = _linear_recurrence(decay, hidden_states.type(acc_dtype).transpose(0, 1), recurrent_states.to(acc_dtype))
        return states.transpose(0, 1).type(hidden_states.dtype), last

    return _rnn_scan


@register_patch("dynamo", "transformers.models.rwkv.modeling_rwkv.rwkv_linear_attention_cpu", loaded_only=True)
def _patch_rwkv_attention_as_scan_op(_original: Any) -> Any:
    """RWKV's linear attention (the CPU path) as one ``torch.ops.higher_order.scan`` over the sequence
    instead of a Python loop.

    Pattern: ``for current_index in range(seq_length)`` updating the (numerator, denominator, max)
    state and writing ``output[:, current_index]``: under export the loop is unrolled and fixes the
    length ("axes asked to be dynamic ended static: input_ids[axis 1]"). The same max-stabilised
    arithmetic per step, in float32 as in the loop.
    Shapes: ``time_decay``, ``time_first`` (hidden,); ``key``, ``value`` (batch, length, hidden);
    ``state`` three (batch, hidden) tensors or None. Returns the output (batch, length, hidden) in
    ``key``'s dtype and the state (with ``return_state`` or a given state) else None.
    Models: RwkvModel, RwkvForCausalLM.
    Upstream: transformers models/rwkv/modeling_rwkv.py (``rwkv_linear_attention_cpu``);
        pytorch/pytorch#105279 (a Python loop over a dynamic length specialises it)
    Remove when: the CPU path uses a scan op under export.
    """
    from torch._higher_order_ops.scan import scan

    def rwkv_linear_attention_cpu(
        time_decay: torch.Tensor,
        time_first: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        state: list[torch.Tensor] | None = None,
        return_state: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        given_state = state is not None
        if state is None:
            zeros = torch.zeros_like(key[:, 0], dtype=torch.float32)
            state = [zeros, zeros.clone(), zeros - 1e38]
        else:  # the loop promotes a given state to float32 at its first step; the scan carry keeps one dtype
            state = [s.to(torch.promote_types(s.dtype, torch.float32)) for s in state]
        decay = -torch.exp(time_decay)

        def step(carry: list[torch.Tensor], position: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
            numerator, denominator, largest = carry
            k, v = position
            k = k.float()
            top = torch.maximum(largest, k + time_first)
            e1, e2 = torch.exp(largest - top), torch.exp(k + time_first - top)
            out = ((e1 * numerator + e2 * v) / (e1 * denominator + e2)).to(key.dtype)
            top = torch.maximum(largest + decay, k)
            e1, e2 = torch.exp(largest + decay - top), torch.exp(k - top)
            return [e1 * numerator + e2 * v, e1 * denominator + e2, top], out

        state, output = scan(step, list(state), [key.transpose(0, 1), value.transpose(0, 1)])
        return output.transpose(0, 1), (list(state) if return_state or given_state else None)

    return rwkv_linear_attention_cpu


@register_patch("dynamo", "torch.export.export")
def _patch_recurrent_layers_as_while_loops(original: Any) -> Any:
    """Trace ``nn.LSTM`` and ``nn.GRU`` as a ``while_loop`` over time when the export has dynamic shapes.

    Pattern: torch's decomposition of ``aten.lstm``/``aten.gru`` iterates over the time steps in
    Python (``for x in input.unbind(0)``), so under export the loop is unrolled and fixes the sequence
    length ("axes asked to be dynamic ended static: decoder_input_ids[axis 1]" for an RNN-T
    prediction network). torch ships while_loop-based decompositions for exactly this
    (``torch.export._patches.register_lstm_while_loop_decomposition`` and the GRU one), which
    torch.onnx enters around its own capture when given dynamic shapes; the DynamoExporter traces
    first, so the patch enters them around a ``torch.export.export`` call with ``dynamic_shapes``. A
    static export keeps the unrolled loop. Same cell arithmetic per step. The ops' cached kernel
    choice is cleared around the trace, so an earlier trace in the process does not keep the loop.
    Models: ParakeetForRNNT (.pt2 dynamic; its ONNX lowering then stops at a ``squeeze`` of the joint
        output), and the other users of ``nn.LSTM``: ParakeetForTDT, NemotronAsrStreamingForRNNT,
        the Nemotron 3.5 ASR RNN-T, EncodecModel's LSTM blocks.
    Upstream: pytorch/pytorch torch/_decomp/decompositions.py (``one_layer_lstm`` loops in Python);
        torch/export/_patches.py (the while_loop decompositions, opt-in)
    Remove when: torch.export uses the while_loop decompositions for dynamic exports by default.
    """
    from torch.export._patches import register_gru_while_loop_decomposition, register_lstm_while_loop_decomposition

    def forget_dispatch() -> None:
        # an op caches the kernel it chose per dispatch key: an earlier trace in this process would
        # keep the loop decomposition, and ours would outlive the block
        for op in (torch.ops.aten.lstm.input, torch.ops.aten.gru.input):
            op._dispatch_cache.clear()

    @functools.wraps(original)
    def export(*args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("dynamic_shapes"):
            return original(*args, **kwargs)
        forget_dispatch()
        try:
            with register_lstm_while_loop_decomposition(), register_gru_while_loop_decomposition():
                return original(*args, **kwargs)
        finally:
            forget_dispatch()

    return export
