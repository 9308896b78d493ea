"""Native kernels (plain C, loaded with ctypes; the GIL is released while they run):
one-pass tensor statistics over host memory, all compare metrics of a golden/target pair in
one pass, the calling thread's Python stack as raw (code, line) pairs (``frame_walker``), and
the fastest CRC-32 available (ISA-L's through the ``isal`` package, else zlib's;
same values).

``stats(address, numel, dtype_code)`` returns ``[max, min, sum, sum_of_squares]`` of a
contiguous host buffer, or None when a NaN/Inf was met (the caller then takes its framework's
exact path, which propagates NaN as the framework does). ``available()`` is False when the
library cannot be built or ``TSPROBE_NATIVE=0``.
"""
from __future__ import annotations

import ctypes
import math
import os
import struct
import threading
from typing import Callable, List, Optional, Tuple

from . import build as _build

try:        # ISA-L: ~4x zlib's CRC-32 on this hardware; zlib-compatible polynomial and values
    from isal.isal_zlib import crc32 as _crc32
except ImportError:      # pragma: no cover - optional dependency
    from zlib import crc32 as _crc32

# dtype codes understood by stats.c (compare.c takes F32 and F64)
F32, F64, F16, BF16, I8, U8, I16, I32, I64, BOOL = range(10)

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_tried = False


def _load() -> Optional[ctypes.CDLL]:
    global _lib, _tried
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get("TSPROBE_NATIVE", "1") == "0":
            return None
        paths = [os.path.join(d, _build.LIB_NAME) for d in _build.library_dirs()]
        newest = max(os.path.getmtime(src) for src in _build.SOURCES)
        path = next((p for p in paths if os.path.isfile(p) and os.path.getmtime(p) >= newest), None) \
            or _build.build()
        if path is None:
            return None
        try:
            lib = ctypes.CDLL(path)
            lib.tsp_stats.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
            lib.tsp_stats.restype = ctypes.c_int
            lib.tsp_compare.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_double, ctypes.c_double,
                                        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
            lib.tsp_compare.restype = ctypes.c_int
            if lib.tsp_abi_version() != _build.ABI:
                return None
        except (OSError, AttributeError):
            return None
        _lib = lib
        return _lib


def available() -> bool:
    return _load() is not None


class Stats:
    """The statistics kernel with an output buffer per calling thread: the kernel runs with the
    GIL released, so threads sharing one buffer would read each other's results."""

    __slots__ = ("_fn", "_local", "_unpack")

    def __init__(self) -> None:
        lib = _load()
        if lib is None:
            raise RuntimeError("tsprobe native kernels are not available")
        self._fn = lib.tsp_stats
        self._local = threading.local()
        self._unpack = struct.Struct("4d").unpack_from

    def __call__(self, address: int, numel: int, code: int) -> Optional[Tuple[float, float, float, float]]:
        """(max, min, sum, sum of squares), or None on NaN/Inf."""
        out = getattr(self._local, "out", None)
        if out is None:
            out = self._local.out = (ctypes.c_double * 4)()
        if self._fn(address, numel, code, ctypes.addressof(out)) != 0:
            return None
        return self._unpack(out)

    def row(self, address: int, numel: int, code: int) -> Optional[Tuple[float, float, float, float]]:
        """(max, min, mean, norm), or None on NaN/Inf. A tuple of floats: the GC untracks it, so
        a step's cache of rows is never promoted towards a full collection (Collector._emit)."""
        sums = self(address, numel, code)
        if sums is None:
            return None
        mx, mn, total, squares = sums
        return (mx, mn, total / numel, math.sqrt(squares))


MAX_FRAMES = 512


def frame_walker() -> Optional[Callable[[], Optional[bytes]]]:
    """A function returning the calling thread's Python stack, innermost first, as bytes of
    int64 (code object address, instruction offset or line) pairs (its own frame included): a
    key for the stack, not its text. None for a stack
    deeper than ``MAX_FRAMES``; None when the library is unavailable. The addresses identify
    code objects only while the caller keeps them alive (``StackRecorder`` does)."""
    lib = _load()
    if lib is None:
        return None
    try:
        gil = ctypes.PyDLL(lib._name)           # the same library, called with the GIL held
        api = ctypes.pythonapi
        init = gil.tsp_frames_init
        init.argtypes = [ctypes.c_void_p] * 5
        init.restype = ctypes.c_int
        position = getattr(api, "PyFrame_GetLasti", None) or api.PyFrame_GetLineNumber   # 3.11+: O(1)
        funcs = (api.PyEval_GetFrame, api.PyFrame_GetBack, api.PyFrame_GetCode, position, api.Py_DecRef)
        if init(*(ctypes.cast(f, ctypes.c_void_p).value for f in funcs)) != 0:
            return None
        walk = gil.tsp_frames
        walk.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        walk.restype = ctypes.c_int64
    except (OSError, AttributeError):      # an interpreter without the 3.9+ frame API
        return None
    local = threading.local()              # the GIL may pass to another thread between two lines
    string_at = ctypes.string_at

    def frames() -> Optional[bytes]:
        buf = getattr(local, "buf", None)
        if buf is None:
            local.array = (ctypes.c_int64 * (2 * MAX_FRAMES))()     # kept alive by the thread's local
            buf = local.buf = ctypes.addressof(local.array)
        n = walk(buf, MAX_FRAMES)
        return string_at(buf, 16 * n) if n >= 0 else None

    return frames


def crc32_hex(buffer) -> str:
    """The ``md5`` field of a tensor summary: CRC-32 of the raw bytes as 8 hex digits."""
    return f"{_crc32(buffer) & 0xFFFFFFFF:08x}"


def compare_range(golden_addr: int, golden_code: int, target_addr: int, target_code: int, begin: int, end: int,
                  chunk: int, rtol: float, atol: float, equal_nan: bool) -> Optional[Tuple[List[float], List[int]]]:
    """Metrics accumulators of elements [begin, end) of two float32/float64 buffers:
    (sums, counts) as laid out in compare.c, or None when the kernel is unavailable."""
    lib = _load()
    if lib is None:
        return None
    sums = (ctypes.c_double * 10)()
    counts = (ctypes.c_int64 * 11)()
    counts[10] = -1
    if lib.tsp_compare(golden_addr, golden_code, target_addr, target_code, begin, end, chunk, rtol, atol,
                       int(bool(equal_nan)), ctypes.addressof(sums), ctypes.addressof(counts)) != 0:
        return None
    return list(sums), list(counts)
