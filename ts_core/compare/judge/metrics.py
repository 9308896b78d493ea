"""Element-wise and statistics metrics for one golden/target pair (pure numpy).

Tensors are processed in flat chunks so a memory-mapped pair larger than RAM is compared
with bounded memory; every metric is an exact accumulation over the chunks.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Any, Callable, List, Mapping, Optional, Tuple

import numpy as np

from ...dumpfmt import STAT_FIELDS
from ...native import COMPARE_CHUNK, COMPARE_SEGMENT, compare_parts

CHUNK = COMPARE_CHUNK


@dataclass
class TensorMetrics:
    """What differs between two arrays of the same size, computed in float64.

    Errors and cosine use elements finite on both sides; ``allclose_ratio`` and the
    ``within_*`` shares count over all elements (equal Inf, and NaN-vs-NaN when
    ``equal_nan``, count as close). Relative error is |t-g|/|g|, 0 where both are 0,
    and inf where only the golden element is 0.
    """

    numel: int
    rtol: float
    atol: float
    cosine: Optional[float]
    max_abs_err: float
    mean_abs_err: float
    max_rel_err: float
    allclose_ratio: float
    within_0_1pct: float
    within_0_5pct: float
    euclidean: float
    golden_nan: int
    target_nan: int
    golden_inf: int
    target_inf: int
    nonfinite_mismatch: int
    worst_index: Optional[Tuple[int, ...]]
    worst_golden: Optional[float]
    worst_target: Optional[float]

    @property
    def n_outside(self) -> int:
        return self.numel - int(round(self.allclose_ratio * self.numel))

    def to_dict(self) -> dict:
        d = {name: getattr(self, name) for name in _METRIC_FIELDS}     # all scalars: no deep copy
        d["worst_index"] = list(self.worst_index) if self.worst_index is not None else None
        return d


_METRIC_FIELDS = tuple(f.name for f in fields(TensorMetrics))


def _as_float64(x: np.ndarray) -> np.ndarray:
    if np.iscomplexobj(x):
        return np.ascontiguousarray(x, dtype=np.complex128).view(np.float64)
    return np.asarray(x, dtype=np.float64)


class _Accumulator:
    def __init__(self, rtol: float, atol: float, equal_nan: bool):
        self.rtol, self.atol, self.equal_nan = rtol, atol, equal_nan
        self.n = self.n_finite = self.close = self.w1 = self.w5 = 0
        self.dot = self.gg = self.tt = self.sq = self.abs_sum = 0.0
        self.max_abs = self.max_rel = 0.0
        self.g_nan = self.t_nan = self.g_inf = self.t_inf = self.mismatch = 0
        self.worst_score, self.worst_pos = 0.0, None  # identical arrays have no worst element
        self.worst_g = self.worst_t = None

    def update(self, g: np.ndarray, t: np.ndarray, offset: int) -> None:
        if g.size and math.isfinite(float(g.sum())) and math.isfinite(float(t.sum())):
            self._update_finite(g, t, offset)    # the common case: no masks, no copies
        else:
            self._update_general(g, t, offset)

    def _update_finite(self, g: np.ndarray, t: np.ndarray, offset: int) -> None:
        """Same results as ``_update_general`` for chunks without NaN/Inf, in ~1/5 the passes:
        ``rel <= k`` is counted as ``|d| <= k|g|`` (no division), no masks, no copies."""
        n = g.size
        self.n += n
        self.n_finite += n
        d = t - g
        buf = np.empty_like(d)
        for a, b, name in ((d, d, "sq"), (g, t, "dot"), (g, g, "gg"), (t, t, "tt")):
            # multiply + pairwise sum: faster than BLAS dot for one chunk on a busy machine
            setattr(self, name, getattr(self, name) + float(np.multiply(a, b, out=buf).sum()))
        np.abs(d, out=d)
        ag = np.abs(g)
        self.abs_sum += float(d.sum())
        self.max_abs = max(self.max_abs, float(d.max()))
        self.w1 += int(np.count_nonzero(d <= 1e-3 * ag))
        self.w5 += int(np.count_nonzero(d <= 5e-3 * ag))
        tol = ag * self.rtol
        tol += self.atol
        self.close += int(np.count_nonzero(d <= tol))
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.divide(d, ag, out=ag)         # 0/0 -> nan (means 0), x/0 -> inf
            chunk_max = float(np.fmax.reduce(rel))   # fmax ignores nan
            score = np.divide(d, tol, out=tol)
        self.max_rel = max(self.max_rel, 0.0 if math.isnan(chunk_max) else chunk_max)
        if self.atol == 0:                            # only then can tol be 0 (and score nan)
            score[np.isnan(score)] = 0.0
        k = int(np.argmax(score))
        if score[k] > self.worst_score:
            self._set_worst(float(score[k]), offset + k, g[k], t[k])

    def _update_general(self, g: np.ndarray, t: np.ndarray, offset: int) -> None:
        self.n += g.size
        g_nan, t_nan = np.isnan(g), np.isnan(t)
        g_inf, t_inf = np.isinf(g), np.isinf(t)
        self.g_nan += int(g_nan.sum()); self.t_nan += int(t_nan.sum())
        self.g_inf += int(g_inf.sum()); self.t_inf += int(t_inf.sum())
        finite = ~(g_nan | t_nan | g_inf | t_inf)
        bad = (g_nan != t_nan) | ((g_inf | t_inf) & ~(g_nan | t_nan) & (g != t))
        n_bad = int(bad.sum())
        self.mismatch += n_bad

        close = np.isclose(t, g, rtol=self.rtol, atol=self.atol, equal_nan=self.equal_nan)
        self.close += int(close.sum())
        same_nonfinite = ~finite & ~bad & (~(g_nan & t_nan) | self.equal_nan)

        gf, tf = g[finite], t[finite]
        d = np.abs(tf - gf)
        ag = np.abs(gf)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(ag > 0, d / ag, np.where(d == 0, 0.0, np.inf))
            score = np.where(self.atol + self.rtol * ag > 0, d / (self.atol + self.rtol * ag),
                             np.where(d == 0, 0.0, np.inf))
        n_same = int(same_nonfinite.sum())
        self.w1 += int((rel <= 1e-3).sum()) + n_same
        self.w5 += int((rel <= 5e-3).sum()) + n_same
        if d.size:
            self.n_finite += d.size
            self.abs_sum += float(d.sum())
            self.sq += float(np.dot(tf - gf, tf - gf))
            self.dot += float(np.dot(gf, tf)); self.gg += float(np.dot(gf, gf)); self.tt += float(np.dot(tf, tf))
            self.max_abs = max(self.max_abs, float(d.max()))
            self.max_rel = max(self.max_rel, float(rel.max()))
            k = int(np.argmax(score))
            if score[k] > self.worst_score:
                pos = np.flatnonzero(finite)[k]
                self._set_worst(float(score[k]), offset + int(pos), g[pos], t[pos])
        if n_bad and self.worst_score < math.inf:
            pos = int(np.flatnonzero(bad)[0])
            self._set_worst(math.inf, offset + pos, g[pos], t[pos])

    def merge_native(self, sums: list, counts: list, g: np.ndarray, t: np.ndarray) -> None:
        """Add one part computed by the native kernel (compare.c's Sums/Counts layout)."""
        dot, gg, tt, sq, abs_sum, max_abs, max_rel, score, _, _ = sums
        n, n_finite, close, w1, w5, g_nan, t_nan, g_inf, t_inf, mismatch, pos = counts
        self.dot += dot; self.gg += gg; self.tt += tt; self.sq += sq; self.abs_sum += abs_sum
        self.max_abs = max(self.max_abs, max_abs)
        self.max_rel = max(self.max_rel, max_rel)
        self.n += n; self.n_finite += n_finite; self.close += close; self.w1 += w1; self.w5 += w5
        self.g_nan += g_nan; self.t_nan += t_nan; self.g_inf += g_inf; self.t_inf += t_inf
        self.mismatch += mismatch
        if pos >= 0 and score > self.worst_score:
            self._set_worst(score, pos, g[pos], t[pos])

    def _set_worst(self, score: float, pos: int, g: float, t: float) -> None:
        self.worst_score, self.worst_pos = score, pos
        self.worst_g, self.worst_t = float(g), float(t)

    def result(self, shape: Tuple[int, ...]) -> TensorMetrics:
        n = self.n
        if self.gg > 0 and self.tt > 0:
            cosine = max(-1.0, min(1.0, self.dot / math.sqrt(self.gg * self.tt)))
        elif self.gg == 0 and self.tt == 0 and self.n_finite:
            cosine = 1.0  # both all-zero: identical direction by convention
        else:
            cosine = None  # undefined: one side is all-zero, or nothing finite
        worst = None
        if self.worst_pos is not None:
            worst = tuple(int(i) for i in np.unravel_index(self.worst_pos, shape)) if shape else ()
        return TensorMetrics(
            numel=n, rtol=self.rtol, atol=self.atol, cosine=cosine,
            max_abs_err=self.max_abs, mean_abs_err=self.abs_sum / self.n_finite if self.n_finite else 0.0,
            max_rel_err=self.max_rel, allclose_ratio=self.close / n if n else 1.0,
            within_0_1pct=self.w1 / n if n else 1.0, within_0_5pct=self.w5 / n if n else 1.0,
            euclidean=math.sqrt(self.sq), golden_nan=self.g_nan, target_nan=self.t_nan,
            golden_inf=self.g_inf, target_inf=self.t_inf, nonfinite_mismatch=self.mismatch,
            worst_index=worst, worst_golden=self.worst_g, worst_target=self.worst_t)


def compare_arrays(golden: np.ndarray, target: np.ndarray, rtol: float, atol: float,
                   equal_nan: bool = True, chunk: Optional[int] = None) -> TensorMetrics:
    """Compare two same-size arrays chunk by chunk (works on np.memmap without loading it).

    ``target`` is judged against ``golden`` (numpy.isclose semantics:
    |t - g| <= atol + rtol * |g|). The worst element is the one furthest outside that bound.
    float32/float64/float16 pairs go through the native one-pass kernel, in parts of ``SEGMENT``
    elements spread over the compare threads; other dtypes, or no compiler, take the numpy
    accumulator (same results).
    """
    tasks, finish = compare_tasks(golden, target, rtol, atol, equal_nan, chunk)
    return finish(run_tasks(tasks))


def compare_tasks(golden: np.ndarray, target: np.ndarray, rtol: float, atol: float, equal_nan: bool = True,
                  chunk: Optional[int] = None) -> Tuple[List[Callable[[], Any]], Callable[[List[Any]], TensorMetrics]]:
    """``compare_arrays`` as independent tasks (the native kernel's parts, in element order, or
    one numpy task) and the step that turns their results into the metrics. The judge's
    read-ahead (``readahead.py``) submits the tasks of the next pairs before it needs them."""
    chunk = chunk or CHUNK
    if golden.size != target.size:
        raise ValueError(f"size differs: {golden.size} vs {target.size}")
    shape = tuple(golden.shape)
    g_flat, t_flat = golden.reshape(-1), target.reshape(-1)
    calls = _native_calls(g_flat, t_flat, rtol, atol, equal_nan, chunk)

    def numpy_path() -> TensorMetrics:
        g, t, s = g_flat, t_flat, shape
        if np.iscomplexobj(g) or np.iscomplexobj(t):
            g, t = _as_float64(g), _as_float64(t)
            s = (g.size,)
        acc = _Accumulator(rtol, atol, equal_nan)
        for start in range(0, g.size, chunk):
            acc.update(_as_float64(g[start:start + chunk]), _as_float64(t[start:start + chunk]), start)
        return acc.result(s)

    if calls is None:
        return [numpy_path], lambda results: results[0]

    def finish(results: List[Any]) -> TensorMetrics:
        acc = _merge_native(results, g_flat, t_flat, rtol, atol, equal_nan)
        return numpy_path() if acc is None else acc.result(shape)
    return calls, finish


# the dtypes compare.c reads (native.F32, F64, F16; bfloat16 is stored as float32)
_NATIVE_CODES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2}
SEGMENT = COMPARE_SEGMENT      # elements of one native part (native.compare_parts)
_pool = None


def _forget_threads() -> None:
    """In a forked child (the process pool of ``executor.py``): the parent's threads are not
    there, so its pool would take tasks and never run them."""
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_threads)


def _threads():
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)),
                                   thread_name_prefix="tsprobe-compare")
    return _pool


def submit(task: Callable[[], Any]) -> Any:
    """A future of `task` on the compare threads (the native kernel releases the GIL)."""
    return _threads().submit(task)


def run_tasks(tasks: List[Callable[[], Any]]) -> List[Any]:
    """The tasks' results in order: one runs here, several on the compare threads."""
    if len(tasks) == 1:
        return [tasks[0]()]
    return list(_threads().map(lambda task: task(), tasks))


def kernel_key(golden: np.ndarray, target: np.ndarray, rtol: float, atol: float, equal_nan: bool) -> Optional[Tuple]:
    """What the native kernel's part results of this pair depend on besides its bytes (dtype
    codes, element count, chunk, segment, tolerance); None when the kernel does not take it."""
    from ... import native

    gc, tc = _NATIVE_CODES.get(golden.dtype), _NATIVE_CODES.get(target.dtype)
    if gc is None or tc is None or golden.size != target.size or not native.available() \
            or not (golden.flags.c_contiguous and target.flags.c_contiguous):
        return None
    return (gc, tc, golden.size, CHUNK, SEGMENT, rtol, atol, bool(equal_nan))


def _native_calls(g: np.ndarray, t: np.ndarray, rtol: float, atol: float, equal_nan: bool,
                  chunk: int) -> Optional[List[Callable[[], Any]]]:
    """The native kernel's calls over two flat arrays, one per part of ``SEGMENT`` elements (cut
    on chunk boundaries); None when the kernel does not take them (not float32/64/16, not
    contiguous, or no kernel)."""
    from ... import native

    gc, tc = _NATIVE_CODES.get(g.dtype), _NATIVE_CODES.get(t.dtype)
    if gc is None or tc is None or not native.available() or not (g.flags.c_contiguous and t.flags.c_contiguous):
        return None
    ga, ta = g.ctypes.data, t.ctypes.data
    bounds = compare_parts(g.size, chunk, SEGMENT)
    # each call holds the arrays: a part still queued when its caller lets go reads mapped memory
    return [lambda b=b, e=e, _arrays=(g, t): native.compare_range(ga, gc, ta, tc, b, e, chunk, rtol, atol, equal_nan)
            for b, e in bounds]


def _merge_native(results: List[Any], g: np.ndarray, t: np.ndarray, rtol: float, atol: float,
                  equal_nan: bool) -> Optional[_Accumulator]:
    """The parts' results merged in element order (the earlier part wins ties); None when the
    kernel declined one."""
    if any(r is None for r in results):
        return None
    acc = _Accumulator(rtol, atol, equal_nan)
    for sums, counts in results:
        acc.merge_native(sums, counts, g, t)
    return acc


def _compare_native(g: np.ndarray, t: np.ndarray, rtol: float, atol: float, equal_nan: bool,
                    chunk: int) -> Optional[_Accumulator]:
    """The accumulator filled by the native kernel, or None (it does not take these arrays)."""
    calls = _native_calls(g, t, rtol, atol, equal_nan, chunk)
    return None if calls is None else _merge_native(run_tasks(calls), g, t, rtol, atol, equal_nan)


@dataclass
class StatMetrics:
    """Differences of the recorded Max/Min/Mean/Norm (target - golden).

    Relative differences divide by max(|golden value|, golden RMS) where the RMS
    (Norm / sqrt(numel)) is known, so a Mean close to zero does not blow up.
    """

    diffs: dict
    rel_diffs: dict
    nonfinite: list  # names of statistics whose NaN/Inf status differs

    @property
    def max_rel(self) -> float:
        vals = [v for v in self.rel_diffs.values() if v is not None]
        return max(vals) if vals else 0.0

    @property
    def worst_stat(self) -> Optional[str]:
        vals = {k: v for k, v in self.rel_diffs.items() if v is not None}
        return max(vals, key=vals.get) if vals else None


def stat_value(v: Any) -> Optional[float]:
    """One recorded statistic (Max/Min/Mean/Norm) as a float; None when absent or not a number."""
    return _num(v)


def _num(v: Any) -> Optional[float]:
    if v is None:
        return None
    if isinstance(v, (bool, int, float)):  # bool tensors: Max = any(), Min = all()
        return float(v)
    if isinstance(v, str):  # msprobe/json may carry "nan", "inf"
        try:
            return float(v)
        except ValueError:
            return None
    return None


def has_stats(summary: Optional[Mapping]) -> bool:
    return bool(summary) and any(_num(summary.get(k)) is not None for k in STAT_FIELDS)


def compare_stats(golden: Mapping, target: Mapping) -> StatMetrics:
    """Compare the statistics two tensor summaries recorded."""
    numel = None
    shape = golden.get("shape")
    if isinstance(shape, list) and all(isinstance(s, int) for s in shape):
        numel = int(np.prod(shape)) if shape else 1
    g_norm = _num(golden.get("Norm"))
    # msprobe writes a 0-d tensor's value as its Norm, so it can be negative
    rms = abs(g_norm) / math.sqrt(numel) if (g_norm is not None and numel and math.isfinite(g_norm)) else 0.0
    diffs, rels, nonfinite = {}, {}, []
    for k in STAT_FIELDS:
        g, t = _num(golden.get(k)), _num(target.get(k))
        if g is None or t is None:
            diffs[k] = rels[k] = None
            continue
        if not (math.isfinite(g) and math.isfinite(t)):
            same = (math.isnan(g) and math.isnan(t)) or g == t
            diffs[k] = 0.0 if same else (t - g if not (math.isnan(g) or math.isnan(t)) else math.nan)
            rels[k] = 0.0 if same else math.inf
            if not same:
                nonfinite.append(k)
            continue
        diffs[k] = t - g
        scale = max(abs(g), rms)
        rels[k] = abs(t - g) / scale if scale > 0 else (0.0 if t == g else math.inf)
    return StatMetrics(diffs, rels, nonfinite)
