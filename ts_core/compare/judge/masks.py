"""One attention mask in two encodings: boolean (``True`` = attend, or ``True`` = masked) and
additive float (``0`` where attended, a large negative number where not).

transformers' eager attention takes an additive mask, its sdpa path the boolean one; a model
run both ways passes each module the same mask in another encoding. Compared as numbers they
differ everywhere (0 vs 1); they are the same mask when the float is 0 exactly where the
boolean attends and very negative elsewhere. Imports numpy only.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ...dumpfmt.dtypes import precision
from ..predicates import is_bool, numel

MASKED_BELOW = -1e4          # an additive mask's "not attended" entries are at most this


def encodings_differ(g: dict, t: dict) -> bool:
    """One side boolean, the other floating: the two encodings of a mask, if a mask at all."""
    return (is_bool(g) and precision(t.get("dtype")) is not None) or \
        (is_bool(t) and precision(g.get("dtype")) is not None)


def same_mask(b: np.ndarray, f: np.ndarray) -> Optional[str]:
    """``b`` boolean, ``f`` float of as many elements: the convention under which they are one
    mask ("True = attend" / "True = masked"), or None."""
    b = np.asarray(b, dtype=bool).reshape(-1)
    f = np.asarray(f, dtype=np.float64).reshape(-1)
    if b.size != f.size or np.isnan(f).any():
        return None
    zero, low = f == 0, f <= MASKED_BELOW
    if not (zero | low).all():
        return None
    if (zero == b).all():
        return "True = attend"
    if (zero == ~b).all():
        return "True = masked"
    return None


def same_mask_stats(b: dict, f: dict) -> Optional[str]:
    """From statistics only: the float holds 0 and very negative values (Max 0, Min at most
    MASKED_BELOW) and, read as {0, Min}, attends as many entries as the boolean holds True (or
    False). A float mask of ``finfo.min`` overflows its own mean to -inf: then only its range
    is checked. Positions are not checked, as statistics never do."""
    n = numel(b)
    try:
        fmax, fmin, fmean, bmean = (float(f.get("Max")), float(f.get("Min")), float(f.get("Mean")),
                                    float(b.get("Mean")))
    except (TypeError, ValueError):
        return None
    if not n or fmax != 0 or not fmin <= MASKED_BELOW or not math.isfinite(fmin):
        return None
    if not math.isfinite(fmean):
        return "convention unknown: the float's mean overflows, only its range is checked"
    attended = 1.0 - fmean / fmin
    if abs(attended - bmean) * n < 0.5:
        return "True = attend"
    if abs(attended - (1.0 - bmean)) * n < 0.5:
        return "True = masked"
    return None


__all__ = ["encodings_differ", "same_mask", "same_mask_stats", "is_bool", "MASKED_BELOW"]
