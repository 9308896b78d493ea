"""Where the step/rank pairs of a comparison run: in worker processes, or here.

The one seam for running compare units in parallel: ``api.compare`` hands it the pairs, it
returns one ``PairResult`` per pair in the same order. Each unit is independent (its own two
dumps), so any executor that keeps the order gives the same result.
"""
from __future__ import annotations

import os
import pickle
from concurrent.futures import ProcessPoolExecutor
from typing import List, Optional, Sequence, Tuple

from ..dumpfmt import DumpUnit, rank_number
from .explain.ranks import timeline
from .model import PairResult
from .pipeline import Options, compare_pair


def run_units(pairs: Sequence[Tuple[DumpUnit, DumpUnit]], opts: Options, workers: Optional[int] = None,
              progress: Optional[bool] = None) -> List[PairResult]:
    """Compare each (golden, target) unit pair, in up to ``workers`` processes (default: one per
    CPU); in this process when there is one pair or ``opts`` cannot be pickled (a lambda as
    normaliser). The progress bar is shown only in this process."""
    n_workers = min(len(pairs), workers or os.cpu_count() or 1)
    if n_workers > 1 and not _picklable(opts):  # e.g. a lambda as normaliser: stay in this process
        n_workers = 1
    if n_workers > 1:
        with ProcessPoolExecutor(max_workers=n_workers) as pool:
            futures = [pool.submit(_compare_unit, g, t, opts, False) for g, t in pairs]
            return [f.result() for f in futures]
    return [_compare_unit(g, t, opts, progress) for g, t in pairs]


def _compare_unit(golden: DumpUnit, target: DumpUnit, opts: Options, progress: Optional[bool]) -> PairResult:
    """One step/rank pair; a numbered rank (a distributed run) also keeps its timeline, so the
    many-rank summary can be made later from saved results (``tsprobe merge``)."""
    pair = compare_pair(golden, target, opts, progress)
    if rank_number(golden.rank) is not None or rank_number(target.rank) is not None:
        pair.timeline = timeline(pair)
    return pair


def _picklable(obj) -> bool:
    try:
        pickle.dumps(obj)
        return True
    except Exception:
        return False
