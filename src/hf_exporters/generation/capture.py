"""Capture: run a real ``generate()`` for two new tokens and record what each step was called with.

:func:`decompose_for_generation` is where every part's example inputs come from (see
:mod:`hf_exporters.generation.parts`): the prefill and decode calls of the model's ``forward`` (and
of its encoder, for an encoder-decoder model), copied when the call was made.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ..errors import InputError
from ..pytree import register_model_pytrees
from ..shapes import clone_tree


def _clone(value: Any) -> Any:
    register_model_pytrees(None, value)
    try:
        return clone_tree(value)
    except TypeError:  # a cache the generic flatten cannot walk: keep a deep copy
        return copy.deepcopy(value)


@contextlib.contextmanager
def _capture_calls(module: torch.nn.Module) -> Iterator[list[dict[str, Any]]]:
    """Record the keyword arguments (positional ones bound to their names) of every ``module`` call."""
    calls: list[dict[str, Any]] = []
    signature = inspect.signature(module.forward)

    def hook(mod: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        bound = signature.bind_partial(*args, **kwargs).arguments
        flat: dict[str, Any] = {}
        for name, value in bound.items():
            kind = signature.parameters[name].kind
            if kind == inspect.Parameter.VAR_KEYWORD:
                flat.update(value)
            elif kind != inspect.Parameter.VAR_POSITIONAL:
                flat[name] = value
        calls.append({k: _clone(v) for k, v in flat.items()})

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def encoder_of(model: torch.nn.Module) -> torch.nn.Module | None:
    if not getattr(model.config, "is_encoder_decoder", False):
        return None
    get = getattr(model, "get_encoder", None)
    return get() if callable(get) else None


def decompose_for_generation(model: torch.nn.Module, inputs: Mapping[str, Any], generation_config: Any = None) -> dict[str, dict[str, Any]]:
    """Run ``model.generate(**inputs)`` for two new tokens and capture the keyword arguments of each step.

    Args:
        model: a transformers generative model (``GenerationMixin``).
        inputs: ``generate()`` keyword arguments: ``input_ids (B, T)``, ``attention_mask (B, T)``,
            ``input_features (B, F, N)`` (speech), ...
        generation_config: optional ``GenerationConfig`` (e.g. ``cache_implementation="static"``).

    Returns:
        ``{"prefill": kwargs, "decode": kwargs}`` for decoder-only models; encoder-decoder models add
        ``"encoder"`` (the encoder's kwargs) and the prefill/decode kwargs are the decoder steps;
        ``"generate"`` holds ``{"sequences": ids generate() returned}``. Tensors
        and caches are copies taken when the call was made (a decode step's cache is the filled one).

    Raises:
        InputError: ``generate()`` failed with these inputs, or did not call ``forward`` once per token.
    """
    config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    config.max_new_tokens = config.min_new_tokens = 2
    config.do_sample = False
    encoder = encoder_of(model)
    with contextlib.ExitStack() as stack, torch.no_grad():
        calls = stack.enter_context(_capture_calls(model))
        encoder_calls = stack.enter_context(_capture_calls(encoder)) if encoder is not None else []
        try:
            generated = model.generate(**_clone(dict(inputs)), generation_config=config)
        except Exception as error:  # noqa: BLE001 - reported with the inputs given
            raise InputError(f"generate() failed for {type(model).__name__} with inputs {sorted(inputs)}: {error}") from error
    if len(calls) < 2:
        raise InputError(
            f"{type(model).__name__}.generate() called forward {len(calls)} time(s) for 2 new tokens; "
            "a generation loop that bypasses forward() cannot be decomposed"
        )
    captured = {"prefill": calls[0], "decode": calls[1]}
    sequences = getattr(generated, "sequences", generated)
    captured["generate"] = {"sequences": sequences.clone() if isinstance(sequences, torch.Tensor) else None}
    if encoder is not None:
        if not encoder_calls:
            raise InputError(f"{type(model).__name__}.generate() did not call its encoder")
        captured["encoder"] = encoder_calls[0]
    return captured

