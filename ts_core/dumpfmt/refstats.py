"""Reference statistics computed in numpy (float64), as dump.json writes them.

Used where a summary is made from data on disk (the per-request split cuts tensors and
re-summarises them) and by tests as the independent check of the framework-side kernels.
Max/Min of integer tensors are ints, of bool tensors bools; complex values by magnitude.
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np


def reference_stats(arr: np.ndarray, dtype: str = "") -> Dict[str, Any]:
    """``{"Max", "Min", "Mean", "Norm"}`` of `arr`; all None for an empty array. `dtype` is the
    recorded dtype name (a bfloat16 tensor is stored as float32, a bool one may be stored as uint8)."""
    arr = np.asarray(arr)
    if arr.size == 0:
        return {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if np.iscomplexobj(arr):
        arr = np.abs(arr)
    f = arr.astype(np.float64)
    mean, norm = float(f.mean()), float(np.linalg.norm(f.ravel()))
    if arr.dtype == np.bool_ or "bool" in dtype.lower():
        return {"Max": bool(f.max()), "Min": bool(f.min()), "Mean": mean, "Norm": norm}
    if np.issubdtype(arr.dtype, np.integer):
        return {"Max": int(arr.max()), "Min": int(arr.min()), "Mean": mean, "Norm": norm}
    return {"Max": float(f.max()), "Min": float(f.min()), "Mean": mean, "Norm": norm}
