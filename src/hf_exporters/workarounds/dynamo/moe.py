"""Mixture-of-experts layers that loop over the experts the router picked: model patches
(DynamoExporter Stage 2, applied for every backend).

Pattern: ``for expert_idx in expert_hit`` over ``nonzero()`` of the routing mask, then
``torch.where`` per expert: the loop count and each expert's token count are read from data. The
patches route through transformers' ``batched_mm`` experts where the layer uses
``@use_experts_implementation``, or compute a dense mixture (every expert on every token, weighted by
the router) where the model writes its own loop (SwitchTransformers, DBRX, Step 3.7, LongCat-Flash).
The ExecuTorch backend's own experts patch is in :mod:`..executorch.moe`.
"""

from __future__ import annotations

from typing import Any

import torch

from ...registry import register_patch


@register_patch("dynamo", "transformers.integrations.moe.ExpertsInterface.get_interface")
def _patch_eager_experts_as_batched_mm(original: Any) -> Any:
    """Trace mixture-of-experts layers configured for the ``eager`` experts implementation with
    transformers' ``batched_mm`` implementation.

    Pattern: the ``eager`` forward of an experts module (``@use_experts_implementation``) loops
    ``for expert_idx in expert_hit``, where ``expert_hit`` comes from ``nonzero()`` over the router's
    choices, and gathers each expert's tokens with ``torch.where``: both the loop count and the token
    counts are read from data, so the trace fails with "Could not guard on data-dependent
    expression". A model that overrides ``get_correct_experts_implementation`` to default to
    ``eager`` (OpenAI Privacy Filter, for its sensitivity to accumulation order), or a user who asks
    for ``experts_implementation="eager"``, gets that loop. ``batched_mm`` computes the same
    per-token expert projections by gathering each token's expert weights (shapes fixed by the token
    count and top-k), with the same layout flags (transposed, bias, gate, post-expert norm); only the
    summation order differs. That holds in float32 only: OpenAI Privacy Filter's eager loop computes
    in float32 whatever the weights' dtype, and ``batched_mm`` in the weights' dtype, so modules with
    bf16/fp16 weights keep the eager loop (and the trace still fails there). ``batched_mm`` gathers one
    copy of the expert weights per (token, top-k) pair: memory grows with tokens x top-k x expert size.
    Other implementations (``grouped_mm``, kernels) are returned unchanged.
    Models: OpenAIPrivacyFilterModel (sweep, data-dependent guard).
    Upstream: transformers integrations/moe.py (the eager experts loop over ``expert_hit``);
        pytorch/pytorch#125180 (data-dependent loops under torch.export)
    Remove when: transformers' eager experts forward has a trace-friendly path under
        ``torch.compiler.is_exporting()``.
    """

    def get_interface(self: Any, experts_implementation: str, default: Any) -> Any:
        if experts_implementation != "eager" or "batched_mm" not in self or "eager" in self:
            return original(self, experts_implementation, default)  # "eager" registered: a backend's own choice
        batched = self["batched_mm"]

        def experts_forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if all(p.dtype == torch.float32 for p in module.parameters()):
                return batched(module, *args, **kwargs)
            return default(module, *args, **kwargs)

        return experts_forward

    return get_interface


def _dense_mixture(hidden_states: torch.Tensor, weights: torch.Tensor, expert: Any, count: int) -> torch.Tensor:
    """Every expert on every token, summed with its routing weight.

    ``hidden_states`` (tokens, hidden); ``weights`` (tokens, count): the weight each token gives each
    expert, 0 where the router did not choose it; ``expert(e, hidden_states)`` -> (tokens, hidden).
    The Python loop runs over a count fixed by the config, so the trace has no data-dependent size.
    Each expert's output is multiplied by its weight in the weight's dtype (float32 routers) and cast
    to the hidden dtype before it is summed, as the loops do; an expert a token did not choose adds an
    exact 0 even where its output overflows (``where``, not ``inf * 0``).
    """
    out = torch.zeros_like(hidden_states)
    for index in range(count):
        weight = weights[:, index, None]
        contribution = torch.where(weight != 0, expert(index, hidden_states) * weight, 0.0)
        out = out + contribution.to(hidden_states.dtype)
    return out


@register_patch("dynamo", "transformers.models.switch_transformers.modeling_switch_transformers.SwitchTransformersExperts.forward", loaded_only=True)
def _patch_switch_experts_dense(_original: Any) -> Any:
    """SwitchTransformers' experts as a dense mixture: each expert on every token, weighted by the
    router's (zero for experts it did not choose).

    Pattern: ``for expert_idx in expert_hit`` over ``nonzero()`` of the routing mask, then
    ``torch.where`` to gather each expert's tokens: the loop count and the token counts are read from
    data ("Could not guard on data-dependent expression"). The experts are separate modules
    (an ``nn.ModuleDict``), so transformers' ``batched_mm`` experts do not apply. Same numbers as the
    loop (a token dropped by the capacity limit has no expert and stays 0); the cost is every expert's
    FLOPs on every token (``num_experts`` times the sparse layer's), which is the price of a graph
    without data-dependent shapes.
    Models: SwitchTransformersModel, SwitchTransformersForConditionalGeneration, SwitchTransformersEncoderModel.
    Upstream: transformers models/switch_transformers/modeling_switch_transformers.py
        (``SwitchTransformersExperts.forward``); pytorch/pytorch#125180 (data-dependent loops under export)
    Remove when: the model's experts use ``@use_experts_implementation`` (then the batched_mm patch serves).
    """

    def forward(self: Any, hidden_states: torch.Tensor, selected_experts: torch.Tensor, routing_weights: torch.Tensor) -> torch.Tensor:
        # selected_experts (tokens, k, experts) one-hot; routing_weights (tokens, k)
        weights = (selected_experts.to(routing_weights.dtype) * routing_weights[..., None]).sum(dim=1)
        return _dense_mixture(hidden_states, weights, lambda e, h: self[f"expert_{e}"](h), self.num_experts)

    return forward


@register_patch("dynamo", "transformers.models.dbrx.modeling_dbrx.DbrxExperts.forward", loaded_only=True)
def _patch_dbrx_experts_dense(_original: Any) -> Any:
    """DBRX's experts as a dense mixture: each expert's GLU on every token, weighted by the router's
    top-k weight (zero for experts it did not choose).

    Pattern: as :func:`_patch_switch_experts_dense`: ``for expert_idx in expert_hit`` over
    ``nonzero()``, then ``torch.where`` per expert; the experts' weights are fused tensors that
    transformers' ``batched_mm`` experts do not know. Same numbers as the loop up to summation order;
    costs ``moe_num_experts / moe_top_k`` times the sparse layer's FLOPs.
    Models: DbrxModel, DbrxForCausalLM.
    Upstream: transformers models/dbrx/modeling_dbrx.py (``DbrxExperts.forward``);
        pytorch/pytorch#125180 (data-dependent loops under export)
    Remove when: DBRX's experts use ``@use_experts_implementation``.
    """

    def forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        batch_size = hidden_states.shape[0]
        hidden_states = hidden_states.reshape(-1, self.hidden_size)
        # top_k_index, top_k_weights (tokens, k)
        chosen = top_k_index[..., None] == torch.arange(self.num_experts, device=top_k_index.device)
        weights = (chosen.to(top_k_weights.dtype) * top_k_weights[..., None]).sum(dim=1)
        shape = (-1, self.ffn_hidden_size, self.hidden_size)
        w1, v1, w2 = (p.view(shape) for p in (self.mlp.w1, self.mlp.v1, self.mlp.w2))
        out = _dense_mixture(hidden_states, weights, lambda e, h: self.mlp(h, w1[e], v1[e], w2[e]), self.num_experts)
        return out.view(batch_size, -1, self.hidden_size)

    return forward


@register_patch("dynamo", "transformers.models.step3p7.modeling_step3p7.Step3p7Experts.forward", loaded_only=True)
def _patch_step3p7_experts_dense(_original: Any) -> Any:
    """Step 3.7's experts as a dense mixture: each expert's clamped GLU on every token, weighted by the
    router's top-k weight (zero for experts it did not choose).

    Pattern: as :func:`_patch_dbrx_experts_dense`: ``for expert_idx in hit`` over ``nonzero()`` of a
    one-hot routing mask, then ``torch.where`` per expert; the class writes its own loop instead of
    ``@use_experts_implementation``. Index ``num_experts`` means "no expert" and adds nothing, as in
    the loop. Same numbers as the loop up to summation order; costs ``num_local_experts / top_k``
    times the sparse layer's FLOPs.
    Models: Step3p7Model, Step3p7ForCausalLM.
    Upstream: transformers models/step3p7/modeling_step3p7.py (``Step3p7Experts.forward``);
        pytorch/pytorch#125180 (data-dependent loops under export)
    Remove when: Step 3.7's experts use ``@use_experts_implementation``.
    """

    def forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        # hidden_states (tokens, hidden); top_k_index, top_k_weights (tokens, k)
        chosen = top_k_index[..., None] == torch.arange(self.num_experts, device=top_k_index.device)
        weights = (chosen.to(top_k_weights.dtype) * top_k_weights[..., None]).sum(dim=1)

        def expert(e: int, h: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(self._apply_gate(torch.nn.functional.linear(h, self.gate_up_proj[e])), self.down_proj[e])

        return _dense_mixture(hidden_states, weights, expert, self.num_experts)

    return forward


@register_patch("dynamo", "transformers.models.longcat_flash.modeling_longcat_flash.LongcatFlashExperts.forward", loaded_only=True)
def _patch_longcat_flash_experts_dense(_original: Any) -> Any:
    """LongCat-Flash's experts as a dense mixture: each routed expert's GLU, and each zero-computation
    (identity) expert, on every token, weighted by the router's top-k weight (zero for experts it did
    not choose).

    Pattern: as :func:`_patch_dbrx_experts_dense`: ``for expert_idx_tensor in expert_hit`` over
    ``nonzero()`` with ``.item()`` and ``torch.where`` per expert. Indices from ``n_routed_experts``
    on are identity experts (the token passes through, times its weight), as in the loop. Same
    numbers as the loop up to summation order; costs ``n_routed_experts / moe_topk`` times the sparse
    layer's FLOPs.
    Models: LongcatFlashModel, LongcatFlashForCausalLM.
    Upstream: transformers models/longcat_flash/modeling_longcat_flash.py (``LongcatFlashExperts.forward``);
        pytorch/pytorch#125180 (data-dependent loops under export)
    Remove when: LongCat-Flash's experts use ``@use_experts_implementation``.
    """

    def forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        # hidden_states (tokens, hidden); top_k_index, top_k_weights (tokens, k)
        chosen = top_k_index[..., None] == torch.arange(self.total_experts, device=top_k_index.device)
        weights = (chosen.to(top_k_weights.dtype) * top_k_weights[..., None]).sum(dim=1)

        def expert(e: int, h: torch.Tensor) -> torch.Tensor:
            if e >= self.num_routed_experts or self.gate_up_proj is None:
                return self.identity_expert(h)
            gate, up = torch.nn.functional.linear(h, self.gate_up_proj[e]).chunk(2, dim=-1)
            return torch.nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e])

        return _dense_mixture(hidden_states, weights, expert, self.total_experts)

    return forward
