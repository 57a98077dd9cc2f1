"""Capture strategies: the ways the exporters trace a model into a ``torch.export.ExportedProgram``.

A strategy is a small object called as ``strategy(model, inputs, dynamic_shapes, config)``; it never
raises, it returns a :class:`CaptureResult` holding either the program or the exception. The
exporters try an ordered list of them (:func:`strategies_for`) with :func:`capture`:

1. :class:`SizeObliviousTrace` (dynamic exports only): ``torch.export.export`` under size-oblivious
   reasoning, so an example size of 0 or 1 does not pin its axis.
2. :class:`PlainTrace`: ``torch.export.export`` with plain size reasoning. For a static export it is
   the only strategy; after a failed size-oblivious trace it is the fallback for models that broadcast
   a size their config fixes, which size-oblivious reasoning assumes is never 1.

A data-dependent guard (``GuardOnDataDependentSymNode``) is not retried: it is a guard on data, not
on sizes, and no strategy can help.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..config import DynamoConfig
from ..shapes import size_oblivious_sizes
from ._common import cleared_model_state, clone_inputs, first_line

logger = logging.getLogger("hf_exporters")


@dataclasses.dataclass
class CaptureResult:
    """What one strategy's attempt gave.

    Attributes:
        strategy: the strategy's name.
        program: the traced ``ExportedProgram``, or None when the attempt failed.
        error: the exception the attempt raised, or None.
        size_oblivious: whether the strategy traces under size-oblivious reasoning.
    """

    strategy: str
    program: torch.export.ExportedProgram | None
    error: Exception | None = None
    size_oblivious: bool = False

    @property
    def success(self) -> bool:
        return self.program is not None


class CaptureStrategy:
    """One way to trace ``model(**inputs)``; subclasses implement :meth:`_capture`."""

    #: the name results and ``export.json`` (``capture_strategy``) report
    name = "capture"
    #: whether :meth:`_capture` traces under size-oblivious reasoning
    size_oblivious = False
    #: how it reasons about sizes, as an error note names it (``traced again with <reasoning>, ...``)
    reasoning = "its own reasoning"

    def __call__(self, model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any, config: DynamoConfig) -> CaptureResult:
        """Trace; return the program or the exception in a :class:`CaptureResult` (never raises an ``Exception``)."""
        try:
            program = self._capture(model, inputs, dynamic_shapes, config)
        except Exception as error:  # noqa: BLE001 - the caller decides what a failure means
            return CaptureResult(self.name, None, error, self.size_oblivious)
        return CaptureResult(self.name, program, None, self.size_oblivious)

    def _capture(self, model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any, config: DynamoConfig) -> torch.export.ExportedProgram:
        raise NotImplementedError

    @staticmethod
    def _export(model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any, config: DynamoConfig) -> torch.export.ExportedProgram:
        """``torch.export.export`` of ``model(**inputs)`` on fresh copies of the inputs (a forward
        mutates caches in place)."""
        return torch.export.export(
            model,
            args=(),
            kwargs=clone_inputs(dict(inputs)),
            dynamic_shapes=dynamic_shapes,
            strict=config.strict,
            prefer_deferred_runtime_asserts_over_guards=config.prefer_deferred_runtime_asserts_over_guards,
        )


class SizeObliviousTrace(CaptureStrategy):
    """``torch.export.export`` under :func:`~hf_exporters.shapes.size_oblivious_sizes`: an example
    size of 0 or 1 stays symbolic instead of being specialised."""

    name = "size-oblivious trace"
    size_oblivious = True
    reasoning = "size-oblivious reasoning"

    def _capture(self, model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any, config: DynamoConfig) -> torch.export.ExportedProgram:
        with size_oblivious_sizes():
            return self._export(model, inputs, dynamic_shapes, config)


class PlainTrace(CaptureStrategy):
    """``torch.export.export`` with plain size reasoning: sizes a model broadcasts or compares are
    guarded, and axes those guards pin end static (reported as ``static_axes``)."""

    name = "plain trace"
    reasoning = "plain size reasoning"

    def _capture(self, model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any, config: DynamoConfig) -> torch.export.ExportedProgram:
        return self._export(model, inputs, dynamic_shapes, config)


def strategies_for(dynamic_shapes: Any) -> list[CaptureStrategy]:
    """The strategies tried, in order: a size-oblivious then a plain trace when ``dynamic_shapes`` is
    given, a plain trace alone for a static export."""
    if dynamic_shapes is None:
        return [PlainTrace()]
    return [SizeObliviousTrace(), PlainTrace()]


def is_data_dependent(error: BaseException | None) -> bool:
    """Whether ``error``, or an error it was raised from, is a guard on data (``GuardOnDataDependentSymNode``)."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    seen = 0
    while error is not None and seen < 50:
        if isinstance(error, GuardOnDataDependentSymNode) or "data-dependent expression" in str(error):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def capture(
    model: torch.nn.Module,
    inputs: Mapping[str, Any],
    dynamic_shapes: Any,
    config: DynamoConfig,
    strategies: Sequence[CaptureStrategy],
) -> tuple[CaptureResult, list[CaptureResult]]:
    """Try ``strategies`` in order until one traces ``model(**inputs)``.

    A strategy after a failed one runs with the model's cached forward state cleared
    (:func:`~hf_exporters.exporters._common.cleared_model_state`), so nothing the failed trace cached
    reaches it. A failure that is a data-dependent guard (:func:`is_data_dependent`) stops the list.

    Returns:
        ``(the successful result, the failed results before it)``.

    Raises:
        Exception: the first strategy's exception when every strategy tried failed, with one note per
            later failure (``traced again with plain size reasoning, it failed too: <its first line>``).
        ValueError: ``strategies`` is empty.
    """
    if not strategies:
        raise ValueError("capture needs at least one strategy")
    failed: list[CaptureResult] = []
    tried: list[CaptureStrategy] = []
    for strategy in strategies:
        tried.append(strategy)
        state = cleared_model_state(model) if failed else contextlib.nullcontext()
        with state:
            result = strategy(model, inputs, dynamic_shapes, config)
        if result.success:
            if failed:
                logger.info(
                    "%s: traced with the %s after the %s failed (%s)",
                    type(model).__name__,
                    result.strategy,
                    failed[0].strategy,
                    first_line(failed[0].error),
                )
            return result, failed
        failed.append(result)
        if is_data_dependent(result.error):
            break  # a guard on data, not on sizes: tracing again cannot help
    first = failed[0].error
    assert first is not None
    for strategy, other in zip(tried[1:], failed[1:]):
        first.add_note(f"traced again with {strategy.reasoning}, it failed too: {first_line(other.error)}")
    raise first


__all__ = ["CaptureResult", "CaptureStrategy", "PlainTrace", "SizeObliviousTrace", "capture", "is_data_dependent", "strategies_for"]
