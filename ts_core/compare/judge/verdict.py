"""Tolerances by dtype and the pass / warning / error verdict of one row, in words."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

from .metrics import StatMetrics, TensorMetrics

PASS, WARNING, ERROR = "pass", "warning", "error"
_RANK = {PASS: 0, WARNING: 1, ERROR: 2}


@dataclass(frozen=True)
class Tolerance:
    """``rtol``/``atol`` for element-wise checks; ``stat_rtol`` for recorded statistics.

    A statistics difference up to ``stat_rtol`` passes, up to 10x is a warning, beyond is an error.
    """

    rtol: float
    atol: float
    stat_rtol: float

    def to_dict(self) -> dict:
        return asdict(self)


# Float tolerances sit a few units in the last place above each format's precision:
# float32 eps ~1.2e-7 (cross-framework kernels drift ~1e-6), float16 ~9.8e-4, bfloat16 ~7.8e-3.
DEFAULT_TOLERANCES = {
    "float64": Tolerance(1e-7, 1e-9, 1e-7),
    "float32": Tolerance(1e-4, 1e-5, 1e-4),
    "float16": Tolerance(1e-3, 1e-3, 1e-3),
    "bfloat16": Tolerance(1e-2, 1e-3, 8e-3),   # msprobe rounds bf16 statistics to bf16
    "float8": Tolerance(1e-1, 1e-2, 5e-2),
    "exact": Tolerance(0.0, 0.0, 0.0),  # integers and bool
}

_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "bf16": "bfloat16",
            "fp32": "float32", "fp16": "float16", "fp64": "float64", "complex64": "float32",
            "complex128": "float64"}


def dtype_family(dtype: Optional[str]) -> str:
    """Map 'torch.float32', 'Float32', 'mindspore.bfloat16', 'int64' ... to a tolerance class."""
    if not dtype:
        return "float32"
    name = str(dtype).rsplit(".", 1)[-1].lower()
    name = _ALIASES.get(name, name)
    if name.startswith("float8") or name.startswith("hifloat8") or name.startswith("float4"):
        return "float8"
    if name in DEFAULT_TOLERANCES:
        return name
    if name.startswith(("int", "uint", "bool")):
        return "exact"
    return "float32"


def pick_tolerance(golden_dtype: Optional[str], target_dtype: Optional[str],
                   rtol: Optional[float] = None, atol: Optional[float] = None) -> Tolerance:
    """The tolerance of the more precise of both sides' dtypes, then the user's overrides.

    A float32 tensor that one side computed in bfloat16 is judged as float32: the call where
    precision was lost fails, not a later exact up-cast of its result. A user ``rtol`` also
    sets ``stat_rtol``: one knob for "how close is close".
    """
    fams = {dtype_family(golden_dtype), dtype_family(target_dtype)}
    tol = min((DEFAULT_TOLERANCES[f] for f in fams), key=lambda t: (t.rtol, t.atol))
    return Tolerance(tol.rtol if rtol is None else rtol, tol.atol if atol is None else atol,
                     tol.stat_rtol if rtol is None else rtol)


def worse(a: str, b: str) -> str:
    return a if _RANK[a] >= _RANK[b] else b


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


def values_equal(g, t) -> bool:
    """Equality of non-tensor values as recorded (floats to 1e-6 relative, lists element-wise)."""
    if isinstance(g, float) or isinstance(t, float):
        if isinstance(g, bool) or isinstance(t, bool) or not isinstance(g, (int, float)) \
                or not isinstance(t, (int, float)):
            return g == t
        if math.isnan(g) and math.isnan(t):
            return True
        return math.isclose(g, t, rel_tol=1e-6, abs_tol=0.0)
    if isinstance(g, list) and isinstance(t, list):
        return len(g) == len(t) and all(values_equal(a, b) for a, b in zip(g, t))
    return g == t
