"""ExecuTorch's LLM custom operators for a key/value cache held in the program (``--kv-cache program``).

ExecuTorch ships two operators for a decoder whose cache lives in the program, with kernels in the
wheel's ``extension/llm/custom_ops`` library (``libcustom_ops_aot_lib``):

- ``llama::update_cache(value (B, q, H_kv, D), cache (B, M, H_kv, D), start_pos)`` writes a step's ``q``
  keys or values into the cache at ``start_pos .. start_pos + q - 1``, in place;
- ``llama::custom_sdpa(query (B, q, H, D), key_cache, value_cache, start_pos, mask, dropout, is_causal,
  scale) -> (B, q, H, D)`` attends causally over the positions ``0 .. start_pos + q - 1`` only, where
  attention over a static cache (``torch.nn.functional.scaled_dot_product_attention``) reads all ``M``
  positions on every step, masked. Grouped-query attention (``H`` a multiple of ``H_kv``) is handled by
  the kernel.

Both take the sequence axis before the heads (``(B, S, H, D)``), as ExecuTorch's LLM runner keeps its
caches. The layer :func:`custom_op_layer_class` and the attention function :data:`ATTENTION` (registered
with transformers' ``AttentionInterface`` on first use) use them; :class:`ProgramCacheStep` switches a
model's attention to them for its own forward only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from ..deps import require
from ..errors import InputError

#: the name the custom-operator attention is registered under in transformers' attention interfaces
ATTENTION = "hfx_executorch_custom_sdpa"

#: the write and read position of the step that is running (a symbolic size while it is traced), with the
#: number of attention calls that went through :data:`ATTENTION` in it
_START: list[tuple[Any, list[int]]] = []


def load_custom_ops() -> bool:
    """Register ExecuTorch's LLM custom operators with torch (``torch.ops.llama``), with their shapes for
    tracing (ExecuTorch's ``custom_ops`` module, which loads the library and so registers their kernels with
    this process's ExecuTorch runtime too). Returns False where the installed executorch ships none."""
    try:
        require("executorch.extension.llm.custom_ops.custom_ops", "ExecuTorch's custom SDPA and cache-update operators")
    except Exception:  # noqa: BLE001 - an executorch without them: the caller says so
        return False
    return True


def _start() -> Any:
    if not _START:
        raise RuntimeError(f"the {ATTENTION} attention runs inside ProgramCacheStep.forward only")
    return _START[-1][0]


def _custom_sdpa_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, scaling: float | None = None,
    dropout: float = 0.0, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature over ``llama::custom_sdpa``: ``query`` ``(B, H, q, D)``,
    ``key`` and ``value`` the layer's whole caches ``(B, M, H_kv, D)`` as :func:`custom_op_layer_class`'s
    update returns them; ``attention_mask`` is not read (the kernel is causal from the start position, and
    the program runs one unpadded row). Returns ``((B, q, H, D), None)``.

    Raises:
        InputError: the attention asks for what the kernel does not do (logit soft-capping, attention sinks).
    """
    for name in ("softcap", "s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise InputError(f"ExecuTorch's custom SDPA has no {name} ({type(module).__name__} uses it); export with --no-custom-sdpa")
    start = _start()
    _START[-1][1][0] += 1
    return torch.ops.llama.custom_sdpa(query.transpose(1, 2), key, value, start, None, 0.0, True, scaling), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask function of :data:`ATTENTION`: none (``llama::custom_sdpa`` is causal from its start position)."""
    return None


def register_attention() -> None:
    """Register :data:`ATTENTION` with transformers' attention and mask interfaces (again where a patched
    region that swapped their mappings dropped it)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if ATTENTION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(ATTENTION, _custom_sdpa_attention)
    if ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(ATTENTION, _no_mask)


@functools.cache
def custom_op_layer_class() -> type:
    """A ``StaticLayer`` whose ``keys`` and ``values`` are ``(1, M, H_kv, D)`` and whose update writes the
    new ``(1, H_kv, q, D)`` keys and values at the step's start position with ``llama::update_cache``."""
    from transformers.cache_utils import StaticLayer

    class CustomOpLayer(StaticLayer):
        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            torch.ops.llama.update_cache(key_states.transpose(1, 2), self.keys, _start())
            torch.ops.llama.update_cache(value_states.transpose(1, 2), self.values, _start())
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return 0  # not read: the step passes cache_position

    return CustomOpLayer


def _configs(config: Any) -> list[Any]:
    """``config`` and its sub-configs, recursively (transformers sets an attention implementation on all)."""
    found = [config]
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "_attn_implementation"):
            found.extend(_configs(sub))
    return found


@contextlib.contextmanager
def custom_op_attention(config: Any, start: Any) -> Iterator[list[int]]:
    """While the block runs, the model of ``config`` attends with :data:`ATTENTION` and the custom-operator
    layers write and read at ``start`` (an int, or the symbolic value of ``cache_position[0]`` while
    traced); the attention implementation of ``config`` and of each of its sub-configs is restored after.
    Yields ``[calls]``: how many attention calls went through :data:`ATTENTION` (a model whose attention
    does not use transformers' attention interface makes fewer than it has layers)."""
    register_attention()
    configs = _configs(config)
    saved = [c._attn_implementation_internal for c in configs]
    calls = [0]
    _START.append((start, calls))
    try:
        config._attn_implementation = ATTENTION
        yield calls
    finally:
        _START.pop()
        for c, implementation in zip(configs, saved):
            c._attn_implementation_internal = implementation
