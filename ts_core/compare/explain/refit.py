"""Refitting an op to recorded values: which activation formula, which normalisation epsilon
and axis, which reduction axis reproduces each side's output from the same input. A cause is
named when golden and target are each reproduced, by different formulas or arguments.
numpy only (erf through math.erf), float64."""
from __future__ import annotations

import math
from itertools import combinations
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .patterns import rel_err

FIT = 2e-4          # relative error under which a formula "reproduces" a float32 value
SAMPLE = 1 << 16    # values a refit reads at most (a grid of ~100 eps x forms stays well under a second)

_erf = np.frompyfunc(math.erf, 1, 1)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


ACTIVATIONS: Dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "GELU (exact, erf)": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64)),
    "GELU (tanh approximation)": _gelu_tanh,
    "GELU (sigmoid approximation, quick_gelu)": lambda x: x * _sigmoid(1.702 * x),
    "SiLU": lambda x: x * _sigmoid(x),
    "hard SiLU (hardswish)": lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "sigmoid": _sigmoid,
    "hard sigmoid": lambda x: np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    "tanh": np.tanh,
    "hard tanh": lambda x: np.clip(x, -1.0, 1.0),
    "ReLU": lambda x: np.maximum(x, 0.0),
    "ReLU6": lambda x: np.clip(x, 0.0, 6.0),
    "leaky ReLU (0.01)": lambda x: np.where(x > 0, x, 0.01 * x),
    "ELU": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
    "softplus": lambda x: np.logaddexp(0.0, x),
    "Mish": lambda x: x * np.tanh(np.logaddexp(0.0, x)),
}


def fit_activation(x: np.ndarray, y: np.ndarray, tol: float = FIT) -> Optional[Tuple[str, float]]:
    """The activation formula that maps `x` to `y` elementwise best, if one reproduces it."""
    if x.shape != y.shape or x.size == 0:
        return None
    x, y = x.reshape(-1)[:SAMPLE], y.reshape(-1)[:SAMPLE]      # elementwise: a sample says as much
    best = None
    for name, f in ACTIVATIONS.items():
        with np.errstate(all="ignore"):
            e = rel_err(np.asarray(f(x), dtype=np.float64), y)
        if best is None or e < best[1]:
            best = (name, e)
    return best if best is not None and best[1] <= tol else None


# ------------------------------------------------------------------------------------ norms
EPS_GRID = tuple(10.0 ** e for e in np.arange(-13.0, 0.01, 0.125))


def _normalise(x: np.ndarray, axes: Tuple[int, ...], rms: bool, eps: float) -> np.ndarray:
    xc = x if rms else x - x.mean(axis=axes, keepdims=True)
    var = (xc * xc).mean(axis=axes, keepdims=True)
    return xc / np.sqrt(var + eps)


def _affine(n: np.ndarray, y: np.ndarray, w: Optional[np.ndarray], b: Optional[np.ndarray], feature: int) -> np.ndarray:
    """n scaled by w and shifted by b along the feature axis; without them, a least-squares
    slope and intercept per feature."""
    shape = [1] * n.ndim
    shape[feature] = n.shape[feature]
    if w is not None and w.size == n.shape[feature]:
        out = n * w.reshape(shape)
        return out + (b.reshape(shape) if b is not None and b.size == n.shape[feature] else 0.0)
    nm = np.moveaxis(n, feature, -1).reshape(-1, n.shape[feature])
    ym = np.moveaxis(y, feature, -1).reshape(-1, n.shape[feature])
    mn, my = nm.mean(0), ym.mean(0)
    var = ((nm - mn) ** 2).sum(0)
    slope = np.where(var > 0, ((nm - mn) * (ym - my)).sum(0) / np.where(var > 0, var, 1.0), 0.0)
    fit = (nm - mn) * slope + my
    return np.moveaxis(fit.reshape(np.moveaxis(y, feature, -1).shape), -1, feature)


def _crop(a: np.ndarray, kind: str) -> np.ndarray:
    """The leading rows of a large tensor (a layer or RMS norm normalises each row on its own;
    a batch norm's statistics need the whole batch: kept whole)."""
    if a.size <= SAMPLE or kind == "batch" or a.ndim < 2:
        return a
    rows = max(1, SAMPLE // int(np.prod(a.shape[1:])))
    return a[:rows]


def norm_forms(x: np.ndarray, kind: str) -> List[Tuple[str, Tuple[int, ...], bool, int]]:
    """Candidate (label, statistic axes, rms, feature axis) of a normalisation op of `kind`
    ("layer", "rms", "batch" or "" for unknown), the recorded form first, then other axes."""
    nd = x.ndim
    last = (nd - 1,)
    batch = tuple(a for a in range(nd) if a != 1) if nd >= 2 else last
    forms: List[Tuple[str, Tuple[int, ...], bool, int]] = []
    if kind in ("layer", ""):
        forms.append(("layer norm over the last axis", last, False, nd - 1))
    if kind in ("rms", ""):
        forms.append(("RMS norm over the last axis", last, True, nd - 1))
    if kind in ("batch", "") and nd >= 2:
        forms.append(("batch norm over every axis but 1", batch, False, 1))
    for a in range(nd - 1):                     # the statistic taken over another axis
        rms = kind == "rms"
        forms.append((f"{'RMS' if rms else 'layer'} norm over axis {a - nd}", (a,), rms, nd - 1))
    return forms


def fit_norm(x: np.ndarray, y: np.ndarray, kind: str, w: Optional[np.ndarray], b: Optional[np.ndarray],
             extra_eps: Sequence[float] = ()) -> Optional[Tuple[str, float, float]]:
    """The normalisation form and epsilon that reproduce `y` from `x` best: (form, eps,
    relative error), or None when none reproduces it."""
    if x.shape != y.shape or x.size < 4:
        return None
    x, y = _crop(x, kind), _crop(y, kind)
    grid = sorted(set(EPS_GRID) | {float(e) for e in extra_eps if isinstance(e, (int, float)) and e > 0})
    best = None
    for label, axes, rms, feature in norm_forms(x, kind):
        for eps in grid:
            with np.errstate(all="ignore"):
                e = rel_err(_affine(_normalise(x, axes, rms, eps), y, w, b, feature), y)
            if best is None or e < best[2] - 1e-12:
                best = (label, eps, e)
    if best is None or best[2] > FIT * 5:
        return None
    return best


def eps_range(x: np.ndarray, y: np.ndarray, form: str, kind: str, w, b, eps: float, tol: float) -> Tuple[float, float]:
    """The epsilons on the grid that reproduce `y` within `tol` in `form` (an eps much smaller
    than the variance cannot be told apart from 0): its smallest and largest."""
    x, y = _crop(x, kind), _crop(y, kind)
    spec = next(f for f in norm_forms(x, kind) if f[0] == form)
    ok = [e for e in EPS_GRID if rel_err(_affine(_normalise(x, spec[1], spec[2], e), y, w, b, spec[3]), y) <= tol]
    return (min(ok), max(ok)) if ok else (eps, eps)


# ------------------------------------------------------------------------------- reductions
_REDUCE: Dict[str, Callable[..., np.ndarray]] = {
    "mean": np.mean, "sum": np.sum, "amax": np.max, "max": np.max, "amin": np.min, "min": np.min,
    "prod": np.prod, "var": np.var, "std": np.std, "nansum": np.nansum, "nanmean": np.nanmean,
}


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


_ALONG: Dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "softmax": _softmax,
    "log_softmax": lambda x, a: np.log(_softmax(x, a)),
    "cumsum": lambda x, a: np.cumsum(x, axis=a),
    "logsumexp": lambda x, a: np.log(np.exp(x - x.max(axis=a, keepdims=True)).sum(axis=a)) + x.max(axis=a),
}


def reduction_kind(op: str) -> Optional[str]:
    """The reduction an op name stands for (``Tensor.mean`` -> mean, ``Functional.softmax`` ->
    softmax, ``Primitive.x.ReduceMean`` -> mean), None for other ops."""
    name = op.rsplit(".", 1)[-1].lower().replace("reduce", "")
    for k in list(_ALONG) + list(_REDUCE):
        if name == k or name == k + "_":
            return k
    return None


def reduction_axes(x: np.ndarray, y: np.ndarray, kind: str) -> List[Tuple[int, ...]]:
    """Every axis (or pair of axes) over which `kind` of `x` reproduces `y`."""
    nd, found = x.ndim, []
    if kind in _ALONG:
        for a in range(nd):
            with np.errstate(all="ignore"):
                r = _ALONG[kind](x, a)
            if r.shape == y.shape and rel_err(r, y) <= FIT:
                found.append((a - nd,))
        return found
    fn = _REDUCE.get(kind)
    if fn is None:
        return found
    for k in (1, 2):
        for axes in combinations(range(nd), k):
            for keep in (True, False):
                r = np.asarray(fn(x, axis=axes, keepdims=keep))
                if r.shape == y.shape and rel_err(r, y) <= FIT:
                    found.append(tuple(a - nd for a in axes))
                    break
    return found
