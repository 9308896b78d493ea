"""Where device-side statistics and CRCs wait for the flush: one arena of result slots per device.

An arena chunk is one int64 buffer on the device (a float64 view shares its memory), zeroed once
when it is made; every recorded tensor takes a few slots of it: statistics ``STATS_SLOTS`` (max,
min, mean, norm as float64, and the launch's program counter), a CRC one (as an integer). The
writers are device_kernels' Triton kernels, or tensors.py's torch fallback. A flush brings the
slots taken since the last flush to the host in one transfer per chunk (``Slot.value``): one per
device per flush in the steady state, nothing stacked, nothing synced while recording. A chunk is
replaced (by one twice its size) only when full: its allocation and zeroing (three ops) are shared
by thousands of tensors, over many flushes. Needs torch, not triton.
"""
from __future__ import annotations

import threading
from typing import Any, Optional, Tuple

import numpy as np
import torch

STATS_SLOTS = 5                    # max, min, mean, norm, program counter


class _Chunk:
    """One zeroed device buffer of result slots and its scratch; its host copy once fetched."""

    __slots__ = ("ints", "floats", "scratch", "used", "sused", "host", "valid", "inflight", "lock")

    def __init__(self, device: torch.device, slots: int, scratch: int) -> None:
        self.ints = torch.zeros(slots, dtype=torch.int64, device=device)
        self.floats = self.ints.view(torch.float64)
        self.scratch = torch.empty(scratch, dtype=torch.float64, device=device)
        self.used = 0
        self.sused = 0
        self.host: Any = None                # numpy int64 copy of ints[:len(host)], grown per flush
        self.valid = 0                       # host[:valid] holds results (later slots may be stale)
        self.inflight: set = set()           # offsets taken whose writer is not launched yet
        self.lock = threading.Lock()

    def launched(self, off: int) -> None:
        """The writer of the slots at `off` is launched (queued before any later transfer)."""
        with self.lock:
            self.inflight.discard(off)

    def fetch(self, upto: int) -> Any:
        """The host copy of slots [0, upto), whose writer was launched: one transfer of the slots
        from the first one not copied valid before (a slot taken but not yet launched when a copy
        is made, by another thread, is copied again by the next fetch that needs it)."""
        with self.lock:
            if self.valid < upto:
                part = self.ints[self.valid:self.used]
                new = (part.clone() if part.is_cpu else part.cpu()).numpy()    # a copy, never a view
                self.host = new if self.host is None else np.concatenate((self.host[:self.valid], new))
                self.valid = min(self.inflight, default=self.used)
            return self.host


class Slot:
    """A pending result: statistics (kind 0: [max, min, mean, norm]) or a CRC (kind 1: 8 hex
    digits) at `off` in `chunk`. Made once its writer is launched."""

    __slots__ = ("chunk", "off", "kind")

    def __init__(self, chunk: _Chunk, off: int, kind: int) -> None:
        self.chunk, self.off, self.kind = chunk, off, kind
        chunk.launched(off)

    @property
    def device(self) -> torch.device:
        """Where the result waits (the collector holds a mid-step flush that would sync it)."""
        return self.chunk.ints.device

    def value(self) -> Any:
        if self.kind == 0:
            return self.chunk.fetch(self.off + 4)[self.off:self.off + 4].view("float64").tolist()
        return f"{int(self.chunk.fetch(self.off + 1)[self.off]) & 0xFFFFFFFF:08x}"


class Arena:
    """The result slots of one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.slots, self.scratch = 1 << 14, 1 << 16
        self.chunk: Optional[_Chunk] = None
        self.lock = threading.Lock()

    def take(self, slots: int, scratch: int = 0) -> Tuple[_Chunk, int, int]:
        """(chunk, slot offset, scratch offset) of `slots` result slots and `scratch` float64s."""
        with self.lock:
            c = self.chunk
            if c is None or c.used + slots > c.ints.numel() or c.sused + scratch > c.scratch.numel():
                if c is not None:                       # full: bigger from now on
                    if c.used + slots > c.ints.numel():
                        self.slots *= 2
                    if c.sused + scratch > c.scratch.numel():
                        self.scratch *= 2
                while scratch > self.scratch:
                    self.scratch *= 2
                c = self.chunk = _Chunk(self.device, self.slots, self.scratch)
            off, soff = c.used, c.sused
            with c.lock:
                c.inflight.add(off)
            c.used += slots
            c.sused += scratch
            return c, off, soff


class Arenas(dict):
    """device -> Arena, made on first use."""

    def __missing__(self, device: torch.device) -> Arena:
        arena = self[device] = Arena(device)
        return arena

    def get(self, device: torch.device) -> Arena:     # type: ignore[override]
        return self[device]


__all__: Tuple[str, ...] = ("STATS_SLOTS", "Arena", "Arenas", "Slot")
