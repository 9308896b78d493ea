"""Two fingerprints compared, section by section, into findings: what differs, on which side,
and how much it matters (``error``: changes numerics or determinism; ``warning``: may;
``info``: recorded for the record)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..dumpfmt import STAT_FIELDS
from ..dumpfmt.dtypes import dtype_name
from ..verdicts import ERROR, INFO, PASS, RANK as _RANK, WARNING
from .rules import DETERMINISM_ENV, canonical, hyperparameter_level, package_level, set_by_framework

SECTIONS = ("packages", "python", "environment", "framework", "hyperparameters", "tsprobe_config", "weights", "data")
_MISSING = "(absent)"


@dataclass
class Finding:
    section: str
    name: str
    golden: Any
    target: Any
    level: str
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _fmt(v: Any) -> Any:
    return _MISSING if v is None else v


def _mapping(section: str, g: Dict[str, Any], t: Dict[str, Any], level_of, missing_level=None) -> List[Finding]:
    out = []
    for name in sorted(set(g) | set(t)):
        a, b = g.get(name), t.get(name)
        if name in g and name in t and _same(a, b):
            continue
        level = level_of(name)
        if (name not in g or name not in t) and missing_level is not None:
            level = missing_level(name)
        out.append(Finding(section, name, _fmt(a) if name in g else _MISSING, _fmt(b) if name in t else _MISSING, level))
    return out


def _same(a: Any, b: Any) -> bool:
    if a == b:
        return True
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-12)       # "1e-3" and "0.001"
    except (TypeError, ValueError):
        return str(a).lower() == str(b).lower()


def _environment(g: Dict[str, Any], t: Dict[str, Any], g_fw, t_fw) -> List[Finding]:
    """Variables the user set; one that only a framework's import set (MindSpore sets
    KMP_DUPLICATE_LIB_OK) is not the user's config: info, with the reason."""
    out = _mapping("environment", g, t, lambda n: ERROR if n in DETERMINISM_ENV else WARNING)
    for f in out:
        by = [fw for name, side, fws in ((f.golden, g, g_fw), (f.target, t, t_fw))
              if f.name in side for fw in [set_by_framework(f.name, side[f.name], fws)] if fw]
        present = [side for side in (g, t) if f.name in side]
        if by and len(by) == len(present):
            f.level, f.note = INFO, f"set by importing {by[0]} itself, not by the user"
    return out


def _hyper(g: Dict[str, Any], t: Dict[str, Any]) -> List[Finding]:
    """Hyperparameters matched by meaning (``lr`` and ``learning_rate``), as msprobe's fuzzy match."""
    def canon(d):
        out = {}
        for k, v in d.items():
            out.setdefault(canonical(k), (k, v))
        return out

    cg, ct = canon(g or {}), canon(t or {})
    out = []
    for name in sorted(set(cg) | set(ct)):
        if name in cg and name in ct:
            (kg, vg), (kt, vt) = cg[name], ct[name]
            if not _same(vg, vt):
                label = kg if kg == kt else f"{kg} / {kt}"
                out.append(Finding("hyperparameters", label, vg, vt, hyperparameter_level(name)))
        else:
            k, v = cg.get(name) or ct.get(name)
            level = INFO if hyperparameter_level(name) == INFO else WARNING
            out.append(Finding("hyperparameters", k, v if name in cg else _MISSING, v if name in ct else _MISSING,
                               level, "set on one side only"))
    return out


def _framework(g: Dict[str, Any], t: Dict[str, Any]) -> List[Finding]:
    out = []
    for fw in sorted(set(g or {}) | set(t or {})):
        a, b = (g or {}).get(fw), (t or {}).get(fw)
        if a is None or b is None:
            out.append(Finding("framework", fw, "used" if a else _MISSING, "used" if b else _MISSING, INFO,
                               "one run did not import it"))
            continue
        for name in sorted(set(a) | set(b)):
            if not _same(a.get(name), b.get(name)):
                level = WARNING if name in ("num_threads", "initial_seed", "seed", "cuda", "device_target") else ERROR
                out.append(Finding("framework", f"{fw}.{name}", _fmt(a.get(name)), _fmt(b.get(name)), level))
    return out


def _tensor_rel(a: Dict[str, Any], b: Dict[str, Any]) -> Optional[float]:
    worst = None
    for k in STAT_FIELDS:
        x, y = a.get(k), b.get(k)
        if not isinstance(x, (int, float)) or not isinstance(y, (int, float)) or isinstance(x, bool):
            continue
        d = abs(x - y) / abs(x) if x else (0.0 if y == x else math.inf)
        worst = d if worst is None else max(worst, d)
    return worst


def _tensors(section: str, g: Dict[str, Any], t: Dict[str, Any]) -> Tuple[List[Finding], str]:
    """Parameters or batch tensors: by name; by position when no name matches (another framework)."""
    note = ""
    if g and t and not (set(g) & set(t)) and len(g) == len(t):
        pairs = list(zip(g.items(), t.items()))
        note = "names differ on every tensor: paired by position"
    else:
        pairs = [((n, g.get(n)), (n, t.get(n))) for n in list(g) + [n for n in t if n not in g]]
    out = []
    for (gn, a), (tn, b) in pairs:
        name = gn if gn == tn else f"{gn} / {tn}"
        if a is None or b is None:
            out.append(Finding(section, name, "present" if a else _MISSING, "present" if b else _MISSING, ERROR,
                               "only on one side"))
            continue
        if a.get("shape") != b.get("shape") or (a.get("dtype") and b.get("dtype") and
                                                dtype_name(a["dtype"]) != dtype_name(b["dtype"])):
            out.append(Finding(section, name, f"{a.get('dtype')} {a.get('shape')}", f"{b.get('dtype')} {b.get('shape')}",
                               ERROR, "dtype or shape differs"))
            continue
        if a.get("crc32") and b.get("crc32"):
            if a["crc32"] != b["crc32"]:
                rel = _tensor_rel(a, b)
                out.append(Finding(section, name, a["crc32"], b["crc32"], ERROR,
                                   "bitwise different (crc32)" + (f"; statistics differ by up to {rel:.3g} (relative)"
                                                                 if rel else "; statistics equal")))
            continue
        rel = _tensor_rel(a, b)
        if rel:
            out.append(Finding(section, name, _stats_text(a), _stats_text(b), ERROR,
                               f"statistics differ by up to {rel:.3g} (relative)"))
    return out, note


def _stats_text(s: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={s.get(k):.6g}" for k in STAT_FIELDS if isinstance(s.get(k), (int, float)))


RESULT = "result"          # the verdict of a section that holds results of training, not inputs


def diff(golden: Dict[str, Any], target: Dict[str, Any],
         weights_are_results: bool = False) -> Tuple[List[Finding], Dict[str, str], List[str]]:
    """Findings, a verdict per section and notes, for two fingerprints. Inputs are the config,
    the environment the user set, the data and the weights a run starts from; with
    ``weights_are_results`` (a later step of the same runs) the weights are what training made
    of those inputs: their differences are reported as results (info), never as config errors."""
    f: List[Finding] = []
    notes: List[str] = []
    f += _mapping("packages", golden.get("packages") or {}, target.get("packages") or {}, package_level)
    if golden.get("python") != target.get("python"):
        f.append(Finding("python", "version", _fmt(golden.get("python")), _fmt(target.get("python")), WARNING))
    f += _environment(golden.get("environment") or {}, target.get("environment") or {},
                      list(golden.get("framework") or {}), list(target.get("framework") or {}))
    f += _framework(golden.get("framework") or {}, target.get("framework") or {})
    f += _hyper(golden.get("hyperparameters") or {}, target.get("hyperparameters") or {})
    f += _mapping("tsprobe_config", golden.get("tsprobe_config") or {}, target.get("tsprobe_config") or {},
                  lambda n: INFO)
    verdicts = {s: PASS for s in SECTIONS}
    at = golden.get("weights_step", target.get("weights_step"))     # weights read at that step only
    for section in ("weights", "data"):
        g, t = golden.get(section), target.get(section)
        if section == "weights" and (g is None or t is None) and at is not None:
            verdicts[section] = "not recorded"          # by design: only the first dumped step's
            notes.append(f"weights: recorded at step {at}, the first dumped step (a later step's are a "
                         "result of training; fingerprint: every_step records them at every step)")
            continue
        if g is None or t is None:
            verdicts[section] = "not recorded" if g is None and t is None else WARNING
            if g is not None or t is not None:
                f.append(Finding(section, "(all)", "recorded" if g is not None else _MISSING,
                                 "recorded" if t is not None else _MISSING, WARNING,
                                 "recorded on one side only" + (" (the model's forward did not run in the dumped "
                                                                "step)" if section == "data" else "")))
            continue
        found, note = _tensors(section, g, t)
        if section == "weights" and weights_are_results:
            for x in found:
                x.level = INFO
                x.note = "a result of training (a later step's weights), not an input; " + x.note
            verdicts[section] = RESULT
            notes.append("weights: a result of the earlier steps, not an input"
                         + (f" ({len(found)} of {len(g)} differ)" if found else f" (all {len(g)} identical)"))
            f += found
            continue
        f += found
        if note:
            notes.append(f"{section}: {note}")
        if not found:
            notes.append(f"{section}: all {len(g)} identical" + (" (crc32)" if all(v.get("crc32") for v in g.values())
                                                                  else " (statistics)"))
    for x in f:
        if _RANK[x.level] > _RANK.get(verdicts.get(x.section, PASS), 0):
            verdicts[x.section] = x.level
    return f, verdicts, notes
