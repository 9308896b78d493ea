"""The numpy side both frameworks share: weight bugs (so the torch target and the MindSpore
port get the very same edit), the fixed target of the "mse" loss, and the numbers the harness
uses to check that a bug changes something (its *effect*). Needs numpy only: the MindSpore
child process imports it without torch."""
from __future__ import annotations

from typing import Dict, Mapping, Optional

import numpy as np

from .spec import WeightEdit


def edit_array(array: np.ndarray, how: str) -> np.ndarray:
    """One parameter with the bug applied (a new array; the input is left alone)."""
    a = np.array(array, copy=True)
    if how == "transpose":              # Linear (out, in) / conv kernel (.., kh, kw): last two axes
        if a.shape[-1] != a.shape[-2]:
            raise ValueError(f"transpose needs square last axes, got {a.shape}")
        return np.ascontiguousarray(np.swapaxes(a, -1, -2))
    if how == "perturb":                # one element, by half the largest magnitude
        a.flat[a.size // 2 + 1] += 0.5 * float(np.abs(a).max())
        return a
    if how == "cancel_row":             # a constant on one output row: x . (w + c) = x . w when sum(x) = 0
        a[1] += 0.25
        return a
    if how == "swap_blocks":            # LSTM gate blocks (i, f, g, o) stored as (i, g, f, o)
        q = a.shape[0] // 4
        a[q:2 * q], a[2 * q:3 * q] = array[2 * q:3 * q], array[q:2 * q]
        return a
    raise ValueError(f"unknown weight edit {how!r}")


def apply_edit(state: Mapping[str, np.ndarray], edit: Optional[WeightEdit]) -> Dict[str, np.ndarray]:
    out = dict(state)
    if edit is not None:
        if edit.param not in out:
            raise KeyError(f"weight edit names {edit.param!r}, not a parameter of the model: {sorted(out)[:8]}...")
        out[edit.param] = edit_array(out[edit.param], edit.how)
    return out


def effect(golden: Mapping[str, np.ndarray], target: Mapping[str, np.ndarray]) -> Dict[str, float]:
    """How far the target's loss / output / parameters / gradients are from golden's, per
    group: max |t - g| over the group's tensors / max |g| over them (inf on a shape mismatch).
    Tells whether a bug changes anything at all, and how much float noise a clean pair has."""
    diff: Dict[str, float] = {}
    scale: Dict[str, float] = {}
    for name, g in golden.items():
        if name not in target:
            continue
        group = name.split(":", 1)[0]
        g64, t64 = np.asarray(g, dtype=np.float64), np.asarray(target[name], dtype=np.float64)
        d = float(np.abs(t64 - g64).max()) if g64.shape == t64.shape and g64.size else (0.0 if g64.shape == t64.shape else float("inf"))
        diff[group] = max(diff.get(group, 0.0), d)
        scale[group] = max(scale.get(group, 0.0), float(np.abs(g64).max()) if g64.size else 0.0)
    return {k: diff[k] / (scale[k] or 1.0) for k in diff}


def mse_target(shape) -> np.ndarray:
    """The fixed random target of the "mse" loss (the same numbers for the MindSpore port)."""
    return np.random.default_rng(99).standard_normal(tuple(shape)).astype(np.float32)
