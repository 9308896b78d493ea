"""Where the compare's units of work run: the executor seam.

A unit is one step/rank pair, or one chunk of its tensor reads (chunks.py) followed by the
pair's finish unit. A unit carries paths only: the worker that runs it opens that rank's
dump.json and tensor files itself, and sends back rows (no tensor data crosses the wire).
Backends: this process (one worker, or options that cannot be pickled), a process pool (the
default: ``concurrent.futures``, no dependency), or a Dask ``distributed`` cluster
(executor_dask.py, ``tsprobe compare --executor dask``). Each gives the same PairResults in
the same order, so the outputs are byte for byte those of a run in one process.

A rank whose dump cannot be read (a corrupt or vanished dump.json, a file-system error) comes
back as one ERROR row for that rank; the other ranks complete. Only when every unit fails does
the compare raise, as it did for one pair.
"""
from __future__ import annotations

import os
import pickle
import resource
import signal
import sys
import time
from concurrent.futures import Future, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..dumpfmt import DumpUnit, rank_number
from .chunks import Gate, merge_saved, run_gated
from .pipeline import Options, Progress, compare_pair
from .errors import DumpFormatError
from .load.loader import tensor_bytes_read
from .explain.ranks import timeline
from .model import PairResult, Row, count_rows
from ..verdicts import ERROR

EXECUTORS = ("local", "dask")
# test-only: "LABEL@MARKER" makes the first run of unit LABEL kill its own worker process
# (tests/compare/test_dask_executor.py: a worker lost mid-compare); MARKER records that it did
KILL_ONCE_ENV = "TSPROBE_TEST_KILL_UNIT"


@dataclass(frozen=True)
class Unit:
    """(step, rank, chunk of records): ``chunks == 1`` is the whole pair; else chunk ``chunk``
    of ``chunks`` of its tensor reads, or (``finish``) the pair from its chunks' results."""

    golden: DumpUnit
    target: DumpUnit
    chunk: int = 0
    chunks: int = 1
    finish: bool = False

    @property
    def label(self) -> str:
        part = "" if self.chunks == 1 else ("/finish" if self.finish else f"/chunk{self.chunk}")
        return (self.golden.label if self.golden.label == self.target.label
                else f"{self.golden.label}~{self.target.label}") + part


@dataclass
class Outcome:
    """What a unit sends back: the pair (whole or finish units), its chunk's saved reads, or
    the error that stopped it; and what it cost on its worker."""

    unit: Unit
    pair: Optional[PairResult] = None
    saved: Dict[int, Any] = field(default_factory=dict)
    error: str = ""
    bytes_read: int = 0          # tensor bytes loaded (statistics first: only where summaries differ)
    seconds: float = 0.0
    peak_rss_mb: float = 0.0     # of the worker process so far
    worker: str = ""             # host:pid


def compare_unit(golden: DumpUnit, target: DumpUnit, opts: Options, progress: Optional[bool] = None) -> PairResult:
    """One step/rank pair; a numbered rank (a distributed run) also keeps its timeline, so the
    many-rank summary can be made later from saved results (``tsprobe merge``)."""
    pair = compare_pair(golden, target, opts, progress)
    if rank_number(golden.rank) is not None or rank_number(target.rank) is not None:
        pair.timeline = timeline(pair)
    return pair


def run_unit(unit: Unit, opts: Options, parts: Tuple[Outcome, ...] = (), progress: Optional[bool] = False) -> Outcome:
    """Run one unit where it was sent (a pool process, a Dask worker)."""
    _kill_once(unit)
    t0, b0 = time.perf_counter(), tensor_bytes_read()
    out = Outcome(unit)
    try:
        if unit.chunks == 1:
            out.pair = compare_unit(unit.golden, unit.target, opts, progress)
        elif not unit.finish:
            gate = Gate(unit.chunk, unit.chunks)
            run_gated(gate, lambda: compare_pair(unit.golden, unit.target, opts, False))
            out.saved = gate.computed
        else:
            failed = [p.error for p in parts if p.error]
            if failed:
                raise DumpFormatError(failed[0])
            gate = Gate(saved=merge_saved([p.saved for p in parts]))
            out.pair = run_gated(gate, lambda: compare_unit(unit.golden, unit.target, opts, False))
    except (DumpFormatError, OSError) as e:
        out.error = str(e)
    out.seconds = time.perf_counter() - t0
    out.bytes_read = tensor_bytes_read() - b0
    out.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.worker = f"{os.uname().nodename}:{os.getpid()}"
    return out


def _kill_once(unit: Unit) -> None:
    spec = os.environ.get(KILL_ONCE_ENV)
    if not spec or spec.split("@", 1)[0] != unit.label:
        return
    try:
        os.close(os.open(spec.split("@", 1)[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def failed_pair(unit: Unit, error: str) -> PairResult:
    """A rank that could not be compared: one ERROR row that says why (the others complete)."""
    step = unit.golden.step if unit.golden.step is not None else unit.target.step
    rank = unit.golden.rank or unit.target.rank
    row = Row(step=step, rank=rank, order=0, direction="forward", golden_key=None, target_key=None, role="output",
              arg="", name=unit.golden.label, mode="missing", verdict=ERROR,
              reason=f"this rank was not compared: {error}")
    return PairResult(step, rank, str(unit.golden.json_path), str(unit.target.json_path), [row], None,
                      f"not compared: {error}", {"rows": 1, **count_rows([row])}, [], [error])


# ---------------------------------------------------------------- backends

class InProcess:
    """Runs each unit when submitted, here (one worker, or options that do not pickle)."""

    def submit(self, fn: Callable, *args) -> Future:
        f: Future = Future()
        f.set_result(fn(*args))
        return f

    as_completed = staticmethod(as_completed)

    def close(self) -> None:
        pass


class Pool:
    """A local process pool (``concurrent.futures``): the default for several units."""

    as_completed = staticmethod(as_completed)

    def __init__(self, workers: int):
        from concurrent.futures import ProcessPoolExecutor   # multiprocessing: ~20 ms a start, only here

        self.pool = ProcessPoolExecutor(max_workers=workers)

    def submit(self, fn: Callable, *args) -> Future:
        return self.pool.submit(fn, *args)

    def close(self) -> None:
        self.pool.shutdown()


def backend(executor: str, n_units: int, opts: Options, workers: Optional[int] = None,
            scheduler: Optional[str] = None, scheduler_file: Optional[str] = None):
    """The backend named by ``executor`` (``local`` or ``dask``)."""
    if executor == "dask":
        from .executor_dask import DaskBackend
        return DaskBackend(workers=workers, scheduler=scheduler, scheduler_file=scheduler_file)
    if executor != "local":
        raise ValueError(f"unknown executor {executor!r}: use one of {', '.join(EXECUTORS)}")
    if scheduler or scheduler_file:
        raise ValueError("--scheduler/--scheduler-file name a Dask cluster: add --executor dask")
    n = min(n_units, workers or os.cpu_count() or 1)
    return Pool(n) if n > 1 and _picklable(opts) else InProcess()   # a lambda normaliser: stay here


def _picklable(obj) -> bool:
    try:
        pickle.dumps(obj)
        return True
    except Exception:
        return False


# ---------------------------------------------------------------- driving the units

def run_pairs(pairs: List[Tuple[DumpUnit, DumpUnit]], opts: Options, *, executor: str = "local",
              workers: Optional[int] = None, chunks: int = 1, progress: Optional[bool] = None,
              scheduler: Optional[str] = None, scheduler_file: Optional[str] = None,
              outcomes: Optional[List[Outcome]] = None) -> List[PairResult]:
    """Compare each pair on the chosen executor; PairResults in the order of ``pairs``.
    ``chunks``: units per pair (its tensor reads split that many ways, plus a finish unit).
    ``outcomes``: a list that receives every unit's Outcome (what each cost, where)."""
    if chunks < 1:
        raise ValueError(f"chunks per pair must be >= 1, got {chunks}")
    first = [Unit(g, t, k, chunks) for g, t in pairs for k in range(chunks)]
    n_units = len(first) + (len(pairs) if chunks > 1 else 0)
    be = backend(executor, len(first), opts, workers, scheduler, scheduler_file)
    try:
        if isinstance(be, InProcess) and n_units == 1:     # one pair here: the per-call bar, as before
            done = [run_unit(first[0], opts, (), progress)]
        else:
            bar = Progress(n_units, f"compare ({executor})", _bar(progress, n_units), every=max(1, n_units // 100))
            done = _run(be, first, opts, bar)
            if chunks > 1:
                finish = [Unit(g, t, 0, chunks, True) for g, t in pairs]
                parts = [tuple(done[i * chunks:(i + 1) * chunks]) for i in range(len(pairs))]
                done = _run(be, finish, opts, bar, parts)
    finally:
        be.close()
    if outcomes is not None:
        outcomes.extend(done)
    failed = [o for o in done if o.error]
    if failed and len(failed) == len(done):
        raise DumpFormatError(failed[0].error)
    return [o.pair if not o.error else failed_pair(o.unit, o.error) for o in done]


def _run(be, units: List[Unit], opts: Options, bar: Progress, parts: Optional[List[Tuple]] = None) -> List[Outcome]:
    futures = {be.submit(run_unit, u, opts, parts[i] if parts else ()): i for i, u in enumerate(units)}
    out: List[Optional[Outcome]] = [None] * len(units)
    for f in be.as_completed(list(futures)):
        out[futures[f]] = f.result()
        bar.advance()
    return out  # type: ignore[return-value]


def _bar(progress: Optional[bool], n_units: int) -> bool:
    return sys.stderr.isatty() and n_units > 1 if progress is None else progress


__all__ = ["EXECUTORS", "Unit", "Outcome", "compare_unit", "run_unit", "run_pairs", "failed_pair"]
