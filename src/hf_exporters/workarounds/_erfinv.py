"""The inverse error function as polynomials, for the backends that have no ``erfinv``.

M. Giles, "Approximating the erfinv function", GPU Computing Gems Jade Edition (2011): with
w = -log((1 - x)(1 + x)), erfinv(x) = x * p(w - 2.5) where w < 5 (the central region) and
x * q(sqrt(w) - 3) in the tails; relative error about 4e-7 (float32-grade). The coefficients below are
highest degree first.
"""

from __future__ import annotations

from typing import Any

ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 2.1858087e-04,
                  -1.25372503e-03, -4.17768164e-03, 0.246640727, 1.50140941)
ERFINV_TAIL = (-2.00214257e-04, 1.00950558e-04, 1.34934322e-03, -3.67342844e-03, 5.73950773e-03,
               -7.6224613e-03, 9.43887047e-03, 1.00167406, 2.83297682)


def erfinv_torch(x: Any) -> Any:
    """``torch.erfinv(x)`` from elementwise torch ops (shape and dtype of ``x``; computed in float32):
    ±1 give ±inf and |x| > 1 gives NaN, as torch does."""
    import torch

    value = x.float()
    w = -torch.log((1 - value) * (1 + value))
    central, tail = torch.zeros_like(value), torch.zeros_like(value)
    shifted, rooted = w - 2.5, torch.sqrt(w) - 3
    for c in ERFINV_CENTRAL:
        central = central * shifted + c
    for c in ERFINV_TAIL:
        tail = tail * rooted + c
    result = torch.where(w < 5, central, tail) * value
    result = torch.where(value.abs() == 1, value * float("inf"), result)
    return result.to(x.dtype)
