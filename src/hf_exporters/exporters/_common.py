"""Helpers shared by the exporters: input normalisation, model state, error attribution."""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ..errors import ExportStageError, HfExportersError, InputError

# Tensor attributes some models set on a submodule inside forward (a rotary table cached for the
# last sequence length). A trace leaves traced tensors there, which break the next eager forward.
# Stage 5 of DynamoExporter saves them, clears them for the trace, and afterwards restores them or
# removes the ones the trace created.
_STATEFUL_CACHE_ATTRS: tuple[str, ...] = (
    "cached_rotary_positional_embedding",  # wav2vec2-bert, seamless-m4t: rotary table per length
    "cached_sequence_length",  # the length that table was built for
    "long_inv_freq",  # longrope rotary embeddings (Phi-3, Phi-MoE, ...): long-context frequencies, set lazily
    "full_attention_long_inv_freq",  # the same, per layer type, for models with several rotary types
    "sliding_attention_long_inv_freq",
)

_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(__file__))
_STDLIB_DIR = os.path.dirname(os.__file__)


@contextlib.contextmanager
def existing_objects_frozen() -> Iterator[Callable[[], None]]:
    """Leave the objects that exist when an export starts out of the cyclic garbage collector's passes
    until it ends (``gc.freeze()``, then ``gc.unfreeze()``).

    The pattern: a process that has imported torch, transformers and a model holds millions of
    long-lived objects, and every full collection the export's allocations trigger walks them all. A
    first ExecuTorch export of a 2-layer Llama spent 0.7 s of its 4.8 s in three such collections. The
    objects stay alive and are freed by reference counting as before; only their cycles wait for the
    first collection after the export.

    Yields ``freeze_new()``, which leaves out the objects made since as well (the modules an export imports
    on first use: an ExecuTorch export's first full collection walked them all, 0.2 s for MiniLM).

    Nothing is done where freezing is already in use (``gc.get_freeze_count() > 0``: an export nested in
    another, or a process that froze its own objects, which stay frozen) or the collector is disabled.
    """
    if gc.get_freeze_count() or not gc.isenabled():
        yield lambda: None
        return
    gc.freeze()
    try:
        yield gc.freeze
    finally:
        gc.unfreeze()


def normalize_inputs(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """A plain ``dict`` of forward keyword arguments (a tokenizer's ``BatchEncoding`` included).

    Raises:
        InputError: ``inputs`` is not a mapping with string keys.
    """
    if not isinstance(inputs, Mapping) and not hasattr(inputs, "keys"):
        raise InputError(f"inputs must be a mapping of forward keyword arguments, got {type(inputs).__name__}")
    out = {}
    for key in inputs.keys():
        if not isinstance(key, str):
            raise InputError(f"input names must be strings, got {key!r}")
        out[key] = inputs[key]
    return out


def clone_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """A copy with every tensor detached and cloned, caches rebuilt: forward mutates caches in place,
    and each run needs the original state."""
    from ..shapes import clone_tree

    return clone_tree(inputs)


@contextlib.contextmanager
def flat_forward_signature(model: torch.nn.Module, names: list[str]) -> Iterator[None]:
    """Give ``model.forward`` the explicit signature ``forward(name0=None, name1=None, ...)``.

    transformers forwards take ``**kwargs``; torch.export then folds the inputs into one tuple that
    does not match a ``dynamic_shapes`` keyed by input name. The instance attribute set here is
    removed afterwards (or the earlier one put back).
    """
    had_own = "forward" in vars(model)
    previous = vars(model).get("forward")

    def forward(**kwargs: Any) -> Any:
        # looked up at call time: a Stage 2 patch of the model class's own forward then takes effect
        if had_own:
            return previous(**kwargs)
        return inspect.getattr_static(type(model), "forward").__get__(model, type(model))(**kwargs)

    forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for n in names]
    )
    model.forward = forward
    try:
        yield
    finally:
        if had_own:
            model.forward = previous
        else:
            del model.forward


@contextlib.contextmanager
def cleared_model_state(model: torch.nn.Module) -> Iterator[int]:
    """Clear each ``_STATEFUL_CACHE_ATTRS`` attribute of every submodule for the trace; afterwards put
    back the saved values and delete the ones the trace created.

    Yields the number of attributes cleared."""
    modules = list(model.modules())
    saved = [(m, name, getattr(m, name)) for m in modules for name in _STATEFUL_CACHE_ATTRS if hasattr(m, name)]
    for module, name, _ in saved:
        setattr(module, name, None)
    try:
        yield len(saved)
    finally:
        kept = {(id(m), name) for m, name, _ in saved}
        for module in modules:
            for name in _STATEFUL_CACHE_ATTRS:
                if (id(module), name) not in kept and name in vars(module):
                    delattr(module, name)
        for module, name, value in saved:
            setattr(module, name, value)


def blamed_line(error: BaseException) -> str | None:
    """``file:line`` of the innermost frame outside torch and hf-exporters in ``error``'s traceback:
    the model source line the trace stopped on."""
    frames = traceback.extract_tb(error.__traceback__)
    cause = error.__cause__ or error.__context__
    while cause is not None and len(frames) < 1000:
        frames += traceback.extract_tb(cause.__traceback__)
        cause = cause.__cause__ or cause.__context__
    candidates = [
        f
        for f in frames
        if not f.filename.startswith(_TORCH_DIR)
        and not f.filename.startswith(_OWN_DIR)
        and not (f.filename.startswith(_STDLIB_DIR) and "site-packages" not in f.filename)
        and not f.filename.startswith("<")
    ]
    if not candidates:
        return None
    frame = candidates[-1]
    return f"{frame.filename}:{frame.lineno} ({frame.name}: {(frame.line or '').strip()})"


def first_line(error: BaseException, limit: int = 400) -> str:
    """The error's type and first meaningful line, shortened to ``limit`` characters."""
    text = str(error).strip() or type(error).__name__
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), text)
    line = f"{type(error).__name__}: {line}"
    return line if len(line) <= limit else line[: limit - 3] + "..."


@contextlib.contextmanager
def stage(exporter: str, title: str, seconds: dict[str, float] | None = None) -> Iterator[None]:
    """Attribute any exception raised in the block to ``title`` of ``exporter`` (an ExportStageError).

    With ``seconds``, the block's wall time in seconds is added to ``seconds[title]`` (also when it raises).
    """
    started = time.perf_counter()
    try:
        yield
    except ExportStageError:
        raise
    except Exception as error:  # noqa: BLE001 - every failure is reported with its stage
        # a refusal of ours (raised inside the trace, say) names what to change: no model line to blame
        blamed = None if isinstance(error, HfExportersError) else blamed_line(error)
        raise ExportStageError(exporter, title, first_line(error), blamed) from error
    finally:
        if seconds is not None:
            seconds[title] = seconds.get(title, 0.0) + time.perf_counter() - started
