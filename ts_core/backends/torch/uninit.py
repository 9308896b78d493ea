"""Values read from memory that nothing has written yet are never summarised.

``torch.empty``, ``Tensor.new_empty`` and their kin hand out memory as the allocator left it:
whatever an earlier tensor held. A program that fills such a buffer piece by piece
(transformers' DeepSeek-V3 attention: ``k = kv.new_empty(...)``, then ``k[..., :d].copy_(a)``,
``k[..., d:].copy_(b)``) is correct, but a record made between the allocation and the last write
(the ``__getitem__`` that makes the slice ``copy_`` fills) reads garbage, different on every run:
compared, two runs of one program "diverge" there, and every real bug is hidden behind it.

So the buffers made by these ops while collecting are tracked, one flag per element ("written?"),
until every element is written. The writes seen are the in-place calls that fill buffers
(``copy_``, ``fill_``, ``zero_``, ``__setitem__``), marked on the elements their target covers. A value read from a tracked buffer where any element it
covers is unwritten is recorded as ``"uninitialized": true`` with no statistics, and compare never
judges it (judge/verdict.py). Any other write (an ``out=`` argument, an op tsprobe does not see:
the storage's version counter moves) ends the tracking of that buffer: it counts as written, so
a value is never left out for a write that was not seen. The recording hot path pays one test
of an empty dict (``TRACKED``) when no buffer is being tracked; an error in this bookkeeping
stops the tracking, never the run.
"""
from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from .._depth import internal
from .compiled import in_compiler

MAX_TRACKED = 256            # buffers followed at once; the oldest is let go (counted as written)

# ops that return a tensor over unwritten memory (``Tensor.new(*sizes)``: only with sizes)
ALLOCATORS: List[Tuple[Any, str]] = [(torch, "empty"), (torch, "empty_like"), (torch, "empty_strided"),
                                     (torch.Tensor, "new_empty"), (torch.Tensor, "new_empty_strided"),
                                     (torch.Tensor, "new")]
# in-place calls that fill their first argument (``__setitem__``: the part its index selects)
WRITERS: List[Tuple[Any, str]] = [(torch.Tensor, "copy_"), (torch.Tensor, "fill_"), (torch.Tensor, "zero_"),
                                  (torch.Tensor, "__setitem__")]


class _Buffer:
    __slots__ = ("ref", "version", "written", "dtype")

    def __init__(self, t: torch.Tensor, elements: int):
        self.ref = weakref.ref(t)          # the allocated tensor: its views share its version counter
        self.version = t._version          # the counter after the last write seen
        self.written = np.zeros(elements, dtype=bool)
        self.dtype = t.dtype


TRACKED: Dict[int, _Buffer] = {}           # storage address -> buffer


def _address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _buffer(t: torch.Tensor) -> Optional[_Buffer]:
    """The tracked buffer `t` reads, when its tracking still holds: the allocated tensor alive over
    the same storage, no write unseen since (else it is let go), and `t` in its dtype."""
    if type(t) is not torch.Tensor or t.is_inference() or t.layout is not torch.strided or t.is_meta:
        return None
    key = _address(t)
    b = TRACKED.get(key)
    if b is None:
        return None
    owner = b.ref()
    if owner is None or _address(owner) != key or owner._version != b.version:
        TRACKED.pop(key, None)             # gone, or written by an op not seen: counts as written
        return None
    return b if t.dtype == b.dtype else None


def _cover(b: _Buffer, t: torch.Tensor) -> np.ndarray:
    """The `written` flags of the elements `t` covers, as a writable view of `t`'s shape."""
    return np.lib.stride_tricks.as_strided(b.written[t.storage_offset():], shape=tuple(t.shape),
                                           strides=tuple(s * b.written.itemsize for s in t.stride()))


def unwritten(t: Any) -> bool:
    """Does `t` read an element of a tracked buffer that nothing has written yet? (Callers test
    ``TRACKED`` first: an empty dict means no.)"""
    with internal():                  # t.stride() and the like are recorded APIs at L1
        try:
            b = _buffer(t)
            return b is not None and not _cover(b, t).all()
        except Exception:             # a tensor this cannot read: stop tracking, never stop a run
            TRACKED.clear()
            return False


def track(t: Any) -> None:
    """Follow `t`, fresh from an allocator, until it is written."""
    if type(t) is not torch.Tensor or t.is_inference() or t.layout is not torch.strided or t.is_meta:
        return
    elements = t.untyped_storage().nbytes() // t.element_size()
    if elements == 0:
        return
    if len(TRACKED) >= MAX_TRACKED:
        TRACKED.pop(next(iter(TRACKED)), None)
    TRACKED[_address(t)] = _Buffer(t, elements)


def _mark(target: Any, index: Any = None, has_index: bool = False) -> None:
    """After a write to `target` (``target[index]`` with `has_index`): flag what it covered."""
    if not isinstance(target, torch.Tensor):
        return
    key = _address(target)
    b = TRACKED.get(key)
    if b is None:
        return
    owner = b.ref()
    if owner is None or target.dtype != b.dtype:
        TRACKED.pop(key, None)
        return
    part = target
    if has_index:
        with torch.no_grad():             # the part written (under internal(): never recorded)
            part = target[index]
        if not isinstance(part, torch.Tensor) or (part.numel() and _address(part) != key):
            TRACKED.pop(key, None)         # advanced indexing: a copy, the region unknown: written
            return
    if part.numel():
        _cover(b, part)[...] = True
    b.version = owner._version
    if b.written.all():
        TRACKED.pop(key, None)


def _allocator(orig: Callable, switch: Any) -> Callable:
    @functools.wraps(orig)
    def allocate(*args, **kwargs):
        out = orig(*args, **kwargs)
        if switch.active and not in_compiler() and (orig.__name__ != "new" or _sizes_only(args[1:])):
            if kwargs.get("out") is None:
                with internal():
                    try:
                        track(out)
                    except Exception:          # never the reason a run stops
                        TRACKED.clear()
        return out
    return allocate


def _sizes_only(args: tuple) -> bool:
    """``Tensor.new(2, 3)`` / ``new(torch.Size(...))`` allocate; ``new([1., 2.])`` copies data."""
    if len(args) == 1 and isinstance(args[0], torch.Size):
        return True
    return bool(args) and all(isinstance(a, int) for a in args)


def _writer(orig: Callable) -> Callable:
    indexed = orig.__name__ == "__setitem__"

    @functools.wraps(orig)
    def write(*args, **kwargs):
        if not TRACKED:
            return orig(*args, **kwargs)
        target = args[0] if args else None
        with internal():
            try:
                tracked = isinstance(target, torch.Tensor) and _buffer(target) is not None
            except Exception:
                tracked = False
                TRACKED.clear()
        if not tracked:
            return orig(*args, **kwargs)      # not a tracked buffer (or let go just now)
        out = orig(*args, **kwargs)
        with internal():
            try:
                _mark(target, args[1] if len(args) > 1 else None, True) if indexed else _mark(target)
            except Exception:                 # never the reason a run stops: stop tracking instead
                TRACKED.clear()
        return out
    return write


class Tracker:
    """Installs the allocator and writer wrappers (``install``) and takes them off (``restore``),
    as the backend's API wrappers are: before them, so theirs wrap these, and after them."""

    def __init__(self, switch: Any):
        self.switch = switch
        self._saved: List[Tuple[Any, str, Any]] = []

    def install(self) -> None:
        if self._saved:
            return
        for owner, name in ALLOCATORS + WRITERS:
            orig = owner.__dict__.get(name, getattr(owner, name, None))
            if orig is None:
                continue
            self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
            fn = getattr(owner, name)
            setattr(owner, name, _allocator(fn, self.switch) if (owner, name) in ALLOCATORS else _writer(fn))

    def restore(self) -> None:
        while self._saved:
            owner, name, orig = self._saved.pop()
            if orig is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, orig)
        TRACKED.clear()


_MISSING = object()
