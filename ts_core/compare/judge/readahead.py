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
"""
from __future__ import annotations

from collections import OrderedDict, deque
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple

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


class Ahead:
    """One planned pair: its arrays (or the error reading them) and, once started, its kernel
    parts on the compare threads. Opening maps the files without reading them; ``start`` reads."""

    def __init__(self, read: PlannedRead):
        self.read, self.started = read, False
        self.error: Optional[TensorFileError] = None
        self.tasks: List[Any] = []
        self.futures: Optional[List[Any]] = None
        self.finish = None
        self.nbytes = 0
        try:
            self.golden = read.golden.load_tensor(read.g_name)
            self.target = read.target.load_tensor(read.t_name)
        except TensorFileError as e:      # raised again where the judge reads it
            self.error, self.golden, self.target = e, None, None
            return
        self.nbytes = self.golden.nbytes + self.target.nbytes
        if self.golden.size == self.target.size:     # else the judge says so without metrics
            self.shaped = self.target.reshape(self.golden.shape) if self.golden.shape != self.target.shape \
                else self.target
            self.tasks, self.finish = compare_tasks(self.golden, self.shaped, read.rtol, read.atol, read.equal_nan)

    def start(self) -> None:
        """Submit the kernel parts (or take the head start's results for them)."""
        self.started = True
        if self.futures is None and self.finish is not None:
            early = _head_start(self.read, self.golden, self.shaped)
            self.futures = [_done(r) for r in early] if early is not None else [submit(t) for t in self.tasks]

    def arrays(self) -> Tuple[Any, Any]:
        if self.error is not None:
            raise self.error
        return self.golden, self.target

    def metrics(self) -> Optional[TensorMetrics]:
        if self.finish is None:
            return None
        self.start()
        return self.finish([f.result() for f in self.futures])

    def cancel(self) -> None:
        for f in self.futures or ():
            f.cancel()            # a running part holds its arrays until it ends


def _head_start(read: PlannedRead, golden: Any, target: Any) -> Optional[List]:
    """The kernel's results for this pair from compare's head start (ts_core/headstart.py), when
    it computed exactly these files under exactly this kernel call."""
    if not headstart.pending():
        return None
    key = kernel_key(golden, target, read.rtol, read.atol, read.equal_nan)
    return headstart.take(read.golden.locate(read.g_name), read.target.locate(read.t_name), key) if key else None


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
        self.taken = self.missed = self.dropped = 0

    def _fill(self) -> None:
        while self.plan is not None and len(self.pending) < self.window_pairs and self.bytes < self.window_bytes:
            read = next(self.plan, None)
            if read is None:
                self.plan = None
                break
            if read.key not in self.pending:
                ahead = self.pending[read.key] = Ahead(read)
                self.bytes += ahead.nbytes
                self.waiting.append(ahead)
        while self.waiting and self.started_bytes + self.waiting[0].nbytes <= self.window_bytes:
            ahead = self.waiting.popleft()
            ahead.start()
            self.started_bytes += ahead.nbytes

    def take(self, read: PlannedRead) -> Optional[Ahead]:
        """The pair of `read` when it was planned (the pairs planned before it are dropped: the
        judge reads in plan order and passed over them); None when it was not."""
        self._fill()
        if read.key not in self.pending:
            self.missed += 1
            return None
        while True:
            key, ahead = self.pending.popitem(last=False)
            self.bytes -= ahead.nbytes
            if not ahead.started:
                self.waiting.popleft()            # not started: the head of the waiting ones
            else:
                self.started_bytes -= ahead.nbytes
            if key == read.key:
                self.taken += 1
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
