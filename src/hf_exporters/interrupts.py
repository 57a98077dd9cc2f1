"""Interrupts that always stop an export: SIGINT (Ctrl-C) and SIGTERM.

Python delivers a signal by raising ``KeyboardInterrupt`` wherever the main thread happens to be. When
that is a ``__del__`` method or a weakref callback (ExecuTorch's lowering runs many), the interpreter
prints "Exception ignored" and carries on, so the export would finish and exit 0. Inside
:func:`handled`, the handler also records the signal, and :func:`check` (called between pipeline steps
and before a folder is moved into place) raises again; the command then exits with ``128 + signal``
(130 for SIGINT, 143 for SIGTERM) and the staging folder is removed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_received: int | None = None


class Interrupted(KeyboardInterrupt):
    """An export stopped by SIGINT or SIGTERM. ``signum`` is the signal; ``exit_code`` is ``128 + signum``."""

    def __init__(self, signum: int):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


def _handler(signum: int, frame: object) -> None:
    global _received
    _received = signum
    raise Interrupted(signum)


def check() -> None:
    """Raise :class:`Interrupted` when a signal arrived inside :func:`handled` (even one whose first
    ``KeyboardInterrupt`` was swallowed)."""
    if _received is not None:
        raise Interrupted(_received)


def received() -> int | None:
    """The signal received inside the current :func:`handled` block, or None."""
    return _received


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Route SIGINT and SIGTERM to :class:`Interrupted` for the block (main thread only; elsewhere a no-op),
    and restore the previous handlers after it."""
    global _received
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received = None
    previous = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _received = None
