"""Which step/rank's first divergence is *the* first divergence of a comparison.

The earliest step's; with many ranks in that step, that of the rank that diverged first (the
many-rank summary's ``diverged_first``, see ``ranks.py``), else that of the lowest rank.
``conclude`` stores it, and the headline verdict (judge's), on the result once: the model
holds data only.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from ..judge.verdict import result_verdict


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


def conclude(result: Any) -> Any:
    """Set ``result.first_divergence`` and ``result.verdict`` (a ``CompareResult`` whose pairs
    and many-rank summary are final); returns ``result``."""
    result.first_divergence = first_divergence(result.pairs, result.ranks)
    result.verdict = result_verdict(result.counts, bool(result.different_programs),
                                    bool(result.unpaired_golden or result.unpaired_target))
    return result
