"""Native kernels: one-pass tensor statistics over host memory, all compare metrics of a
golden/target pair in one pass, the calling thread's Python stack as raw (code, position) pairs
(``frame_walker``), and the fastest CRC-32 available (ISA-L's through the ``isal`` package, else
zlib's; same values).

The C code is the extension ``ts_core.native._kernels``, built by setup.py when the package is
installed (``pip install .`` / ``pip install -e .``); nothing is compiled or written at run time.
Without it (no C compiler at install, or ``TSPROBE_NATIVE=0``) ``available()`` is False and
callers take their pure numpy/framework paths: the same values up to float rounding
(tests/core/test_native_ext.py). ``TSPROBE_NATIVE=baseline`` keeps the extension but its
portable loops only (no AVX2/AVX-512): the same bits, slower.

``Stats()(address, numel, dtype_code)`` returns ``(max, min, sum, sum_of_squares)`` of a
contiguous host buffer, or None when a NaN/Inf was met (the caller then takes its framework's
exact path, which propagates NaN as the framework does).
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, List, Optional, Tuple

try:        # ISA-L: ~4x zlib's CRC-32 on this hardware; zlib-compatible polynomial and values
    from isal.isal_zlib import crc32 as _crc32
except ImportError:      # pragma: no cover - optional dependency
    from zlib import crc32 as _crc32

# dtype codes understood by stats.c (compare.c takes F32, F64, F16, BF16); kernels.h has the same
F32, F64, F16, BF16, I8, U8, I16, I32, I64, BOOL = range(10)

# The extension's ABI that this file speaks (module.c's TSP_ABI).
ABI = 4

_lock = threading.Lock()
_mod: Any = None
_tried = False
_why = ""


def _load() -> Any:
    """The extension module, or None (and ``_why`` says why)."""
    global _mod, _tried, _why
    if _tried:
        return _mod
    with _lock:
        if _tried:
            return _mod
        setting = os.environ.get("TSPROBE_NATIVE", "1")
        if setting == "0":
            _why = "TSPROBE_NATIVE=0"
        else:
            try:
                from . import _kernels as mod
            except ImportError as exc:
                _why = f"the extension was not built at install ({exc}); reinstall with a C compiler"
            else:
                if getattr(mod, "ABI", None) != ABI:
                    _why = (f"stale build ({mod.__file__}: ABI {getattr(mod, 'ABI', None)}, want {ABI}); "
                            "rebuild with `pip install -e .` (or `python setup.py build_ext --inplace`)")
                else:
                    mod.init(setting != "baseline")
                    _mod = mod
        _tried = True
        return _mod


def available() -> bool:
    """True when the native kernels are in use."""
    return _load() is not None


def describe() -> str:
    """One line for ``tsprobe --version``: which kernels are in use, and why not when not."""
    mod = _load()
    if mod is None:
        return f"native kernels: not in use ({_why}); pure numpy/framework paths"
    return f"native kernels: in use ({mod.init(os.environ.get('TSPROBE_NATIVE', '1') != 'baseline')} loops, {mod.__file__})"


class Stats:
    """The statistics kernel. ``row`` is what the torch backend calls per tensor: it is the C
    function itself (no Python frame in between)."""

    __slots__ = ("_fn", "row")

    def __init__(self) -> None:
        mod = _load()
        if mod is None:
            raise RuntimeError(f"tsprobe native kernels are not available: {_why}")
        self._fn = mod.stats
        # (max, min, mean, norm), or None on NaN/Inf. A tuple of floats: the GC untracks it, so
        # a step's cache of rows is never promoted towards a full collection (Collector._emit).
        self.row: Callable[[int, int, int], Optional[Tuple[float, float, float, float]]] = mod.row

    def __call__(self, address: int, numel: int, code: int) -> Optional[Tuple[float, float, float, float]]:
        """(max, min, sum, sum of squares), or None on NaN/Inf."""
        return self._fn(address, numel, code)


MAX_FRAMES = 512


def frame_walker() -> Optional[Callable[[], Optional[bytes]]]:
    """A function returning the calling thread's Python stack, innermost first (the caller's
    frame included), as bytes of int64 (code object address, instruction offset or line) pairs:
    a key for the stack, not its text. It returns None for a stack deeper than ``MAX_FRAMES``.
    None when the extension is unavailable. The addresses identify code objects only while the
    caller keeps them alive (``StackRecorder`` does)."""
    mod = _load()
    if mod is None:
        return None
    walk = mod.frames
    return lambda: walk(MAX_FRAMES)


def crc32_hex(buffer: Any) -> str:
    """The ``md5`` field of a tensor summary: CRC-32 of the raw bytes as 8 hex digits."""
    return f"{_crc32(buffer) & 0xFFFFFFFF:08x}"


# The compare kernel's geometry: metrics accumulate per CHUNK elements, and a pair is cut into
# parts of SEGMENT elements (on chunk boundaries) whatever the number of cores, so its float64
# sums are added in one order, and round the same, on every machine.
COMPARE_CHUNK = 1 << 20
COMPARE_SEGMENT = 1 << 21


def compare_parts(n: int, chunk: int = COMPARE_CHUNK, segment: int = COMPARE_SEGMENT) -> List[Tuple[int, int]]:
    """[begin, end) of each kernel part of an n-element pair, in element order."""
    step = max(chunk, segment // chunk * chunk)
    return [(b, min(b + step, n)) for b in range(0, n, step)] or [(0, 0)]


def compare_range(golden_addr: int, golden_code: int, target_addr: int, target_code: int, begin: int, end: int,
                  chunk: int, rtol: float, atol: float, equal_nan: bool) -> Optional[Tuple[List[float], List[int]]]:
    """Metrics accumulators of elements [begin, end) of two float32/float64/float16/bfloat16 buffers:
    (sums, counts) as laid out in compare.c, or None when the kernel is unavailable."""
    mod = _load()
    if mod is None:
        return None
    return mod.compare(golden_addr, golden_code, target_addr, target_code, begin, end, chunk, rtol, atol,
                       bool(equal_nan))
