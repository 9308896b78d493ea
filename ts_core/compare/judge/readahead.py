"""Tensor pairs compared ahead of the judge.

The judge reads and compares one value pair at a time, on one thread: while it opens the next
files and decides a verdict, the kernel's threads have nothing to do, and a pair smaller than one
kernel part runs on that one thread. The pipeline therefore hands the judge a *plan*: the data
reads it expects the judge to make, in the judge's order (``verdict.planned_read``). The read-ahead
opens the planned pairs and submits their kernel parts to the compare threads, up to
``WINDOW_BYTES`` of tensor data ahead; ``_compare_data`` then takes each pair's arrays and metrics
from it. A read the plan did not foresee is computed where it is asked for, and a planned pair
the judge passes over is dropped: the plan is a hint, the judge still decides what it reads.
The metrics are those ``compare_arrays`` gives (the same tasks, merged the same way).

A pair is read once. tsprobe writes a tensor recorded under several names (one call's output,
the next call's input) as one file with several links, so a real dump names each stored tensor
about twice (846 names, 442 files in one GPT-2 step): a planned pair whose two files (device,
inode, size, modification time, offset), dtypes and tolerance are those of a pair already judged
takes its metrics instead of reading the same bytes again.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ... import headstart
from ..errors import TensorFileError
from .metrics import TensorMetrics, compare_tasks, kernel_key, submit

WINDOW_BYTES = 64 << 20       # tensor bytes opened ahead of the judge (mapped, so they count in RSS)
WINDOW_PAIRS = 256            # and pairs, so that many tiny tensors do not keep thousands of files open

_ACTIVE: ContextVar[Optional["ReadAhead"]] = ContextVar("tsprobe_readahead", default=None)


@dataclass(frozen=True)
class PlannedRead:
    """One data read the judge is expected to make: two tensor files at one tolerance."""

    golden: Any              # the golden Dump (load_tensor)
    g_name: str
    target: Any
    t_name: str
    rtol: float
    atol: float
    equal_nan: bool

    @property
    def key(self) -> Tuple:
        return (id(self.golden), self.g_name, id(self.target), self.t_name, self.rtol, self.atol, self.equal_nan)


Identity = Tuple      # both files' headstart.file_id, rtol, atol, equal_nan


def identity(read: PlannedRead) -> Optional[Identity]:
    """What a pair's metrics depend on: the two stored files and the tolerance (None when a file
    cannot be placed: it is then read as usual)."""
    g, t = read.golden.locate(read.g_name), read.target.locate(read.t_name)
    g_id = headstart.file_id(*g) if g else None
    t_id = headstart.file_id(*t) if t else None
    return (g_id, t_id, read.rtol, read.atol, read.equal_nan) if g_id and t_id else None


class Ahead:
    """One planned pair: its arrays (or the error reading them) and, once started, its kernel
    parts on the compare threads. Opening maps the files without reading them, and takes the
    head start's results when it computed the pair (which then takes no room in the window: a
    window full of such pairs left the threads idle); ``start`` reads.
    A *repeat* (the files of a pair planned before it) opens nothing: it takes that pair's
    metrics from `judged`, or, when the judge passed over that pair, opens and reads as any pair."""

    def __init__(self, read: PlannedRead, ident: Optional[Identity] = None, repeat: bool = False,
                 judged: Optional[Dict[Identity, TensorMetrics]] = None):
        self.read, self.started = read, False
        self.ident, self.repeat = ident, repeat
        self.judged = {} if judged is None else judged
        self.error: Optional[TensorFileError] = None
        self.tasks: List[Any] = []
        self.futures: Optional[List[Any]] = None
        self.finish = None
        self.to_read = 0          # bytes the window counts: 0 when the head start computed the pair
        self.opened = False
        if not repeat:
            self._open()

    def _open(self) -> None:
        self.opened = True
        read = self.read
        try:
            self.golden = read.golden.load_tensor(read.g_name)
            self.target = read.target.load_tensor(read.t_name)
        except TensorFileError as e:      # raised again where the judge reads it
            self.error, self.golden, self.target = e, None, None
            return
        self.to_read = self.golden.nbytes + self.target.nbytes
        if self.golden.size == self.target.size:     # else the judge says so without metrics
            self.shaped = self.target.reshape(self.golden.shape) if self.golden.shape != self.target.shape \
                else self.target
            self.tasks, self.finish = compare_tasks(self.golden, self.shaped, read.rtol, read.atol, read.equal_nan)
            early = _head_start(read, self.ident, self.golden, self.shaped) if self.finish is not None else None
            if early is not None:         # computed already: nothing to read, no room taken in the window
                self.futures, self.to_read = [_done(r) for r in early], 0

    def start(self) -> None:
        """Submit the kernel parts (unless the head start's results for them were taken on opening)."""
        self.started = True
        if self.futures is None and self.finish is not None:
            self.futures = [submit(t) for t in self.tasks]

    def judged_before(self) -> Optional[TensorMetrics]:
        """A repeat's metrics, from the pair of the same files the judge took before it."""
        return self.judged.get(self.ident) if self.repeat else None

    def arrays(self) -> Tuple[Any, Any]:
        if not self.opened:
            self._open()
        if self.error is not None:
            raise self.error
        return self.golden, self.target

    def metrics(self) -> Optional[TensorMetrics]:
        if not self.opened:
            self._open()
        if self.finish is None:
            return None
        self.start()
        m = self.finish([f.result() for f in self.futures])
        if self.ident is not None:
            self.judged[self.ident] = m
        return m

    def cancel(self) -> None:
        for f in self.futures or ():
            f.cancel()            # a running part holds its arrays until it ends


def _head_start(read: PlannedRead, ident: Optional[Identity], golden: Any, target: Any) -> Optional[List]:
    """The kernel's results for this pair from compare's head start (ts_core/headstart.py), when
    it computed exactly these files under exactly this kernel call."""
    if not headstart.pending() or ident is None:
        return None
    key = kernel_key(golden, target, read.rtol, read.atol, read.equal_nan)
    return headstart.take(ident[0], ident[1], key) if key else None


def _done(result: Any) -> Future:
    f: Future = Future()
    f.set_result(result)
    return f


class ReadAhead:
    """The planned pairs not yet taken, in plan order: opened up to the window, and started in
    order while the started ones fit in it. A pair larger than the window alone starts only when
    the judge takes it, so two such pairs are never read at once."""

    def __init__(self, plan: Iterator[PlannedRead], window_bytes: Optional[int] = None,
                 window_pairs: Optional[int] = None):
        self.plan = plan
        self.window_bytes = WINDOW_BYTES if window_bytes is None else window_bytes
        self.window_pairs = WINDOW_PAIRS if window_pairs is None else window_pairs
        self.pending: "OrderedDict[Tuple, Ahead]" = OrderedDict()
        self.waiting: "deque[Ahead]" = deque()        # opened, not started (the tail of pending)
        self.bytes = self.started_bytes = 0
        self.taken = self.missed = self.dropped = self.repeats = 0
        self.planned: set = set()                        # identities of the pairs planned to be read
        self.judged: Dict[Identity, TensorMetrics] = {}  # ... and the metrics of those judged

    def _fill(self) -> None:
        while self.plan is not None and len(self.pending) < self.window_pairs and self.bytes < self.window_bytes:
            read = next(self.plan, None)
            if read is None:
                self.plan = None
                break
            if read.key not in self.pending:
                ident = identity(read)
                repeat = ident is not None and ident in self.planned
                if ident is not None:
                    self.planned.add(ident)
                ahead = self.pending[read.key] = Ahead(read, ident, repeat, self.judged)
                self.repeats += repeat
                self.bytes += ahead.to_read
                if not repeat:
                    self.waiting.append(ahead)
        while self.waiting and self.started_bytes + self.waiting[0].to_read <= self.window_bytes:
            ahead = self.waiting.popleft()
            ahead.start()
            self.started_bytes += ahead.to_read

    def take(self, read: PlannedRead) -> Optional[Ahead]:
        """The pair of `read` when it was planned (the pairs planned before it are dropped: the
        judge reads in plan order and passed over them); None when it was not."""
        self._fill()
        if read.key not in self.pending:
            self.missed += 1
            return None
        while True:
            key, ahead = self.pending.popitem(last=False)
            self.bytes -= ahead.to_read
            if ahead.repeat:
                pass                              # never waiting: it reads nothing unless asked
            elif not ahead.started:
                self.waiting.popleft()            # not started: the head of the waiting ones
            else:
                self.started_bytes -= ahead.to_read
            if key == read.key:
                self.taken += 1
                self._fill()          # its room goes to the next pair now, not when the judge asks again
                return ahead
            ahead.cancel()
            self.dropped += 1

    def close(self) -> None:
        for ahead in self.pending.values():
            ahead.cancel()
        self.pending.clear()
        self.waiting.clear()
        self.bytes = self.started_bytes = 0


@contextmanager
def reading_ahead(plan: Iterator[PlannedRead], **window: int) -> Iterator[ReadAhead]:
    """Within the block, the judge takes the planned pairs from a read-ahead (this thread only)."""
    ahead = ReadAhead(plan, **window)
    token = _ACTIVE.set(ahead)
    try:
        yield ahead
    finally:
        _ACTIVE.reset(token)
        ahead.close()


def take(read: PlannedRead) -> Optional[Ahead]:
    """The running read-ahead's pair for `read`, or None (no read-ahead, or not planned)."""
    ahead = _ACTIVE.get()
    return None if ahead is None else ahead.take(read)
