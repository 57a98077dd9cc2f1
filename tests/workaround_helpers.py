"""Helpers for the tests that show a workaround is needed: export once without it, once with it."""

import contextlib
from collections.abc import Iterator

from hf_exporters import registry


@contextlib.contextmanager
def without_workarounds(*names: str) -> Iterator[None]:
    """The registry without the workarounds whose functions are named ``names``; restored after.

    Raises:
        LookupError: a name matches no registered workaround (a renamed one would make the test vacuous).
    """
    saved = registry._REGISTRY[:]
    unknown = set(names) - {w.func.__name__ for w in saved}
    if unknown:
        raise LookupError(f"no registered workaround named {sorted(unknown)}")
    registry._REGISTRY[:] = [w for w in saved if w.func.__name__ not in names]
    try:
        yield
    finally:
        registry._REGISTRY[:] = saved
