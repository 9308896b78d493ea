"""Why the first divergence diverged: a ranked list of cause hypotheses, each checked on the
dumped values, with its evidence and a confidence.

Each check looks for one signature of a cause in the values of the first divergent call pair
(and, for a dropped residual, the values recorded just before it):

- inherited / born here: the target's call replayed on golden's inputs (``replaycheck.py``);
- precision: the error is at the ulp of bfloat16/float16 and the float64 replay agrees with golden;
- transposed weight: a differing weight equals golden's transposed / permuted (``patterns.py``);
- constant scale: target = c * golden, c named when it is 1/sqrt(d), d, the batch size ...;
- norm eps, activation approximation, reduction axis: the op refitted to each side's output
  with candidate formulas and arguments (``refit.py``);
- padding / border: only the border of the output differs;
- dropped residual: golden - target equals a value recorded just before;
- parameter / input differs: which one, where, and where it is first consumed;
- nondeterminism: one side differs from its own rerun (``rerun.py``, added by ``api.compare``).

Statistics-only dumps get the checks statistics can support (a constant ratio of Max/Min/Mean/
Norm, a parameter's statistics, dtypes, recorded arguments); the others are listed with
``needs_tensors``. Confidence: >= 0.8 only when the values themselves show the signature.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...dumpfmt import is_tensor_summary, parse_key
from ...dumpfmt.dtypes import MANTISSA_BITS, dtype_name
from ..judge.verdict import differs
from ..load.loader import INPUT, OUTPUT, PARAMETER
from ..ops import (ACTIVATION_WORDS, ADD_OPS, CAST_OPS, CLAMP_OPS, DIV_OPS, MUL_OPS, NORM_WORDS, SUB_OPS,
                   is_random)
from .argnames import arg_label, op_short
from .patterns import (border_only, constant_ratio, difference_is, element_changes, permutation, rel_err,
                       stats_ratio)
from .refit import FIT, eps_range, fit_activation, fit_norm, reduction_axes, reduction_kind
from .values import Values

HIGH = 0.8              # "asserted": the values show the signature
LITERAL = 0.9           # a recorded argument of the call differs (eps, approximate, dim): the dump shows it
ARGUMENT = 0.85         # recorded arguments differ and no check names what they are: the dump shows them
COUNTED = 0.5           # the most a cause gets that rests on counting calls (not on values)
WINDOW = 40             # calls before the first divergence searched for a dropped residual


@dataclass
class Hypothesis:
    """One candidate cause (the dict form is the interface with the report, see COMMON.md)."""

    cause: str
    title: str
    confidence: float
    evidence: str
    needs_tensors: bool = False

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["confidence"] = round(float(self.confidence), 3)
        return d


# ------------------------------------------------------------------------------ helpers
_LOW = {name: bits for name, bits in MANTISSA_BITS.items() if bits < MANTISSA_BITS["float32"]}
_dtype = dtype_name


def _ulps(g: np.ndarray, t: np.ndarray, bits: int) -> float:
    """The largest |t - g| in units of the last place of a `bits`-mantissa float at |g|."""
    mag = np.maximum(np.abs(g), np.finfo(np.float32).tiny)
    ulp = np.exp2(np.floor(np.log2(mag)) - bits)
    return float(np.max(np.abs(t - g) / ulp)) if g.size else 0.0


def _ulps_of_scale(g: np.ndarray, t: np.ndarray, bits: int) -> float:
    """max |t - g| in units of the last place at the largest |g| (rounding of the inputs of a
    product or a sum scales with the operands, not with each small result)."""
    top = float(np.abs(g).max(initial=0))
    if top == 0:
        return 0.0
    return float(np.abs(t - g).max()) / 2.0 ** (math.floor(math.log2(top)) - bits)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else repr(v)


def describe_constant(c: float, dims: Sequence[int] = ()) -> str:
    """A ratio in words, named when it is a usual missing factor: n, 1/n, sqrt(n), 1/sqrt(n)
    for a whole n (a head size, a batch or element count), marked when n is a recorded size."""
    sizes = {int(x) for x in dims if isinstance(x, int) and x > 1}
    names = []
    if c != 0 and math.isfinite(c):
        m = abs(c)
        for label, v in (("{n}", m), ("1/{n}", 1 / m), ("sqrt({n})", m * m), ("1/sqrt({n})", 1 / (m * m))):
            n = round(v)
            if 2 <= n <= 1 << 20 and abs(v - n) <= 1e-3 * n:
                names.append(("-" if c < 0 else "") + label.format(n=n) + (" (a recorded size)" if n in sizes else ""))
                break
    return f"{c:.6g}" + (f" = {names[0]}" if names else "")


class _Ctx:
    """What the checks share: the pair's values, its rows, the op and the recorded arguments."""

    def __init__(self, fd: Any, cp: Any, values: Values, before: List[Any]):
        self.fd, self.cp, self.values, self.before = fd, cp, values, before
        call = cp.golden or cp.target
        self.op = parse_key(call.members[0].key if call.members else call.key).name
        self.short = op_short(self.op).lower()
        self.tensors = values.has_tensors()
        self.failing = [r for r in cp.rows if r.failed]
        self.out_fail = [r for r in self.failing if r.role == OUTPUT and r.mode != "value"] or \
            [r for r in cp.rows if r.role == OUTPUT and r.mode in ("tensor", "statistics") and differs(r)]
        self.in_fail = [r for r in self.failing if r.role != OUTPUT and r.mode != "value"]
        self.args = [(arg_label(self.op, r.arg), r.golden_value, r.target_value)
                     for r in cp.rows if r.mode == "value"]
        self.quoted: set = set()

    def quote(self, *names: str, mark: bool = True) -> str:
        """The recorded argument differences among `names` (all when none given), in words;
        `mark`: the caller explains them (the catch-all argument check leaves them out)."""
        hits = [(n, g, t) for n, g, t in self.args
                if not names or n.split("[")[0] in names or n.split(".")[-1] in names]
        if mark:
            self.quoted.update(n for n, _, _ in hits)
        return "; ".join(f"recorded {n}: golden {_fmt(g)}, target {_fmt(t)}" for n, g, t in hits)

    def arrays(self, r) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        return self.values.array("golden", r.role, r.arg), self.values.array("target", r.role, r.arg)

    def main_input(self) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        return self.values.array("golden", INPUT, "input.0"), self.values.array("target", INPUT, "input.0")

    def main_output(self) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        r = next((x for x in self.out_fail), None)
        arg = r.arg if r is not None else "output.0"
        return self.values.array("golden", OUTPUT, arg), self.values.array("target", OUTPUT, arg)

    def dims(self) -> List[int]:
        """Sizes a missing factor is usually made of: every axis length and element count."""
        out = []
        for r in self.cp.rows:
            for s in (r.golden_shape, r.target_shape):
                ints = [d for d in (s or []) if isinstance(d, int)]
                out += ints + ([int(np.prod(ints))] if ints else [])
        return out


def _origins(fd: Any) -> Dict[str, str]:
    """The inputs the first divergence's cause says come from no earlier call: arg -> what."""
    text = str(getattr(fd, "cause", "") or "")
    if "come from no earlier call" not in text:
        return {}
    part = text.split("come from no earlier call:", 1)[1]
    out = {}
    for m in re.finditer(r"(\S+) \((the parameter \S+ of \S+|a parameter|not produced by any earlier recorded call)",
                         part):
        out[m.group(1)] = m.group(2)
    return out


# ------------------------------------------------------------------------------- checks
def _check_inputs(ctx: _Ctx) -> List[Hypothesis]:
    """A differing parameter or input: permuted, scaled, one element, shifted residual..."""
    out: List[Hypothesis] = []
    origins = _origins(ctx.fd)
    for r in ctx.in_fail:
        g, t = ctx.arrays(r)
        leaf = ctx.values.leaf("golden", r.role, r.arg) or ctx.values.leaf("target", r.role, r.arg)
        rooted = r.arg in origins or r.role == PARAMETER
        is_param = r.role == PARAMETER or "parameter" in origins.get(r.arg, "") or \
            (rooted and is_tensor_summary(leaf) and bool(leaf.get("requires_grad")))
        what = f"{r.arg} of {ctx.fd.key}" + (f" ({origins[r.arg]})" if "parameter " in origins.get(r.arg, "") else "")
        if g is not None and t is not None:
            perm = permutation(g, t)
            if perm is not None:
                cause = "transposed_weight" if is_param or r.arg != "input.0" else "input_differs"
                out.append(Hypothesis(cause, f"{'weight' if cause == 'transposed_weight' else 'value'} {r.arg} is "
                                      f"transposed or permuted", 0.95,
                                      f"target's {what} is {perm} (shape {list(g.shape)}); its elements are the "
                                      f"same numbers"))
                continue
            res = difference_is(g, t, _residual_candidates(ctx, g.shape)) if not is_param else None
            if res is not None:
                out.append(_residual(res, f"{r.arg} of {ctx.fd.key}"))
                continue
            ratio = constant_ratio(g, t)
            if ratio is not None and not rooted:
                c, share, n = ratio
                out.append(Hypothesis("constant_scale", f"{r.arg} arrives scaled by a constant",
                                      0.9, f"target's {r.arg} = {describe_constant(c, ctx.dims())} x golden's on "
                                      f"{share:.0%} of the {n} elements that differ: a scale factor dropped or "
                                      f"changed before {ctx.fd.key}"))
                continue
            if rooted:
                shift = _constant_offset(g, t)
                change = (f"every element is shifted by a constant {shift:+.6g}" if shift is not None
                          else element_changes(g, t) or "values differ")
                cause = "parameter_differs" if is_param else "input_differs"
                title = f"{'parameter' if is_param else 'input'} {r.arg} " + \
                    (f"shifted by a constant {shift:+.4g}" if shift is not None else "differs")
                out.append(Hypothesis(cause, title, 0.85,
                                      f"{what} differs and no earlier call made it: {change}; first consumed by "
                                      f"{ctx.fd.key}" + (f" at {ctx.fd.source}" if ctx.fd.source else "")))
        elif rooted:                 # statistics: which one differs is known, how is not
            cause = "parameter_differs" if is_param else "input_differs"
            gs, ts = ctx.values.stats("golden", r.role, r.arg), ctx.values.stats("target", r.role, r.arg)
            c = stats_ratio(gs, ts) if gs and ts else None
            stats = "; ".join(f"{k} {gs.get(k):.6g} vs {ts.get(k):.6g}" for k in ("Max", "Min", "Mean", "Norm")
                              if gs and ts and isinstance(gs.get(k), (int, float)) and isinstance(ts.get(k), (int, float))
                              and gs.get(k) != ts.get(k))
            shift = _stats_shift(gs, ts) if gs and ts and c is None else None
            out.append(Hypothesis(cause, f"{'parameter' if is_param else 'input'} {r.arg} "
                                  + (f"shifted by a constant {shift:+.4g}" if shift is not None else "differs"), 0.8,
                                  f"{what}: statistics differ ({stats or r.reason})"
                                  + (f", all by the factor {describe_constant(c)}" if c else "")
                                  + (f"; Max, Min and Mean all moved by {shift:+.6g}: shifted by a constant"
                                     if shift is not None else "")
                                  + f"; no earlier call made it; first consumed by {ctx.fd.key}"))
            out.append(Hypothesis("transposed_weight" if is_param else "input_differs", "which elements differ "
                                  "(one element, a row, a permutation)", 0.1,
                                  "needs the tensor files (task: tensor)", needs_tensors=True))
        else:
            gs, ts = ctx.values.stats("golden", r.role, r.arg), ctx.values.stats("target", r.role, r.arg)
            c = stats_ratio(gs, ts) if gs and ts else None
            if c is not None:
                out.append(Hypothesis("constant_scale", f"{r.arg} arrives scaled by a constant", 0.7,
                                      f"Max/Min/Mean/Norm of target's {r.arg} are golden's x "
                                      f"{describe_constant(c, ctx.dims())} (statistics; tensors would confirm it "
                                      f"element by element)"))
    return out


def _residual_candidates(ctx: _Ctx, shape) -> List[Tuple[str, np.ndarray]]:
    """Golden's tensors recorded by the call itself and the calls just before it, of `shape`."""
    out: List[Tuple[str, np.ndarray]] = []
    seen = set()
    for cp in [ctx.cp] + list(reversed(ctx.before[-WINDOW:])):
        call = cp.golden
        if call is None:
            continue
        for m in (call.members or [call]):
            for e in m.entries:
                leaf = e.leaf
                if not is_tensor_summary(leaf) or list(leaf.get("shape") or []) != list(shape) or \
                        not leaf.get("data_name") or leaf["data_name"] in seen:
                    continue
                seen.add(leaf["data_name"])
                from .values import load_leaf
                a = load_leaf(ctx.values.dumps["golden"], leaf)
                if a is not None:
                    out.append((f"{m.key}.{e.arg}", a))
    return out


def _residual(res: Tuple[str, str], where: str) -> Hypothesis:
    name, sign = res
    if sign == "golden - target":
        return Hypothesis("dropped_residual", "a residual (skip) connection is missing in target", 0.9,
                          f"golden - target of {where} equals {name}: target leaves out adding it")
    return Hypothesis("dropped_residual", "target adds a value golden does not (an extra residual)", 0.8,
                      f"target - golden of {where} equals {name}: target adds it once more")


def _check_outputs(ctx: _Ctx) -> List[Hypothesis]:
    """Relations of the failing outputs alone: a constant ratio, border-only, a dropped residual."""
    out: List[Hypothesis] = []
    for r in ctx.out_fail[:2]:
        g, t = ctx.arrays(r)
        if g is None or t is None:
            gs, ts = ctx.values.stats("golden", r.role, r.arg), ctx.values.stats("target", r.role, r.arg)
            c = stats_ratio(gs, ts) if gs and ts else None
            if c is not None:
                why = _scale_argument(ctx, c)
                out.append(Hypothesis("constant_scale", "the output is scaled by a constant", LITERAL if why else 0.7,
                                      f"Max/Min/Mean/Norm of target's {r.arg} are golden's x "
                                      f"{describe_constant(c, ctx.dims())} (statistics)" + _sep(why)))
            continue
        if g.size == 1 and float(g.reshape(-1)[0]) != 0:
            c = float(t.reshape(-1)[0]) / float(g.reshape(-1)[0])
            quoted = ctx.quote("reduction", "size_average", "reduce")
            out.append(Hypothesis("constant_scale", "the result is scaled by a constant (a reduction: sum vs mean)",
                                  0.9 if quoted else 0.55,
                                  f"target's {r.arg} = {describe_constant(c, ctx.dims())} x golden's (one number: a "
                                  f"ratio alone does not prove a constant factor)" + _sep(quoted)))
            continue
        ratio = constant_ratio(g, t)
        if ratio is not None:
            c, share, n = ratio
            out.append(Hypothesis("constant_scale", "the output is scaled by a constant", 0.9,
                                  f"target's {r.arg} = {describe_constant(c, ctx.dims())} x golden's on {share:.0%} "
                                  f"of the {n} elements that differ (a missing or wrong scale factor, a loss "
                                  f"reduction sum vs mean)"))
            continue
        offset = _constant_offset(g, t) if not ctx.in_fail else None
        if offset is not None:
            if ctx.short in ADD_OPS | SUB_OPS and 0 < abs(offset) < 0.1:
                out.append(Hypothesis("norm_eps", "a small added constant differs (a normalisation epsilon?)", 0.8,
                                      f"target's {r.arg} = golden's {offset:+.6g} on every element, from the same "
                                      f"inputs: {ctx.op} adds another constant (an epsilon added to a variance before "
                                      f"its square root)" + _sep(ctx.quote(mark=False))))
            else:
                out.append(Hypothesis("constant_offset", "the output is shifted by a constant", 0.7,
                                      f"target's {r.arg} = golden's {offset:+.6g} on every element"))
            continue
        tol = (r.atol or 1e-5) + (r.rtol or 1e-4) * float(np.abs(g).max(initial=0))
        border = border_only(g, t, tol) if not ctx.in_fail else None
        if border is not None:
            k, n, size = border
            out.append(Hypothesis("padding_border", "only the border differs: padding mode or border handling",
                                  0.9, f"all {n} differing elements of {r.arg} lie within {k} of the border of "
                                  f"the last two axes {list(g.shape[-2:])}; the interior agrees"
                                  + _sep(ctx.quote("padding_mode", "mode", "padding"))))
            continue
        if not ctx.in_fail:
            res = difference_is(g, t, _residual_candidates(ctx, g.shape))
            if res is not None:
                out.append(_residual(res, f"{r.arg} of {ctx.fd.key}"))
    return out


def _scale_argument(ctx: _Ctx, c: float) -> str:
    """The call's own recorded argument that explains an output scaled by `c` (statistics): a
    loss reduction changed (sum against mean), or a scalar factor whose ratio is `c` (a divisor's
    inverse). Quoted (and so not repeated as a bare argument difference), else ""."""
    quoted = ctx.quote("reduction", "size_average", "reduce", mark=False)
    if quoted:
        return ctx.quote("reduction", "size_average", "reduce") + ": the recorded reduction explains the factor"
    for n, g, t in ctx.args:
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and v for v in (g, t)):
            ratio = g / t if ctx.short in DIV_OPS else t / g
            if math.isclose(ratio, c, rel_tol=1e-3):
                return ctx.quote(n.split("[")[0]) + f": target's factor / golden's = {ratio:.6g}, the ratio of the outputs"
    return ""


def _stats_shift(gs: dict, ts: dict, rtol: float = 1e-3) -> Optional[float]:
    """target = golden + d for one constant d, read from statistics: Max, Min and Mean all
    move by d (a ratio would scale them instead)."""
    try:
        d = [float(ts[k]) - float(gs[k]) for k in ("Max", "Min", "Mean")]
        scale = max(abs(float(gs[k])) for k in ("Max", "Min"))
    except (KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(x) for x in d) or d[2] == 0 or abs(d[2]) < 1e-6 * scale:
        return None
    return d[2] if all(abs(x - d[2]) <= rtol * abs(d[2]) + 1e-7 * scale for x in d) else None


def _constant_offset(g: np.ndarray, t: np.ndarray) -> Optional[float]:
    """target - golden, when it is one nonzero constant over every element (of at least two)."""
    if g.shape != t.shape or g.size < 2:
        return None
    d = (t - g).reshape(-1)
    d0 = float(np.median(d))
    scale = max(float(np.abs(g).max()), float(np.abs(t).max()), 1e-30)
    if d0 == 0 or abs(d0) < 1e-6 * scale:
        return None
    return d0 if np.allclose(d, d0, rtol=1e-3, atol=1e-7 * scale) else None


def _sep(s: str) -> str:
    return f"; {s}" if s else ""


def _awaiting_tensors(cause: str, title: str, quoted: str, check: str) -> Hypothesis:
    """A cause the values could confirm but were not saved. A recorded argument that differs
    (``quoted``: eps 1e-05 against 0.01) is evidence in itself, recorded by the call; without
    one the cause is only possible."""
    if quoted:
        return Hypothesis(cause, title, LITERAL, f"{quoted}: the call's own recorded argument differs, and its "
                          f"output differs with it")
    return Hypothesis(cause, title, 0.3, f"{check} needs the tensor files (task: tensor)", needs_tensors=True)


_CASTS = (CAST_OPS - {"cpu", "cuda", "npu"}) | {"float16"}      # casts that change a precision


def _is_norm(ctx: _Ctx) -> Optional[str]:
    low = ctx.op.lower()
    if "linalg" in low or low.endswith((".norm", ".norm_")) or "normal" in low or "clip_grad" in low:
        return None
    return next((kind for word, kind in NORM_WORDS if word in low), None)


def _norm_params(ctx: _Ctx, n_features: int) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """Golden's weight and bias of a norm: a module's parameters, or the 1-D tensor arguments
    of the normalised size (the last two of them for batch_norm: running stats come first)."""
    v = ctx.values
    w = v.array("golden", PARAMETER, "parameters.weight")
    b = v.array("golden", PARAMETER, "parameters.bias")
    if w is not None:
        return w.reshape(-1), (b.reshape(-1) if b is not None else None)
    vecs = [e for e in v.entries("golden", INPUT) if e.arg != "input.0" and is_tensor_summary(e.leaf)
            and list(e.leaf.get("shape") or []) == [n_features]]
    if "batch" in ctx.short:
        vecs = vecs[2:]
    arrays = [v.array("golden", INPUT, e.arg) for e in vecs[:2]]
    return (arrays[0] if arrays else None), (arrays[1] if len(arrays) > 1 else None)


def _check_norm(ctx: _Ctx) -> List[Hypothesis]:
    kind = _is_norm(ctx)
    if kind is None:
        return []
    quoted = ctx.quote("eps", "epsilon", "variance_epsilon")
    xg, xt = ctx.main_input()
    yg, yt = ctx.main_output()
    if xg is None or yg is None or yt is None:
        return [_awaiting_tensors("norm_eps", "the normalisation epsilon differs", quoted,
                                  "refitting the norm to each side's output")]
    feature = 1 if kind == "batch" and xg.ndim >= 2 else xg.ndim - 1
    w, b = _norm_params(ctx, xg.shape[feature])
    recorded = [v for n, gv, tv in ctx.args if n in ("eps", "epsilon") for v in (gv, tv)]
    fg = fit_norm(xg, yg, kind, w, b, recorded)
    ft = fit_norm(xt if xt is not None else xg, yt, kind, w, b, recorded)
    if fg is None or ft is None:
        return []
    if fg[0] != ft[0]:
        return [Hypothesis("reduction_axis", "the normalisation statistic is taken over another axis", 0.9,
                           f"refitting the norm: golden's output is a {fg[0]} (rel err {fg[2]:.1e}), target's a "
                           f"{ft[0]} (rel err {ft[2]:.1e})" + _sep(ctx.quote("dim", "normalized_shape")))]
    xs = xt if xt is not None else xg
    # an eps "fits" within a few times the best fit's error (float32 rounding): a tight range
    lo_g, hi_g = eps_range(xg, yg, fg[0], kind, w, b, fg[1], max(fg[2] * 4, 1e-6))
    lo_t, hi_t = eps_range(xs, yt, ft[0], kind, w, b, ft[1], max(ft[2] * 4, 1e-6))
    if hi_g < lo_t / 1.5 or hi_t < lo_g / 1.5:
        return [Hypothesis("norm_eps", "the normalisation epsilon differs", 0.95 if quoted else 0.9,
                           f"refitting the {fg[0]}: golden's output is reproduced with eps in [{lo_g:.1e}, "
                           f"{hi_g:.1e}] (rel err {fg[2]:.1e}), target's with eps in [{lo_t:.1e}, {hi_t:.1e}] "
                           f"(rel err {ft[2]:.1e}); no one eps fits both" + _sep(quoted))]
    return []


def _check_activation(ctx: _Ctx) -> List[Hypothesis]:
    """Fit activation formulas to each side's output. Also a group of calls against one call
    (GPT-2's gelu_new written out against nn.GELU): either side naming an activation is enough."""
    names = [parse_key(m.key).name.lower() for c in (ctx.cp.golden, ctx.cp.target) if c is not None
             for m in (c.members or [c])]
    if not any(w in n for n in names for w in ACTIVATION_WORDS) or _is_norm(ctx):
        return []
    quoted = ctx.quote("approximate")
    xg, xt = ctx.main_input()
    yg, yt = ctx.main_output()
    if xg is None or yg is None or yt is None:
        return [_awaiting_tensors("activation_approx", "a different activation formula (approximation)", quoted,
                                  "fitting the formulas to each side's output")]
    fg = fit_activation(xg, yg)
    ft = fit_activation(xt if xt is not None else xg, yt)
    if fg is None or ft is None or fg[0] == ft[0]:
        return []
    gap = float(np.abs(yt - yg).max())
    return [Hypothesis("activation_approx", f"target computes {ft[0]} where golden computes {fg[0]}", 0.95,
                       f"from the same input, golden's output is {fg[0]} (rel err {fg[1]:.1e}), target's {ft[0]} "
                       f"(rel err {ft[1]:.1e}); the two formulas differ by up to {gap:.3g} here" + _sep(quoted))]


def _check_reduction(ctx: _Ctx) -> List[Hypothesis]:
    kind = reduction_kind(ctx.op)
    if kind is None:
        return []
    quoted = ctx.quote("dim", "axis", "keepdim")
    xg, xt = ctx.main_input()
    yg, yt = ctx.main_output()
    if xg is None or yg is None or yt is None:
        r = ctx.out_fail[0] if ctx.out_fail else None
        gs = ctx.values.stats("golden", OUTPUT, r.arg) if r else None
        ts = ctx.values.stats("target", OUTPUT, r.arg) if r else None
        mean_kept = kind not in ("softmax", "log_softmax") and bool(gs and ts and isinstance(gs.get("Mean"), (int, float)) and isinstance(ts.get("Mean"), (int, float))
                         and abs(gs["Mean"] - ts["Mean"]) <= 1e-5 * max(abs(gs["Mean"]), 1e-12))
        if not (quoted or mean_kept):
            return []
        ev = "; ".join(x for x in (quoted, "the outputs' Mean agrees while Max/Min/Norm differ (the same values "
                                           "summed along another axis keep their mean)" if mean_kept else "") if x)
        if quoted:
            return [Hypothesis("reduction_axis", f"{kind} over another axis", LITERAL,
                               ev + ": the call's own recorded argument differs")]
        return [Hypothesis("reduction_axis", f"{kind} over another axis", 0.5,
                           ev + "; refitting the axis needs the tensor files", needs_tensors=True)]
    ag = reduction_axes(xg, yg, kind)
    at = reduction_axes(xt if xt is not None else xg, yt, kind)
    if not ag or not at or set(ag) & set(at):
        return []
    return [Hypothesis("reduction_axis", f"{kind} over another axis", 0.95,
                       f"from the same input, golden's output is the {kind} over axis {ag[0]}, target's over axis "
                       f"{at[0]}" + _sep(quoted))]


def _check_replay(ctx: _Ctx) -> List[Hypothesis]:
    """Inherited vs born here, and precision, by replaying the target's call."""
    if not ctx.tensors:
        return []           # nothing to replay on: a statistics dump says nothing either way
    from .replaycheck import replay_on_golden

    yg, yt = ctx.main_output()
    if yg is None or yt is None:
        return []           # nothing to hold the replay against (too large, unreadable): do not replay
    rp = replay_on_golden(ctx.values)
    if rp is None:
        return []
    idx = next((i for i, (a, _) in enumerate(_outputs(ctx)) if ctx.out_fail and a == ctx.out_fail[0].arg), 0)

    def pick(vals):
        try:
            v = np.asarray(vals[idx], dtype=np.float64)
            return v if v.shape == yg.shape else None
        except Exception:
            return None

    ref_g, ref_t = pick(rp.on_golden.reference), pick(rp.on_target.reference)
    peer_g = pick(rp.on_golden.peer) if rp.on_golden.peer is not None else None
    tol = max(FIT, 4 * (ctx.out_fail[0].rtol or 1e-4)) if ctx.out_fail else FIT
    origins = _origins(ctx.fd)
    inputs_differ = any(r.role != OUTPUT and r.mode in ("tensor",) and (r.max_abs_err or 0) > 0 for r in ctx.cp.rows)
    rooted = any(r.arg in origins or r.role == PARAMETER for r in ctx.in_fail)
    out: List[Hypothesis] = []
    e_gg = rel_err(ref_g, yg) if ref_g is not None else float("inf")
    e_tt = rel_err(ref_t, yt) if ref_t is not None else float("inf")
    e_gt = rel_err(ref_g, yt) if ref_g is not None else float("inf")
    e_peer = rel_err(peer_g, yt) if peer_g is not None else float("inf")
    within = inputs_differ and not any(r.failed for r in ctx.cp.rows if r.role != OUTPUT and r.mode == "tensor")
    if within and e_gg <= tol and e_tt <= tol:
        # not "inherited": the walk named this call because its inputs agree within tolerance
        out.append(Hypothesis("amplified", "amplified here: its inputs differ only within tolerance", 0.6,
                              f"replaying target's {ctx.cp.target.key} on golden's inputs ({', '.join(rp.swapped)}) "
                              f"gives golden's output (rel err {e_gg:.1e}): the call is right, and it magnifies a "
                              f"difference of its inputs that is within tolerance (look upstream for where that "
                              f"difference starts: a changed constant, a lower precision)"))
    elif inputs_differ and e_gg <= tol and e_tt <= tol:
        out.append(Hypothesis("inherited", "inherited: the error arrives with the inputs", 0.4 if rooted else 0.9,
                              f"replaying target's {ctx.cp.target.key} on golden's inputs ({', '.join(rp.swapped)}) "
                              f"gives golden's output (rel err {e_gg:.1e}); on its own inputs, target's "
                              f"(rel err {e_tt:.1e}): the call is right, its inputs differ (look upstream)"))
    elif e_gt <= tol or e_peer <= tol:
        out.append(Hypothesis("born_here", "born here: the call computes the difference from golden's inputs", 0.5,
                              f"replaying target's {ctx.cp.target.key} with its recorded arguments on golden's inputs "
                              f"reproduces target's output (rel err {min(e_gt, e_peer):.1e})"
                              + _sep(ctx.quote(mark=False))))
    elif not inputs_differ and e_gg <= tol and e_tt > tol:
        out.append(Hypothesis("implementation_differs", "the target's implementation of the call computes another "
                              "result from the same inputs", 0.7,
                              f"both sides recorded the same inputs; replayed here, {ctx.cp.target.key} gives "
                              f"golden's output (rel err {e_gg:.1e}) and not target's (rel err {e_tt:.1e}"
                              + (f"; in the recorded dtypes {e_peer:.1e}" if peer_g is not None else "")
                              + "): target's kernel differs (its device, library version, or a patched or "
                                "overridden op)" + _sep(ctx.quote(mark=False))))
    low = [_dtype(r.target_dtype) for r in ctx.out_fail if _dtype(r.target_dtype) in _LOW] + \
        [_dtype(r.golden_dtype) for r in ctx.out_fail if _dtype(r.golden_dtype) in _LOW]
    if low and e_gg <= tol:
        bits = _LOW[low[0]]
        ulps = _ulps_of_scale(yg, yt, bits)
        conf = 0.92 if ulps <= 8 or e_peer <= tol else 0.7
        out.append(Hypothesis("precision", f"precision: the call runs in {low[0]} in one side", conf,
                              f"the float64 replay on golden's inputs agrees with golden (rel err {e_gg:.1e}); the "
                              f"outputs differ by at most {ulps:.1f} {low[0]} ulp of their largest magnitude"
                              + (f"; the {low[0]} replay reproduces target (rel err {e_peer:.1e})"
                                 if e_peer <= tol else "")))
    return out


def _outputs(ctx: _Ctx) -> List[Tuple[str, Any]]:
    call = ctx.cp.target
    return [(e.arg, e.leaf) for e in (call.entries if call else []) if e.role == OUTPUT]


def _check_precision(ctx: _Ctx) -> List[Hypothesis]:
    """The two sides hold the differing output in different float precisions and differ by a
    few ulps of the lower one (no replay needed; statistics suffice for a rough check)."""
    out: List[Hypothesis] = []
    for r in ctx.out_fail[:1]:
        gdt, tdt = _dtype(r.golden_dtype), _dtype(r.target_dtype)
        low = tdt if tdt in _LOW else gdt if gdt in _LOW else None
        g, t = ctx.arrays(r)
        if g is not None and t is not None:
            if low is None and t.size and not np.array_equal(t, g) and \
                    not (t.astype(np.float32).view(np.uint32) & 0xFFFF).any():
                low = "bfloat16"        # float32 values that bfloat16 holds exactly: a bf16 result up-cast
            if low is None:
                continue
            ulps = _ulps_of_scale(g, t, _LOW[low])
            if ulps <= 8:
                out.append(Hypothesis("precision", f"precision: the values are {low} in one side", 0.85,
                                      f"{r.arg} is {tdt} in target and {gdt} in golden; they differ by at most "
                                      f"{ulps:.1f} {low} ulp (rounding, not a wrong formula)"))
        elif low is not None:
            rel = r.error_measure
            if rel is not None and rel <= 4 * 2.0 ** -_LOW[low]:
                out.append(Hypothesis("precision", f"precision: the values are {low} in one side", 0.7,
                                      f"{r.arg} is {tdt} in target and {gdt} in golden; the statistics differ by "
                                      f"{rel:.2g} relative, within a few {low} ulp (statistics; a float64 replay "
                                      f"needs tensors)", needs_tensors=False))
    return out


def _check_noise(ctx: _Ctx) -> List[Hypothesis]:
    """float32 on both sides and the difference at its rounding level: likely no bug at all."""
    for r in ctx.out_fail[:1]:
        g, t = ctx.arrays(r)
        if g is None or t is None or g.shape != t.shape or ctx.in_fail or _dtype(r.target_dtype) in _LOW \
                or _dtype(r.golden_dtype) in _LOW:
            continue
        ulps = _ulps(g, t, 23)
        if ulps <= 64:
            return [Hypothesis("precision", "float rounding: another order of operations", 0.5,
                               f"{r.arg} differs by at most {ulps:.0f} float32 ulp: the same math computed in "
                               f"another order (a fused kernel, another reduction order) gives this; not a "
                               f"wrong formula")]
    return []


def _check_module_code(ctx: _Ctx) -> List[Hypothesis]:
    """The first divergence is a module whose own code (between its recorded submodules)
    made a differing value: read that value where it was received (``fd.tensor``) and look
    for a scale, a dropped residual or a reduction over another axis among the values recorded
    before it."""
    if any(r.name == ctx.fd.tensor for r in ctx.cp.rows):
        return []
    hit = next(((cp, r) for cp in reversed(ctx.before + [ctx.cp]) for r in cp.rows if r.name == ctx.fd.tensor), None)
    if hit is None:
        return []
    cp, r = hit
    vals = Values(cp, ctx.values.dumps["golden"], ctx.values.dumps["target"])
    g, t = vals.array("golden", r.role, r.arg), vals.array("target", r.role, r.arg)
    where = f"{r.arg} of {cp.key} (made by the code of {ctx.fd.key})"
    if g is None or t is None:
        gs, ts = vals.stats("golden", r.role, r.arg), vals.stats("target", r.role, r.arg)
        c = stats_ratio(gs, ts) if gs and ts else None
        if c is not None:
            return [Hypothesis("constant_scale", "a value scaled by a constant in the module's code", 0.7,
                               f"Max/Min/Mean/Norm of target's {where} are golden's x {describe_constant(c, ctx.dims())} "
                               f"(statistics)")]
        return [Hypothesis("module_code", "a scale, residual or reduction in the module's own code", 0.1,
                           f"{where} differs; telling which needs the tensor files", needs_tensors=True)]
    ratio = constant_ratio(g, t)
    if ratio is not None:
        c, share, n = ratio
        return [Hypothesis("constant_scale", "a value scaled by a constant in the module's code", 0.9,
                           f"target's {where} = {describe_constant(c, ctx.dims())} x golden's on {share:.0%} of the "
                           f"{n} elements that differ")]
    cands = _residual_candidates(ctx, g.shape)
    res = difference_is(g, t, cands)
    if res is not None:
        return [_residual(res, where)]
    for name, x in _wider_candidates(ctx, g):
        for kind in ("mean", "sum", "amax"):
            ag, at = reduction_axes(x, g, kind), reduction_axes(x, t, kind)
            if ag and at and not set(ag) & set(at):
                return [Hypothesis("reduction_axis", f"{kind} over another axis in the module's code", 0.85,
                                   f"{where} is the {kind} of {name} over axis {ag[0]} in golden, over axis {at[0]} "
                                   f"in target")]
    return [Hypothesis("module_code", "computed by ops the dump does not record at this level", 0.3,
                       f"{where} differs and no recorded call made it; dump at level mix to see the ops of "
                       f"{ctx.fd.key} and diagnose them")]


def _wider_candidates(ctx: _Ctx, g: np.ndarray) -> List[Tuple[str, np.ndarray]]:
    """Golden outputs recorded just before, with more dimensions than `g` (what it may reduce)."""
    from .values import load_leaf
    out = []
    for cp in list(reversed(ctx.before))[:8]:
        if cp.golden is None:
            continue
        for e in cp.golden.entries:
            leaf = e.leaf
            if e.role == OUTPUT and is_tensor_summary(leaf) and len(leaf.get("shape") or []) > g.ndim:
                a = load_leaf(ctx.values.dumps["golden"], leaf)
                if a is not None:
                    out.append((f"{cp.golden.key}.{e.arg}", a))
    return out


def _residual_adds(call: Any) -> int:
    """Adds of two tensors of one shape among a (merged) call's members: a residual's signature
    (a bias add has a 1-D operand)."""
    n = 0
    for m in ((call.members or [call]) if call is not None else []):
        if op_short(parse_key(m.key).name).lower() not in ADD_OPS:
            continue
        shapes = [tuple(e.leaf.get("shape") or ()) for e in m.entries if e.role == INPUT and is_tensor_summary(e.leaf)]
        n += len(shapes) >= 2 and shapes[0] == shapes[1]
    return n


def _check_group(ctx: _Ctx) -> List[Hypothesis]:
    """Two different groups of calls paired as one (across frameworks, or a decomposition):
    a residual add that one side's group holds and the other's does not."""
    cp = ctx.cp
    if cp.golden is None or cp.target is None or not (cp.golden.members or cp.target.members):
        return []
    ng, nt = _residual_adds(cp.golden), _residual_adds(cp.target)
    if ng > nt:
        return [Hypothesis("dropped_residual", "a residual (skip) addition is missing in target?", COUNTED,
                           f"golden's calls {cp.golden.key} add two tensors of one shape {ng} time(s), target's "
                           f"{cp.target.key} {nt} (a count of calls: a formula written out adds too)")]
    if nt > ng:
        return [Hypothesis("dropped_residual", "target adds a value golden does not (an extra residual)?", COUNTED,
                           f"target's calls {cp.target.key} add two tensors of one shape {nt} time(s), golden's {ng}")]
    return []


def _check_random(ctx: _Ctx) -> List[Hypothesis]:
    """A random op (dropout, bernoulli, rand*, normal_ ...) whose inputs and arguments agree and
    whose output differs: the two runs drew from different generators or streams (another
    device: CPU and CUDA draw different numbers from one seed; another seed; another order of
    draws). With tensors, dropout's signature is checked: where both sides keep an element it
    is the same value, only which elements are zeroed differs."""
    cp = ctx.cp
    calls = [c for c in (cp.golden, cp.target) if c is not None]
    op = next((parse_key(m.key).name for c in calls for m in (c.members or [c]) if is_random(parse_key(m.key).name)),
              None)
    if op is None or cp.golden is None or cp.target is None or ctx.in_fail or not ctx.out_fail:
        return []
    title = "a random op fed by different generators/streams"
    advice = ("; the two runs draw different random numbers (another device: CPU and CUDA draw differently from "
              "one seed; another seed or order of draws): seed both alike, or compare with it switched off "
              "(dropout p=0, model.eval())")
    r = ctx.out_fail[0]
    g, t = ctx.arrays(r)
    if g is None or t is None:
        return [Hypothesis("random_stream", title, HIGH, f"{op} is a random op; its inputs and arguments agree and "
                           f"its {r.arg} differs (statistics)" + advice)]
    if "dropout" in op.lower() and g.shape == t.shape:
        both = (g != 0) & (t != 0)
        kept_same = bool(both.any()) and np.allclose(g[both], t[both], rtol=1e-5, atol=0)
        zeros = int(((g == 0) != (t == 0)).sum())
        if kept_same and zeros:
            return [Hypothesis("random_stream", title, 0.9,
                               f"{op}: where both sides keep an element its value is the same, and {zeros} of "
                               f"{g.size} elements are zeroed on one side only: another random mask" + advice)]
    return [Hypothesis("random_stream", title, 0.85, f"{op} is a random op; its inputs and arguments agree and "
                       f"its {r.arg} differs" + advice)]


def _check_pad(ctx: _Ctx) -> List[Hypothesis]:
    if "pad" not in ctx.short:
        return []
    quoted = ctx.quote("mode", "padding_mode")
    if ctx.cp.golden is None or ctx.cp.target is None:
        side = "target" if ctx.cp.golden is None else "golden"
        return [Hypothesis("padding_border", "an explicit padding call in one side only (padding mode)", 0.8,
                           f"{ctx.op} runs only in {side}: its padded border feeds the next call"
                           + _sep(_mode_of(ctx, side)))]
    if quoted:
        return [Hypothesis("padding_border", "the padding mode differs", 0.9, quoted)]
    return []


def _mode_of(ctx: _Ctx, side: str) -> str:
    call = ctx.values.call(side)
    for e in (call.entries if call else []):
        if isinstance(e.leaf, dict) and e.leaf.get("type") == "str":
            return f"mode={e.leaf.get('value')!r}"
    return ""


def _check_arguments(ctx: _Ctx) -> List[Hypothesis]:
    """Recorded argument differences no specific check has explained."""
    rest = [(n, g, t) for n, g, t in ctx.args if n not in ctx.quoted]
    if not rest:
        return []
    out = []
    small = [(n, g, t) for n, g, t in rest if all(isinstance(v, float) and 0 < v < 0.1 for v in (g, t))]
    if small and ctx.short in ADD_OPS | SUB_OPS | CLAMP_OPS:
        n, g, t = small[0]
        out.append(Hypothesis("norm_eps", "a small added constant differs (a normalisation epsilon?)", 0.85,
                              f"{ctx.op} adds {_fmt(g)} in golden and {_fmt(t)} in target ({n}): an epsilon added "
                              f"to a variance or a norm before its square root"))
    out.append(Hypothesis("argument_differs", "the call's recorded arguments differ", ARGUMENT,
                          "; ".join(f"recorded {n}: golden {_fmt(g)}, target {_fmt(t)}" for n, g, t in rest)))
    return out


def _check_unmatched(ctx: _Ctx) -> List[Hypothesis]:
    cp = ctx.cp
    if cp.golden is not None and cp.target is not None:
        return []
    side = "target" if cp.golden is None else "golden"
    other = "golden" if side == "target" else "target"
    if ctx.short in _CASTS:
        return [Hypothesis("precision", "a cast in one side only", 0.8, f"{ctx.op} runs only in {side}: the values "
                           f"after it are held at another precision")]
    tensors = [e for e in ctx.values.entries(side, INPUT) if is_tensor_summary(e.leaf)]
    scalars = [e.leaf.get("value") for e in ctx.values.entries(side, INPUT)
               if isinstance(e.leaf, dict) and isinstance(e.leaf.get("value"), (int, float))
               and not isinstance(e.leaf.get("value"), bool)]
    if ctx.short in ADD_OPS and len(tensors) >= 2:
        if side == "golden":
            return [Hypothesis("dropped_residual", "a residual (skip) addition is missing in target", 0.85,
                               f"golden adds two tensors here ({ctx.op}: {tensors[0].arg} + {tensors[1].arg}); "
                               f"target has no such call: what follows receives one summand only")]
        return [Hypothesis("dropped_residual", "target adds a value golden does not (an extra residual)", 0.7,
                           f"target adds two tensors here ({ctx.op}); golden has no such call")]
    if ctx.short in MUL_OPS | DIV_OPS and len(tensors) == 1 and scalars:
        c = float(scalars[0])
        c = 1.0 / c if "div" in ctx.short and c else c
        return [Hypothesis("constant_scale", f"a constant scale applied in {side} only", 0.85,
                           f"{side} multiplies by {describe_constant(c, ctx.dims())} here ({ctx.op}); {other} has "
                           f"no such call: a scale factor missing in {other}")]
    if ctx.short in MUL_OPS | DIV_OPS and len(tensors) == 2:
        return [Hypothesis("constant_scale", f"a scaling (normalisation) applied in {side} only", 0.7,
                           f"{side} scales {tensors[0].arg} by {tensors[1].arg} here ({ctx.op}, shapes "
                           f"{tensors[0].leaf.get('shape')} and {tensors[1].leaf.get('shape')}); {other} has no such "
                           f"call: a scale or renormalisation missing in {other}")]
    return [Hypothesis("extra_call", f"a call that runs in {side} only", 0.6,
                       f"{ctx.op} runs only in {side} and changes what the next call receives")]


def _check_weight_stats(ctx: _Ctx) -> List[Hypothesis]:
    """Statistics only: a call whose inputs and weights have the same statistics on both sides
    but whose output differs. A transposed or permuted weight keeps every statistic; so does a
    convolution's input when only its padding differs (then the output differs a little, at
    the border). Which one needs the tensors."""
    if ctx.tensors or ctx.in_fail or not ctx.out_fail:
        return []
    weights = [e for e in ctx.values.entries("golden") if e.role != OUTPUT and is_tensor_summary(e.leaf)
               and (e.role == PARAMETER or (e.arg != "input.0" and e.leaf.get("requires_grad")))
               and len(e.leaf.get("shape") or []) >= 2]
    if not weights:
        return []
    r = ctx.out_fail[0]
    rel = r.norm_rel_diff if r.norm_rel_diff is not None else r.error_measure
    conv = "conv" in ctx.op.lower()
    small = rel is not None and abs(rel) < 0.05
    names = ", ".join(e.arg for e in weights[:2])
    out = [Hypothesis("transposed_weight", "a transposed or permuted weight (statistics cannot show it)",
                      0.3 if conv and small else 0.55,
                      f"{names} has the same Max/Min/Mean/Norm on both sides and every input agrees, yet "
                      f"{r.arg} differs (norm {rel:+.2g} relative): a permutation keeps every statistic" if rel is not None
                      else f"{names} has the same statistics on both sides, yet {r.arg} differs", needs_tensors=True)]
    if conv:
        out.append(Hypothesis("padding_border", "padding mode (statistics cannot show the border)",
                              0.5 if small else 0.3,
                              f"the output's norm differs by {rel:+.2g} relative while inputs and weights agree: a "
                              f"small change such as other border values" if rel is not None else "",
                              needs_tensors=True))
    return out


CHECKS = (_check_module_code, _check_unmatched, _check_group, _check_random, _check_pad, _check_inputs, _check_norm, _check_activation, _check_reduction,
          _check_outputs, _check_weight_stats, _check_replay, _check_precision, _check_noise, _check_arguments)


# -------------------------------------------------------------------------------- entry
def find_pair(seqs: List[List[Any]], fd: Any) -> Tuple[Optional[Any], List[Any]]:
    """The call pair the first divergence names, and the pairs before it in execution order."""
    from ..align.pairs import in_time_order

    order = in_time_order(seqs)
    for i, cp in enumerate(order):
        if cp.key == fd.key and cp.direction == fd.direction and \
                (cp.target.key if cp.target is not None else None) == fd.target_key:
            return cp, order[:i]
    return None, []


def diagnose(fd: Any, seqs: List[List[Any]], gd: Any, td: Any) -> List[Hypothesis]:
    """Ranked cause hypotheses for the first divergence `fd` (best first; empty when there is
    none). Never raises: a check that fails on unusual values is skipped."""
    if fd is None:
        return []
    cp, before = find_pair(seqs, fd)
    if cp is None:
        return []
    ctx = _Ctx(fd, cp, Values(cp, gd, td), before)
    found: List[Hypothesis] = []
    for check in CHECKS:
        try:
            found += check(ctx)
        except Exception as e:         # reported (pipeline: a warning line), not swallowed
            found.append(failed_check(check.__name__[7:], e))
    return _capped_by_pairing(cp, rank(found))


CHECK_FAILED = "check_failed"


def failed_check(name: str, e: BaseException) -> Hypothesis:
    """A check that raised: kept in the diagnosis (confidence 0) with where it failed, so the
    compare keeps its result, the output says so (``pipeline``), and a test sees it."""
    import traceback

    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
    return Hypothesis(CHECK_FAILED, f"the {name} check failed (a tsprobe bug: please report it)", 0.0,
                      f"{type(e).__name__}: {e}"[:200] + where)


PAIRED_BY_FLOW = 0.75       # the most a cause gets when the pair itself was inferred


def _capped_by_pairing(cp: Any, ranked: List[Hypothesis]) -> List[Hypothesis]:
    """The same op with different call counters on the two sides was paired by data flow, not
    by name: the cause rests on that pairing, so it is not asserted (a decomposition or an
    extra call elsewhere can pair the wrong two calls; a clean loss written out by hand did)."""
    if cp.golden is None or cp.target is None or cp.golden.members or cp.target.members:
        return ranked
    g, t = parse_key(cp.golden.key), parse_key(cp.target.key)
    if g.name != t.name or g.counter == t.counter:
        return ranked
    for h in ranked:
        if h.confidence > PAIRED_BY_FLOW:
            h.confidence = PAIRED_BY_FLOW
            h.evidence += (f" (golden's {cp.golden.key} was paired with target's {cp.target.key} by data flow: "
                           f"check that pairing before trusting this)")
    return ranked


def rank(found: List[Hypothesis]) -> List[Hypothesis]:
    """Best first; one entry per cause (its most confident one); zero-confidence notes last."""
    best: Dict[str, Hypothesis] = {}
    for h in found:
        if h.cause not in best or h.confidence > best[h.cause].confidence:
            best[h.cause] = h
    return sorted(best.values(), key=lambda h: (-h.confidence, h.needs_tensors))


def add_rerun(diagnosis: List[Dict[str, Any]], rerun: Hypothesis) -> List[Dict[str, Any]]:
    """`diagnosis` (dicts) with a nondeterminism finding merged in, ranked again."""
    items = [Hypothesis(**d) for d in diagnosis] + [rerun]
    return [h.to_dict() for h in rank(items)]
