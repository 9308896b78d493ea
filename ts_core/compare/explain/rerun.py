"""Nondeterminism: one side compared with a second dump of itself (the same program run
again). If the side differs from its own rerun at (or before) the first divergence, the
divergence need not be a bug in the target: a random or nondeterministic op makes it.

``api.compare(golden_rerun=..., target_rerun=...)`` (CLI ``--golden-rerun``/``--target-rerun``)
runs that self-comparison and hands its result here."""
from __future__ import annotations

from typing import Any

from ..judge.verdict import differs
from .diagnosis import Hypothesis


def _differs(r: Any) -> bool:
    """A value the rerun changed: judge's one rule, or a failed row (an argument value)."""
    return r.mode in ("tensor", "statistics", "md5", "value") and (differs(r) or r.failed)


def nondeterminism(side: str, self_result: Any, fd: Any) -> Hypothesis:
    """What `self_result` (``side`` compared with its rerun) says about the first divergence `fd`."""
    rows = [r for r in self_result.rows if _differs(r)]
    if not rows:
        return Hypothesis("nondeterminism", f"not nondeterminism: {side} reproduces itself", 0.0,
                          f"{side} and its rerun are identical in every compared value ({len(self_result.rows)} "
                          f"values): the divergence is reproducible")
    first = min(rows, key=lambda r: r.order)
    key = (fd.golden_key or fd.key) if side == "golden" and fd is not None else (fd.target_key if fd else None)
    same_call = key is not None and key in (first.golden_key, first.target_key)
    fd_row = next((r for r in self_result.rows if key is not None and key in (r.golden_key, r.target_key)), None)
    before = fd_row is not None and first.order <= fd_row.order
    err = first.error_measure
    what = (f"{side} differs from its own rerun first at {first.golden_key} ({first.arg}"
            + (f", relative error {err:.3g}" if err is not None else "") + f"); {len(rows)} of "
            f"{len(self_result.rows)} values differ between the two runs")
    if same_call:
        return Hypothesis("nondeterminism", f"nondeterminism: {side} is not reproducible at this call", 0.95,
                          what + ": the same call differs run to run (a random op not seeded alike, or a "
                                 "nondeterministic kernel)")
    if before:
        return Hypothesis("nondeterminism", f"nondeterminism: {side} is not reproducible before this call", 0.85,
                          what + ", at or before the first divergence")
    return Hypothesis("nondeterminism", f"nondeterminism: {side} is not reproducible (later)", 0.4,
                      what + ", but only after the first divergence")
