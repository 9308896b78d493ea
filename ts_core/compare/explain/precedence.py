"""Which step/rank's first divergence is *the* first divergence of a comparison.

The earliest step's; with many ranks in that step, that of the rank that diverged first (the
many-rank summary's ``diverged_first``, see ``ranks.py``), else that of the lowest rank.
Imports nothing of compare: ``model.CompareResult.first_divergence`` asks it.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence


def first_divergence(pairs: Sequence[Any], ranks: Dict[str, Any]) -> Optional[Any]:
    """The first divergence over ``pairs`` (``PairResult``s in step then rank order); ``ranks``
    is the many-rank summary (``{"steps": [...]}``, empty with one rank)."""
    for p in pairs:
        if p.first_divergence:
            step = next((s for s in ranks.get("steps", []) if s["step"] == p.step), None)
            first = step["diverged_first"] if step else []
            for q in pairs:
                if q.step == p.step and first and q.rank == first[0] and q.first_divergence:
                    return q.first_divergence
            return p.first_divergence
    return None
