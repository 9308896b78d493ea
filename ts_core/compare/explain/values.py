"""Both sides' recorded values of one call pair, read for the diagnosis.

A value is read as a float64 array when the dump holds its tensor file (task ``tensor``),
else only its recorded statistics are there. Arrays are read once and capped in size: the
diagnosis fits formulas to them, it does not need every element of a large activation.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..load.loader import INPUT, OUTPUT, PARAMETER, Dump, is_tensor_summary

SIDES = ("golden", "target")
MAX_ELEMENTS = 1 << 18          # larger tensors are not read: fits on 262,144 values say enough, and a
#                                 compare that finds something must not cost much more than one that does not


class Values:
    """The values of one call pair (either call may be missing), by side, role and argument."""

    def __init__(self, cp: Any, gd: Dump, td: Dump):
        self.cp, self.dumps = cp, {"golden": gd, "target": td}
        self._cache: Dict[Tuple[str, str, str], Optional[np.ndarray]] = {}

    def call(self, side: str):
        return self.cp.golden if side == "golden" else self.cp.target

    def entries(self, side: str, role: Optional[str] = None) -> List[Any]:
        call = self.call(side)
        if call is None:
            return []
        out = []
        for m in (call.members or [call]):
            out += [e for e in m.entries if role is None or e.role == role]
        return out

    def leaf(self, side: str, role: str, arg: str) -> Any:
        e = self.cp.entry(side, role, arg)
        return e.leaf if e is not None else None

    def stats(self, side: str, role: str, arg: str) -> Optional[dict]:
        leaf = self.leaf(side, role, arg)
        return leaf if is_tensor_summary(leaf) else None

    def value(self, side: str, role: str, arg: str) -> Any:
        """A non-tensor argument's recorded value (``eps``, ``dim``, ``approximate``)."""
        leaf = self.leaf(side, role, arg)
        return leaf.get("value") if isinstance(leaf, dict) and not is_tensor_summary(leaf) else None

    def array(self, side: str, role: str, arg: str) -> Optional[np.ndarray]:
        """float64 array of a recorded tensor, None without a tensor file (statistics dump)."""
        key = (side, role, arg)
        if key not in self._cache:
            self._cache[key] = load_leaf(self.dumps[side], self.leaf(side, role, arg))
        return self._cache[key]

    def has_tensors(self) -> bool:
        return any(is_tensor_summary(e.leaf) and e.leaf.get("data_name")
                   for side in SIDES for e in self.entries(side))


def load_leaf(dump: Dump, leaf: Any) -> Optional[np.ndarray]:
    """A summary's tensor file as float64 (None: no file, too large, unreadable, not numeric)."""
    if not is_tensor_summary(leaf) or not leaf.get("data_name"):
        return None
    shape = leaf.get("shape") or []
    if isinstance(shape, list) and all(isinstance(d, int) for d in shape) and int(np.prod(shape)) > MAX_ELEMENTS:
        return None
    try:
        a = np.asarray(dump.load_tensor(leaf["data_name"]))
    except Exception:        # a missing or unreadable file: the compare rows already say so
        return None
    if a.dtype.kind not in "fiub":
        return None
    return np.array(a, dtype=np.float64)


__all__ = ["Values", "load_leaf", "SIDES", "INPUT", "OUTPUT", "PARAMETER"]
