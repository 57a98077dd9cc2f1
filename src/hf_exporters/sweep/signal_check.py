"""Whether a tiny model's eager outputs carry signal: the rule that keeps a sweep pass from being vacuous.

A parity check passes when the artifact's outputs are within the backend's tolerance of eager's. When
eager's outputs are themselves below that tolerance (a tiny model whose activations vanish through its
layers, a tower initialised at 1e-10), an artifact returning zeros passes too; when they do not depend
on the input, an artifact returning constants does. :func:`judge` decides, from eager alone, whether a
job can say anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: the loosest parity tolerance of the backends (ONNX and ExecuTorch 1e-3, torch.export 1e-4); a test keeps
#: it equal to the exporters' ``default_atol``
LOOSEST_ATOL = 1e-3
#: how far above the loosest tolerance a signal must be
SIGNAL_FACTOR = 10
#: the floor: every compared floating output leaf must reach it in magnitude, and the main output must change by it
SIGNAL_FLOOR = SIGNAL_FACTOR * LOOSEST_ATOL

RULE = (
    f"a job's eager outputs carry signal when every floating output leaf the parity check compares (not empty) has "
    f"max |x| >= {SIGNAL_FLOOR:g} ({SIGNAL_FACTOR} x the loosest backend tolerance, {LOOSEST_ATOL:g}, the same floor "
    "for every backend so a class is judged alike in every group; a leaf exactly zero on both input sets, a "
    "constant of the model's code such as a scaler's `loc`, is listed as `zero` and exempt), and the main output "
    f"(`last_hidden_state` when the model returns one, else its first floating leaf not named as a loss, else its "
    f"first leaf) changes between two input sets of the same shapes and other values (the sweep's inputs drawn "
    f"with seeds 0 and 1) by max |a - b| >= {SIGNAL_FLOOR:g}, or in any element for integers, or in shape; "
    "otherwise the job is the setup failure `degenerate model` (stage `signal`), never a pass"
)

#: the output a model's main output is, when it returns it
MAIN_OUTPUT = "last_hidden_state"


def _figure(value: float | None) -> float | None:
    """``value`` to 4 significant digits for the record (None, inf and NaN kept as None / strings JSON takes)."""
    if value is None:
        return None
    if math.isnan(value) or math.isinf(value):
        return value
    return float(f"{value:.4g}")


def _real(tensor: Any) -> Any:
    """``tensor`` as float64 values (a complex one as its real and imaginary parts, booleans as 0 and 1)."""
    import torch

    tensor = tensor.detach()
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return tensor.to(torch.float64)


def leaf_figures(tensor: Any) -> tuple[float, float]:
    """``(max |x|, std)`` over the finite values of a tensor (0.0 for none)."""
    import torch

    values = _real(tensor).reshape(-1)
    values = values[torch.isfinite(values)]
    if not values.numel():
        return 0.0, 0.0
    std = float(values.std(unbiased=False)) if values.numel() > 1 else 0.0
    return float(values.abs().max()), std


def change(a: Any, b: Any) -> float | None:
    """max |a - b| over the elements finite in both (integers compared exactly); inf when the shapes differ (an output
    whose length follows the input, such as a spectrogram whose frames follow predicted durations); None without
    ``b``."""
    import torch

    if a is None or b is None:
        return None
    if tuple(a.shape) != tuple(b.shape):
        return math.inf
    if not a.numel():
        return 0.0
    x, y = _real(a), _real(b)
    both = torch.isfinite(x) & torch.isfinite(y)
    delta = (x - y).abs()[both]
    return float(delta.max()) if delta.numel() else 0.0


def judge(
    first: Sequence[tuple[str, Any]], second: Sequence[tuple[str, Any]] | None, floor: float = SIGNAL_FLOOR
) -> dict[str, Any]:
    """The signal verdict of eager's outputs (see :data:`RULE`).

    ``first``: eager's ``(name, tensor)`` leaves on the sweep's inputs; ``second``: on inputs of the same shapes
    and other values (None when there were none). Returns the record's ``signal`` entry: ``floor``, ``main`` (the
    main output's name), ``leaves`` (per leaf: ``name``, ``max_abs``, ``std``, ``change``; integer leaves with
    ``integer: True`` and no magnitude), ``silent`` (floating leaves below the floor), ``zero`` (exempt: exactly
    zero on both sets), ``main_change``, ``ok`` and, when not ok, ``reason`` (one line).
    """
    others = {name: tensor for name, tensor in second} if second is not None else {}
    leaves: list[dict[str, Any]] = []
    silent: list[str] = []
    zero: list[str] = []
    for name, tensor in first:
        floating = bool(tensor.is_floating_point() or tensor.is_complex())
        moved = change(tensor, others.get(name)) if second is not None else None
        entry: dict[str, Any] = {"name": name}
        if floating:
            peak, spread = leaf_figures(tensor)
            entry.update(max_abs=_figure(peak), std=_figure(spread))
            if tensor.numel() and peak < floor:
                if peak == 0.0 and moved == 0.0 and not bool(tensor.isnan().any()):
                    zero.append(name)  # exactly zero whatever the input: a constant of the model's code
                else:
                    silent.append(name)
        else:
            entry["integer"] = True
        entry["change"] = _figure(moved)
        leaves.append(entry)
    floating_names = [e["name"] for e in leaves if not e.get("integer")]
    candidates = [n for n in floating_names if n == MAIN_OUTPUT] or [
        n for n in floating_names if n != "loss" and not n.endswith("_loss")
    ] or floating_names or [e["name"] for e in leaves]
    main = candidates[0] if candidates else None
    main_entry = next((e for e in leaves if e["name"] == main), None)
    main_change = main_entry["change"] if main_entry is not None else None
    if main in zero:  # the main output is judged by its change, whatever it is
        zero.remove(main)
        silent.append(main)
    verdict: dict[str, Any] = {
        "floor": floor, "main": main, "main_change": main_change, "silent": silent, "zero": zero, "leaves": leaves,
        "ok": True,
    }
    reasons = []
    if not first:
        reasons.append("the model returns no tensor")
    if silent:
        shown = ", ".join(f"{e['name']} (max |x| {e['max_abs']:.3g})" for e in leaves if e["name"] in silent)
        more = ""
        if len(silent) > 4:
            shown = ", ".join(f"{e['name']} (max |x| {e['max_abs']:.3g})" for e in leaves if e["name"] in silent[:4])
            more = f" and {len(silent) - 4} more"
        reasons.append(f"outputs below {floor:g} in magnitude: {shown}{more}")
    if main_entry is not None:
        integer = main_entry.get("integer", False)
        if main_change is None:
            reasons.append(f"the main output {main} was not compared on a second input set (the sweep's inputs drawn with another seed hold the same values)")
        elif (main_change == 0.0) if integer else (main_change < floor):
            reasons.append(f"the main output {main} does not change with the input (max change {main_change:.3g} between two input sets)")
    if reasons:
        verdict["ok"] = False
        verdict["reason"] = "degenerate model: " + "; ".join(reasons) + " (an artifact returning zeros or constants would pass)"
    return verdict
