"""Every verdict rule of a comparison: pass / warning / error of one recorded value (tensor
data, statistics, checksums, mask encodings, argument values), of a call one side runs alone,
and of a whole comparison, each with its reason in words. Tolerances: ``tolerances.py``."""
from __future__ import annotations

import math
import re
from itertools import permutations
from typing import Any, Dict, List, Optional, Tuple

from ...dumpfmt import STAT_FIELDS, UNINITIALIZED, checksum_kind, is_tensor_summary
from ...dumpfmt.dtypes import dtype_name
from ...dumpfmt.tensor_store import unmap_later
from ...verdicts import ERROR, PASS, WARNING, worse
from ..errors import TensorFileError
from ..predicates import values_equal
from .masks import encodings_differ, is_bool, same_mask, same_mask_stats
from ..chunks import gated
from . import readahead
from .readahead import PlannedRead
from .metrics import StatMetrics, TensorMetrics, compare_arrays, compare_stats, has_stats, stat_value
from .statsfirst import unchanged
from .tolerances import dtype_family, pick_tolerance

def _g(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.6g}"


def tensor_verdict(m: TensorMetrics) -> Tuple[str, str]:
    """Verdict of an element-wise comparison, with the worst element named."""
    tol = f"rtol={m.rtol:g}, atol={m.atol:g}"
    if m.numel == 0:
        return PASS, "empty tensors"
    worst = ""
    if m.worst_index is not None:
        worst = f"; worst at {list(m.worst_index)}: golden {_g(m.worst_golden)}, target {_g(m.worst_target)}"
    if m.nonfinite_mismatch:
        return ERROR, (f"NaN/Inf differ at {m.nonfinite_mismatch} positions (golden {m.golden_nan} NaN/"
                       f"{m.golden_inf} Inf, target {m.target_nan} NaN/{m.target_inf} Inf){worst}")
    shared = ""
    if m.golden_nan or m.golden_inf:
        shared = f"; both hold the same {m.golden_nan} NaN/{m.golden_inf} Inf"
    if m.n_outside == 0 and m.allclose_ratio >= 1.0:
        return PASS, f"all {m.numel} elements within {tol}; max abs err {_g(m.max_abs_err)}{shared}"
    cos = "n/a" if m.cosine is None else f"{m.cosine:.6f}"
    text = (f"{m.n_outside} of {m.numel} elements ({100 * (1 - m.allclose_ratio):.3g}%) outside {tol}"
            f"{worst}; cosine {cos}, max rel err {_g(m.max_rel_err)}{shared}")
    small = m.allclose_ratio >= 0.99 and (m.cosine is None or m.cosine >= 0.999)
    return (WARNING, "small deviation: " + text) if small else (ERROR, text)


# Mean and Norm of an integer or boolean tensor are floating results (float32 in one framework,
# float64 in another): an exact tensor is judged exactly on Max/Min, on these to float rounding.
DERIVED_RTOL = 1e-6


def stats_verdict(s: StatMetrics, stat_rtol: float, atol: float = 0.0, numel: Optional[int] = None,
                  exact: bool = False) -> Tuple[str, str]:
    """Verdict from recorded statistics alone (no tensor data): says so in the reason.

    A statistic within ``atol`` of golden passes whatever its relative difference (the norm
    within ``atol * sqrt(numel)``), as elements within ``atol`` do in tensor mode: a gradient
    that is zero up to rounding noise on both sides agrees. ``exact`` (integer or bool tensors):
    Mean and Norm within DERIVED_RTOL agree (the same mask's Norm, rounded differently)."""
    if s.nonfinite:
        return ERROR, f"statistics-based: NaN/Inf status of {', '.join(s.nonfinite)} differs"
    known = {k: v for k, v in s.rel_diffs.items() if v is not None}
    if exact:
        known = {k: (0.0 if k in ("Mean", "Norm") and v <= DERIVED_RTOL else v) for k, v in known.items()}
    if not known:
        return WARNING, "statistics-based: no comparable statistics recorded"
    if atol:
        floor = {k: atol * (math.sqrt(numel) if k == "Norm" and numel else 1.0) for k in known}
        known = {k: (0.0 if s.diffs.get(k) is not None and abs(s.diffs[k]) <= floor[k] else v)
                 for k, v in known.items()}
    worst = max(known, key=known.get)
    worst_rel = known[worst]
    shown = s.rel_diffs[worst]
    detail = f"{worst} rel diff {_g(shown)} (tolerance {stat_rtol:g}" + (f", atol {atol:g})" if atol else ")")
    if worst_rel <= stat_rtol:
        return PASS, f"statistics-based: Max/Min/Mean/Norm within {stat_rtol:g}; worst {detail}"
    if worst_rel <= 10 * stat_rtol:
        return WARNING, f"statistics-based: small deviation, {detail}"
    return ERROR, f"statistics-based: {detail}"


def differs(r: Any) -> bool:
    """The one "differs" rule: a row's two values are not identical, even when within tolerance
    (element-wise data, then checksums, then any recorded statistic). The first-divergence walk
    follows such values upstream; the diagnosis reads them where no output failed."""
    if r.max_abs_err is not None:
        return r.max_abs_err > 0
    if r.md5_equal is not None:
        return not r.md5_equal
    return any(v for v in (r.max_diff, r.min_diff, r.mean_diff, r.norm_diff) if v)


_DEVICE = re.compile(r"(cpu|cuda|npu|xpu|mps|meta|hpu|mlu|musa|ascend|gpu)(:\d+)?", re.IGNORECASE)


def is_device(leaf: Any) -> bool:
    """A recorded device (``{"type": "torch.device", "value": "cuda:0"}``, or the string
    ``"cpu"``): where a run placed its tensors, not a value of the computation."""
    if not isinstance(leaf, dict):
        return False
    v = leaf.get("value")
    if leaf.get("type") in ("torch.device", "device"):
        return True
    return isinstance(v, str) and _DEVICE.fullmatch(v) is not None


# The verdict of one recorded value pair: the rules in order (shape, empty, mask encodings,
# element-wise data, statistics, checksums), each with its reason in words.

def _shape(s) -> Optional[list]:
    return list(s) if isinstance(s, (list, tuple)) else None


def _squeezed(shape: list) -> list:
    return [d for d in shape if d != 1]


def _what(leaf) -> str:
    if leaf is None:
        return "None (or an object whose value it does not record)"
    if is_tensor_summary(leaf):
        return "a tensor"
    if _opaque(leaf):
        return f"a {leaf.get('type') or 'Python'} object (its value not recorded)"
    return f"the value {_value(leaf)!r}"


def _opaque(leaf) -> bool:
    """None, or a non-tensor object recorded without a value (``{"type": "DynamicCache", "value":
    null}``): msprobe writes null for any object it cannot encode, tsprobe its type."""
    return leaf is None or (isinstance(leaf, dict) and not is_tensor_summary(leaf) and leaf.get("value") is None)


def _value(leaf) -> object:
    return leaf.get("value") if isinstance(leaf, dict) else leaf


def judge_value(gl: Any, tl: Any, row: Any, gd: Any, td: Any, opts: Any, exact_shape: bool = True) -> bool:
    """Fill ``row`` (a ``model.Row``) for one recorded value of a call pair: its dtypes, shapes,
    metrics, mode, verdict and reason. False when there is nothing to say (equal non-tensor
    arguments). ``gd``/``td`` load tensor files (``Dump``); ``opts`` gives the user's
    tolerances, ``stats_only`` and ``equal_nan``. ``exact_shape=False`` (values of two
    different ops, e.g. a group's boundary): the same elements in another shape or layout
    compare as equal ([2, 5, 16] vs the [10, 16] MatMul saw)."""
    g_tensor, t_tensor = is_tensor_summary(gl), is_tensor_summary(tl)
    if g_tensor:
        row.golden_dtype, row.golden_shape = gl.get("dtype"), _shape(gl.get("shape"))
        recorded_stats(row, "golden", gl)
    if t_tensor:
        row.target_dtype, row.target_shape = tl.get("dtype"), _shape(tl.get("shape"))
        recorded_stats(row, "target", tl)
    if (gl is None or tl is None) and _opaque(gl) and _opaque(tl):
        return False          # the same unrecorded object, written as null by one tool and by type by the other
    if gl is None or tl is None or g_tensor != t_tensor:
        row.verdict = WARNING
        row.reason = f"golden recorded {_what(gl)}, target recorded {_what(tl)}"
        return True
    if not g_tensor:
        gv, tv = _value(gl), _value(tl)
        if values_equal(gv, tv) or (is_device(gl) and is_device(tl)):
            return False        # two devices (a CPU run against a CUDA run) are no finding
        row.mode, row.golden_value, row.target_value = "value", gv, tv
        row.verdict, row.reason = WARNING, f"argument differs: golden {gv!r}, target {tv!r}"
        return True
    if gl.get(UNINITIALIZED) or tl.get(UNINITIALIZED):
        row.mode, row.verdict = UNINITIALIZED, PASS
        sides = " and ".join(s for s, v in (("golden", gl), ("target", tl)) if v.get(UNINITIALIZED))
        row.reason = (f"not compared: {sides} read memory nothing had written yet (a buffer from "
                      f"empty/new_empty before it was filled)")
        return True
    _judge_tensor(gl, tl, row, gd, td, opts, exact_shape)
    return True


def recorded_stats(row: Any, side: str, leaf: dict) -> None:
    """Each side's own Max/Min/Mean/Norm on its row: compare.csv and report.html show both, as
    msprobe's CSV does (Bench max ... NPU l2norm)."""
    for k in STAT_FIELDS:
        setattr(row, f"{side}_{k.lower()}", stat_value(leaf.get(k)))


def one_sided(side: str, other: str, harmless: Optional[str]) -> Tuple[str, str]:
    """Verdict and reason of the values of a call that runs on one side only: a pass when
    alignment found it harmless (``harmless``: why), else a warning."""
    if harmless:
        return PASS, f"call only in {side}: {harmless}, it cannot change a result"
    return WARNING, f"call only in {side}: no matching call in {other}"


# What explain/divergence.py marks on a row that differs only in how the two sides split a
# computation (the first-divergence walk finds them; the verdict is decided here).
REORDERED = "reordered"           # a chain fed in another order whose result agrees again
SPLIT_OUTPUT = "split_output"     # outputs of two different ops that every consumer receives agreeing
SPLIT_INPUT = "split_input"       # inputs made by other (agreeing) calls, of a call whose outputs agree


def settle(row: Any, mark: str, why: str) -> str:
    """The verdict of a row explain marked as an artefact of splitting a computation: every
    such mark passes the row (its difference is not a difference of results). Returns `mark`."""
    if mark not in (REORDERED, SPLIT_OUTPUT, SPLIT_INPUT):
        raise ValueError(f"unknown artefact mark {mark!r}")
    row.verdict, row.reason = PASS, f"{why}; as paired: {row.reason}"
    return mark


def extra_call_verdict(side: str, consumer: str, arg: str) -> Tuple[str, str]:
    """A call one side runs alone whose output feeds a differing input: an error, always."""
    return ERROR, f"call present only in {side}; its output feeds {consumer} ({arg}), which differs"


def result_verdict(counts: Dict[str, int], different_programs: bool, unpaired: bool) -> str:
    """A whole comparison's verdict: the worst row verdict (a first divergence that is a
    warning leaves it a warning); ERROR when the dumps describe different programs; at least
    WARNING when a step/rank has no partner."""
    if different_programs:
        return ERROR
    if counts.get(ERROR):
        return ERROR
    if counts.get(WARNING) or unpaired:
        return WARNING
    return PASS


def pair_verdict(diverged: bool, counts: Dict[str, int]) -> str:
    """One step/rank's verdict in the many-rank summary: an error when it has a first
    divergence or an error row, else the worst row verdict."""
    if diverged or counts.get(ERROR):
        return ERROR
    return WARNING if counts.get(WARNING) else PASS


def _numel(shape: Optional[list]) -> Optional[int]:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    n = 1
    for d in shape:
        n *= d
    return n


def _judge_tensor(gl: dict, tl: dict, row: Any, gd: Any, td: Any, opts: Any, exact_shape: bool = True) -> Any:
    tol = pick_tolerance(row.golden_dtype, row.target_dtype, opts.rtol, opts.atol)
    exact = "exact" in (dtype_family(row.golden_dtype), dtype_family(row.target_dtype))   # as pick_tolerance
    row.rtol, row.atol, row.stat_rtol = tol.rtol, tol.atol, tol.stat_rtol
    notes: List[str] = []
    if dtype_name(row.golden_dtype) != dtype_name(row.target_dtype):
        notes.append(f"dtype differs ({row.golden_dtype} vs {row.target_dtype}), compared at the tolerance of "
                     f"the more precise one")
    gs, ts = row.golden_shape, row.target_shape
    layout = False
    if gs is not None and ts is not None and gs != ts:
        if _squeezed(gs) == _squeezed(ts):
            notes.append(f"shapes {gs} and {ts} differ only in size-1 dimensions")
        elif not exact_shape and _numel(gs) == _numel(ts):
            layout = True
            notes.append(f"shapes {gs} and {ts} hold the same number of elements: compared as one value in "
                         f"two layouts")
        else:
            row.mode, row.verdict = "tensor", ERROR
            row.reason = "; ".join([f"shape differs: golden {gs}, target {ts}"] + notes)
            return row
    if gs is not None and ts is not None and 0 in gs and 0 in ts:
        row.mode, row.verdict, row.reason = "tensor", PASS, "; ".join(["empty tensors"] + notes)
        return row
    if encodings_differ(gl, tl):
        mask = _one_mask(gl, tl, gd, td, opts)
        if mask is not None:
            row.mode, row.verdict = mask[0], PASS
            row.reason = "; ".join([f"the same mask in two encodings: boolean ({mask[1]}) and additive float "
                                    f"(0 / large negative)"] + notes)
            return row
    stats = None
    if has_stats(gl) and has_stats(tl):
        stats = compare_stats(gl, tl)
        for k in STAT_FIELDS:
            setattr(row, f"{k.lower()}_diff", stats.diffs[k])
            setattr(row, f"{k.lower()}_rel_diff", stats.rel_diffs[k])
    kind = checksum_kind(gl.get("md5")) or "checksum"     # crc32 (md5 mode) or xor: compared within a kind
    if gl.get("md5") is not None and tl.get("md5") is not None \
            and checksum_kind(gl["md5"]) == checksum_kind(tl["md5"]):
        row.md5_equal = str(gl["md5"]) == str(tl["md5"])

    unread = unchanged(gl, tl) if opts.stats_first and not layout else ""     # statistics first
    if unread:
        notes.append(unread)
    if not opts.stats_only and not unread and gl.get("data_name") and tl.get("data_name"):
        try:
            verdict, reason = gated(lambda r: _compare_data(gl["data_name"], tl["data_name"], r, gd, td, tol, opts,
                                                            layout), row)
            if verdict == PASS or not layout or stats is None or stats_verdict(stats, tol.stat_rtol, tol.atol, _numel(gs), exact)[0] != PASS:
                row.mode, row.verdict, row.reason = "tensor", verdict, "; ".join([reason] + notes)
                return row
            notes.append("element-wise in no layout tried; the statistics (which do not depend on the layout) "
                         "agree")
        except TensorFileError as e:
            notes.append(f"{e}; compared statistics instead")
    elif not opts.stats_only and not unread and (gl.get("data_name") or tl.get("data_name")):
        side = "target" if gl.get("data_name") else "golden"
        notes.append(f"{side} has no tensor data; compared statistics")

    if stats is not None:
        verdict, reason = stats_verdict(stats, tol.stat_rtol, tol.atol, _numel(gs), exact)
        row.mode = "statistics"
        if row.md5_equal is True:
            verdict, reason = PASS, f"bitwise equal ({kind})"
        elif row.md5_equal is False:
            verdict, reason = worse(verdict, WARNING), f"bitwise different ({kind}); {reason}"
    elif row.md5_equal is not None:
        row.mode = "md5"
        verdict, reason = (PASS, f"bitwise equal ({kind})") if row.md5_equal else (ERROR, f"bitwise different ({kind})")
    else:
        verdict, reason = WARNING, "nothing comparable recorded (no data, statistics or md5)"
    row.verdict, row.reason = verdict, "; ".join([reason] + notes)
    return row


def _one_mask(gl: dict, tl: dict, gd: Any, td: Any, opts: Any):
    """(mode, the boolean's convention) when a boolean and a float tensor hold one attention
    mask (masks.py), from the data when both sides saved it, else from statistics; else None."""
    b, f = (gl, tl) if is_bool(gl) else (tl, gl)
    bd, fd = (gd, td) if b is gl else (td, gd)
    if not opts.stats_only and b.get("data_name") and f.get("data_name"):
        try:
            how = same_mask(bd.load_tensor(b["data_name"]), fd.load_tensor(f["data_name"]))
            return ("tensor", how) if how else None
        except TensorFileError:
            pass
    how = same_mask_stats(b, f) if has_stats(b) and has_stats(f) else None
    return ("statistics", f"{how}, from statistics") if how else None


def _layouts(ga, ta):
    """Target arrays to try against golden: the same elements in golden's shape, then (for a
    layout transpose on one side) every axis order of target that gives golden's shape."""
    yield ta.reshape(ga.shape)
    gshape = [d for d in ga.shape if d != 1]
    tt = ta.reshape([d for d in ta.shape if d != 1])
    if sorted(gshape) == sorted(tt.shape) and 1 < tt.ndim <= 5:
        for p in permutations(range(tt.ndim)):
            if list(p) != list(range(tt.ndim)) and [tt.shape[i] for i in p] == gshape:
                yield tt.transpose(p).reshape(ga.shape)


def planned_read(gl: Any, tl: Any, gd: Any, td: Any, opts: Any) -> Optional[PlannedRead]:
    """The data read ``_judge_tensor`` will make for this value pair when it compares the two
    tensors in their own shape, for the read-ahead to start early; None when it will not read
    them, or may read them another way (a hint: the judge still decides, see readahead.py)."""
    if opts.stats_only or not (is_tensor_summary(gl) and is_tensor_summary(tl)):
        return None
    g_name, t_name = gl.get("data_name"), tl.get("data_name")
    if not (g_name and t_name) or gl.get(UNINITIALIZED) or tl.get(UNINITIALIZED):
        return None
    gs, ts = _shape(gl.get("shape")), _shape(tl.get("shape"))
    if gs is None or ts is None or 0 in gs or (gs != ts and _squeezed(gs) != _squeezed(ts)):
        return None
    if encodings_differ(gl, tl) or (opts.stats_first and unchanged(gl, tl)):
        return None
    tol = pick_tolerance(gl.get("dtype"), tl.get("dtype"), opts.rtol, opts.atol)
    return PlannedRead(gd, g_name, td, t_name, tol.rtol, tol.atol, opts.equal_nan)


def _compare_data(g_name: str, t_name: str, row: Any, gd: Any, td: Any, tol, opts: Any,
                  layout: bool = False) -> Tuple[str, str]:
    ahead = None if layout else readahead.take(PlannedRead(gd, g_name, td, t_name, tol.rtol, tol.atol,
                                                           opts.equal_nan))
    m = ahead.judged_before() if ahead else None      # the same two files, judged for an earlier row
    if m is None:
        ga, ta = ahead.arrays() if ahead else (gd.load_tensor(g_name), td.load_tensor(t_name))
        if ga.size != ta.size:
            return ERROR, f"tensor data size differs: golden {list(ga.shape)}, target {list(ta.shape)}"
        m = (ahead.metrics() if ahead else None) or _metrics(ga, ta, tol, opts, layout)
        unmap_later(ga, ta)
    for k, v in m.to_dict().items():
        if hasattr(row, k) and k not in ("rtol", "atol"):
            setattr(row, k, v)
    return tensor_verdict(m)


def _metrics(ga: Any, ta: Any, tol, opts: Any, layout: bool) -> TensorMetrics:
    """Target against golden in golden's shape; with `layout`, in the first layout tried that
    passes, else the closest one."""
    m = None
    for cand in (_layouts(ga, ta) if layout else [ta.reshape(ga.shape) if ga.shape != ta.shape else ta]):
        got = compare_arrays(ga, cand, tol.rtol, tol.atol, equal_nan=opts.equal_nan)
        if m is None or got.allclose_ratio > m.allclose_ratio:
            m = got
        if tensor_verdict(m)[0] == PASS:
            break
    return m
