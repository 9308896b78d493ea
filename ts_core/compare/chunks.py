"""One step/rank pair split into chunks of its tensor reads, so that a few ranks with very large
dumps still spread over many workers.

The engine reads tensor data in one place (``judge/verdict._compare_data``, once per compared tensor
value, always in the same order for the same dumps and options). A *chunk unit* k of K runs the
whole pair with a gate on that place: it reads and compares the n-th tensor value only when
``n % K == k`` and keeps the row state it produced; the others return at once without reading.
The *finish unit* runs the pair again with the K chunks' results: no tensor is read, every row
gets the state its chunk computed, so rows, first divergence and outputs are those of one
unchunked run (what ``tsprobe compare`` gives with one chunk per pair).
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Callable, Dict, List, Optional, Tuple

from .errors import TensorFileError
from ..verdicts import PASS

# the gate of the running unit (a context variable: a Dask worker may run several units at
# once in threads of one process)
_GATE: ContextVar[Optional["Gate"]] = ContextVar("tsprobe_chunk_gate", default=None)


class Gate:
    """Counts tensor reads of one pair; computes those of its chunk, or replays saved ones."""

    def __init__(self, chunk: int = 0, chunks: int = 1, saved: Optional[Dict[int, Tuple]] = None):
        self.chunk, self.chunks, self.n = chunk, chunks, 0
        self.saved = saved                       # finish: n -> (row state, verdict, reason) or error text
        self.computed: Dict[int, Tuple] = {}     # chunk: what this chunk read and found

    def __call__(self, compute: Callable[[Any], Tuple[str, str]], row: Any) -> Tuple[str, str]:
        n, self.n = self.n, self.n + 1
        if self.saved is not None:
            got = self.saved[n]
            if isinstance(got, str):
                raise TensorFileError(got)
            state, verdict, reason = got
            row.__dict__.update(state)
            return verdict, reason
        if n % self.chunks != self.chunk:
            return PASS, ""          # another chunk reads it; this run's rows are not kept
        try:
            verdict, reason = compute(row)
        except TensorFileError as e:
            self.computed[n] = str(e)
            raise
        self.computed[n] = (dict(row.__dict__), verdict, reason)
        return verdict, reason


def gated(compute: Callable[[Any], Tuple[str, str]], row: Any) -> Tuple[str, str]:
    """``compute(row)`` (reads two tensors, fills the row's metrics) through the running
    unit's gate; directly when there is none."""
    gate = _GATE.get()
    return compute(row) if gate is None else gate(compute, row)


def current_gate() -> Optional[Gate]:
    """The running unit's gate; None outside a chunk unit."""
    return _GATE.get()


def run_gated(gate: Gate, fn: Callable[[], Any]) -> Any:
    token = _GATE.set(gate)
    try:
        return fn()
    finally:
        _GATE.reset(token)


def merge_saved(parts: List[Dict[int, Tuple]]) -> Dict[int, Tuple]:
    saved: Dict[int, Tuple] = {}
    for p in parts:
        saved.update(p)
    return saved


__all__ = ["Gate", "current_gate", "gated", "run_gated", "merge_saved"]
