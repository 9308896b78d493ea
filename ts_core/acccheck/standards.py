"""Grading one recorded output against its float64 reference: metrics and standards, in numpy.

Three standards, chosen per output (``standard_for``):

- ``binary``: integer/bool outputs, and float outputs of APIs that only select, move or compare
  values (``binary_apis``): equal to the reference rounded to the output dtype, bit for bit.
- ``benchmark`` (msprobe's): each metric of the recorded output (max/mean relative error, RMSE,
  small-value error ratio, error balance) divided by the same metric of the *peer*, the same
  call replayed on CPU in the recorded dtype, both against the float64 reference. The recorded
  output fails when it is clearly worse than a standard kernel of its own precision.
- ``ulp``: where no independent peer exists (a custom API replayed through its own code, a
  dtype with no CPU kernel), the share of elements off by more than a few units in the last
  place of the output format.

Needs only numpy and pyyaml.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import yaml

from ..dumpfmt.dtypes import dtype_name
from ..verdicts import ERROR, PASS

STANDARDS_YAML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standards.yaml")
BINARY, BENCHMARK, ULP = "binary", "benchmark", "ulp"


@lru_cache(maxsize=8)
def load_standards(path: str = STANDARDS_YAML) -> Dict[str, Any]:
    """The standards file (``standards.yaml`` or a user's copy), checked for its sections."""
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    missing = {"dtypes", "benchmark_thresholds", "error_balance", "api_levels", "binary_apis",
               "random_apis"} - set(data)
    if missing:
        raise ValueError(f"{path}: missing sections {sorted(missing)} (see {STANDARDS_YAML})")
    return data


def is_float_dtype(dtype: Optional[str]) -> bool:
    return dtype_name(dtype).startswith(("float", "bfloat", "complex"))


def round_to(arr: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values rounded to `dtype` (round to nearest even), returned as float64."""
    d = dtype_name(dtype)
    arr = np.asarray(arr, dtype=np.float64)
    if d in ("float16", "float32"):
        with np.errstate(over="ignore"):
            return arr.astype(d).astype(np.float64)
    if d == "bfloat16":
        with np.errstate(over="ignore"):
            f = np.ascontiguousarray(arr.astype(np.float32))
        bits = f.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        out = rounded.astype(np.uint32).view(np.float32).astype(np.float64)
        return np.where(np.isnan(f), np.nan, out)
    return arr


@dataclass
class Metrics:
    """How far one output is from the reference; names follow msprobe's details CSV."""

    numel: int
    cosine: Optional[float] = None
    max_abs_err: Optional[float] = None
    rel_err_hundredth: Optional[float] = None       # share of elements with rel err < 1%   (双百)
    rel_err_thousandth: Optional[float] = None      # ... < 0.1%                            (双千)
    rel_err_ten_thousandth: Optional[float] = None  # ... < 0.01%                           (双万)
    error_rate: Optional[float] = None              # share not bit-equal (binary standard)
    eb: Optional[float] = None                      # error balance |#above - #below| / n
    rmse: Optional[float] = None
    small_value_err_ratio: Optional[float] = None
    max_rel_err: Optional[float] = None
    mean_rel_err: Optional[float] = None
    inf_nan_err_ratio: Optional[float] = None
    max_ulp_err: Optional[float] = None
    mean_ulp_err: Optional[float] = None
    ulp_err_proportion: Optional[float] = None

    def to_dict(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def measure(reference: np.ndarray, output: np.ndarray, dtype: str, std: Optional[Dict[str, Any]] = None) -> Metrics:
    """Every metric of `output` (recorded in `dtype`) against the float64 `reference`."""
    std = std or load_standards()
    ref = np.asarray(reference, dtype=np.float64).reshape(-1)
    out = np.asarray(output, dtype=np.float64).reshape(-1)
    n = int(ref.size)
    m = Metrics(numel=n)
    if n == 0:
        return m
    d = dtype_name(dtype)
    cfg = std["dtypes"].get(d)
    ref_d = round_to(ref, d)
    same = (out == ref_d) | (np.isnan(out) & np.isnan(ref_d))
    m.error_rate = float(1.0 - same.mean())
    if cfg is None:                      # integers, bool: equality is the whole story
        return m
    finite = np.isfinite(out) & np.isfinite(ref_d)
    nonfinite = ~finite
    m.inf_nan_err_ratio = float((nonfinite & ~same).sum() / nonfinite.sum()) if nonfinite.any() else 0.0
    abs_err = np.abs(out - ref)
    abs_err[nonfinite] = 0.0
    abs_ref = np.abs(ref)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rel = abs_err / (abs_ref + cfg["rel_eps"])
    rel[nonfinite] = 0.0
    small = (abs_ref <= cfg["small_value"]) & finite
    normal = finite & ~small
    m.max_abs_err = float(abs_err.max())
    m.rel_err_hundredth = float((rel < 0.01).mean())
    m.rel_err_thousandth = float((rel < 0.001).mean())
    m.rel_err_ten_thousandth = float((rel < 0.0001).mean())
    m.max_rel_err = float(rel[normal].max()) if normal.any() else 0.0
    m.mean_rel_err = float(rel[normal].mean()) if normal.any() else 0.0
    m.rmse = float(math.sqrt(float(np.mean(np.square(abs_err[normal]))))) if normal.any() else 0.0
    m.small_value_err_ratio = float((abs_err[small] > cfg["small_value_atol"]).mean()) if small.any() else 0.0
    diff = out[finite] - ref[finite]
    m.eb = float(abs(int((diff > 0).sum()) - int((diff < 0).sum())) / n)
    m.cosine = _cosine(ref[finite], out[finite])
    with np.errstate(divide="ignore", invalid="ignore"):
        exp = np.where(abs_ref > 0, np.floor(np.log2(np.where(abs_ref > 0, abs_ref, 1.0))), cfg["min_exponent"])
    exp = np.maximum(exp, cfg["min_exponent"])
    ulp = abs_err * np.exp2(cfg["mantissa_bits"] - exp)
    ulp = ulp[finite]
    if ulp.size:
        m.max_ulp_err = float(ulp.max())
        m.mean_ulp_err = float(ulp.mean())
        m.ulp_err_proportion = float((ulp > cfg["ulp_threshold"]).mean())
    return m


def _cosine(a: np.ndarray, b: np.ndarray) -> Optional[float]:
    """msprobe's cosine: each side scaled by its max |value| first (no overflow); None when
    both are all-zero or there is one element."""
    if a.size < 2:
        return None
    amax, bmax = float(np.abs(a).max()), float(np.abs(b).max())
    if amax == 0 and bmax == 0:
        return None
    if amax == 0 or bmax == 0:
        return 0.0
    a, b = a / amax, b / bmax
    c = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
    return max(-1.0, min(1.0, c))


def api_level(api: str, std: Dict[str, Any]) -> str:
    for level in ("L2", "L1"):
        if api in std["api_levels"].get(level, []):
            return level
    return "L0"


def standard_for(api: str, dtype: str, has_peer: bool, std: Dict[str, Any]) -> str:
    """Which standard grades an output of `api` recorded in `dtype`."""
    if not is_float_dtype(dtype) or dtype_name(dtype) not in std["dtypes"] or api in std["binary_apis"]:
        return BINARY
    return BENCHMARK if has_peer else ULP


@dataclass
class Grade:
    """The verdict on one output, the standard applied and the reasons it is not a pass."""

    status: str
    standard: str
    reasons: List[str] = field(default_factory=list)
    ratios: Dict[str, Optional[float]] = field(default_factory=dict)


def _ratio(target: Optional[float], peer: Optional[float], floor: float) -> Optional[float]:
    """msprobe calc_ratio: |target| / max(|peer|, floor)."""
    if target is None or peer is None:
        return None
    if not (math.isfinite(target) and math.isfinite(peer)):
        return None if target == peer else math.inf
    return abs(target) / max(abs(peer), floor)


def grade(api: str, dtype: str, target: Metrics, peer: Optional[Metrics],
          std: Optional[Dict[str, Any]] = None) -> Grade:
    """Apply the standard that fits `api`/`dtype` (see the module doc)."""
    std = std or load_standards()
    d = dtype_name(dtype)
    standard = standard_for(api, d, peer is not None, std)
    if target.numel == 0:
        return Grade(PASS, standard, ["empty output"])
    if standard == BINARY:
        if target.error_rate == 0:
            return Grade(PASS, standard)
        return Grade(ERROR, standard, [f"{target.error_rate:.3g} of the elements differ from the reference "
                                       f"rounded to {d} (binary standard: all must be equal)"])
    cfg = std["dtypes"][d]
    if target.inf_nan_err_ratio and (peer is None or peer.inf_nan_err_ratio != target.inf_nan_err_ratio):
        return Grade(ERROR, standard, [f"NaN/Inf where the reference has none (or the reverse) at "
                                       f"{target.inf_nan_err_ratio:.3g} of the non-finite positions"])
    if standard == ULP:
        return _grade_ulp(d, target, cfg)
    thresholds = std["benchmark_thresholds"][api_level(api, std)]
    g = Grade(PASS, standard)
    for name, limit in thresholds.items():
        r = _ratio(getattr(target, name), getattr(peer, name), cfg["minimum_err"])
        g.ratios[name] = r
        if r is not None and r > limit:
            g.status = ERROR
            g.reasons.append(f"{name} {getattr(target, name):.4g} is {r:.3g}x the {d} CPU kernel's "
                             f"{getattr(peer, name):.4g} (limit {limit:g}x)")
    eb_cfg = std["error_balance"]
    r = _ratio(target.eb, peer.eb, cfg["minimum_err"])
    g.ratios["eb"] = r
    if r is not None and r > eb_cfg["ratio"] and target.eb > eb_cfg["sigmas"] / math.sqrt(target.numel):
        g.status = ERROR
        g.reasons.append(f"error balance {target.eb:.3g}: the output is biased to one side of the reference "
                         f"({r:.3g}x the {d} CPU kernel's {peer.eb:.3g}, more than {eb_cfg['sigmas']:g}/sqrt(n))")
    return g


def _grade_ulp(d: str, m: Metrics, cfg: Dict[str, Any]) -> Grade:
    prop, limit = m.ulp_err_proportion or 0.0, cfg["ulp_proportion"]
    if "mean_ulp" in cfg and (m.mean_ulp_err or 0.0) < cfg["mean_ulp"]:
        return Grade(PASS, ULP)
    if prop <= limit:
        return Grade(PASS, ULP)
    mean = f" and the mean ULP error {m.mean_ulp_err:.4g} is not below {cfg['mean_ulp']:g}" if "mean_ulp" in cfg else ""
    return Grade(ERROR, ULP, [f"{prop:.3g} of the elements are off by more than {cfg['ulp_threshold']:g} ULP of "
                              f"{d} (limit {limit:g}){mean}; max {m.max_ulp_err:.4g} ULP"])


def compare_values(reference: Any, recorded: Any) -> Tuple[str, str]:
    """A non-tensor output (``.item()``, ``.size()``): equal, floats to 1e-6 relative."""
    if isinstance(reference, float) and isinstance(recorded, (int, float)) and not isinstance(recorded, bool):
        ok = (math.isnan(reference) and math.isnan(recorded)) or math.isclose(reference, recorded, rel_tol=1e-6)
    else:
        ok = reference == recorded
    return (PASS, "") if ok else (ERROR, f"recorded {recorded!r}, reference {reference!r}")
