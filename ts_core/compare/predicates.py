"""Predicates on recorded values that every compare stage needs: how many elements a summary
holds, whether it is boolean, whether two non-tensor values are equal. They live below the
stages (load -> align -> judge -> explain -> report), so alignment can use them without
importing judge, and judge without importing align. numpy-free, dumpfmt only."""
from __future__ import annotations

import math
from typing import Any, Optional

from ..dumpfmt.dtypes import dtype_name


def numel(leaf: Any) -> Optional[int]:
    """Elements of a recorded tensor summary (None: no shape, or a symbolic one)."""
    shape = leaf.get("shape") if isinstance(leaf, dict) else None
    if not isinstance(shape, (list, tuple)):
        return None
    try:
        return math.prod(shape) if all(type(s) is int for s in shape) else None
    except TypeError:
        return None


def is_bool(leaf: dict) -> bool:
    """A boolean tensor summary (a mask)."""
    return dtype_name(leaf.get("dtype")) == "bool"


def values_equal(g: Any, t: Any) -> bool:
    """Equality of non-tensor values as recorded (floats to 1e-6 relative, lists element-wise)."""
    if isinstance(g, float) or isinstance(t, float):
        if isinstance(g, bool) or isinstance(t, bool) or not isinstance(g, (int, float)) \
                or not isinstance(t, (int, float)):
            return g == t
        if math.isnan(g) and math.isnan(t):
            return True
        return math.isclose(g, t, rel_tol=1e-6, abs_tol=0.0)
    if isinstance(g, list) and isinstance(t, list):
        return len(g) == len(t) and all(values_equal(a, b) for a, b in zip(g, t))
    return g == t
