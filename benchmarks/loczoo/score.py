"""Score what the compare tool named against where the bug was put.

The tool's answer is ``result.first_divergence`` (key, target_key, module, direction) and
``result.verdict``. Module paths are read from module keys themselves (``Module.net.attn.q.
Linear.forward.0`` -> ``attn.q``) or, for an API call, from its construct parent
(``first_divergence.module``); the harness root's child ``net`` is the family model, so
``net`` is the family's own forward (path "") and ``net.x`` is ``x``. A merged cross-framework
group key (``A.0.forward+B.0.forward``) counts by any of its members.

Per level:
- L0 records modules only: a bug is right when its module is right.
- L1 records API calls only (construct.json is empty): right when the op is right.
- mix: right when both are; for a parameter bug the record of the module holding the
  parameter also counts as the op (it is where "the weight of X differs" is seen).
"The op is right" means the op's name is an expected one and that call runs in an expected
module: at mix per the tool's ``module`` or the dump's construct.json; at L1 per the
construct.json of a mix dump of the same program (a reference the harness makes: L1 and mix
record the same API calls under the same keys), so naming the right op name in the wrong
layer does not count.
A clean pair raises a false alarm when anything is named or the verdict is "error".
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ts_core.dumpfmt import parse_key

from .spec import EXPECTED_CAUSE, HIGH_CONFIDENCE, OUTSIDE, Case, Place, op_matches

ROOT = "net"


def family_path(path: Optional[str]) -> Optional[str]:
    """Harness module path -> path relative to the family model (None outside it)."""
    if path is None:
        return None
    if path == ROOT:
        return ""
    if path.startswith(ROOT + "."):
        return path[len(ROOT) + 1:]
    return None


def _members(key: Optional[str]) -> List[str]:
    if not key:
        return []
    return [k for k in key.split("+") if k]


def locate(fd: Any, golden_parents: Optional[Dict[str, Optional[str]]] = None,
           target_parents: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, Any]:
    """What a first divergence names: its keys, its API calls with the module each sits in,
    the module paths it names (family-relative), whether it is a module record.

    ``fd`` is a FirstDivergence or its dict form. ``*_parents``: construct.json of a mix dump of
    the same golden/target program; at L1 (no hierarchy recorded) they tell which module an
    API call ran in, so that "the right op" means the right call, not just the right op name."""
    get = (lambda k: fd.get(k)) if isinstance(fd, dict) else (lambda k: getattr(fd, k, None))
    key, target_key = get("key"), get("target_key")
    keys = [k for k in (key, target_key) if k]
    parent = get("module")
    # which side's construct tells where a key ran: golden's for the golden key, target's for
    # the target key; a key that is both (same name, or a call present in target only) -> both
    sides = []
    if key:
        sides.append((key, [golden_parents] + ([target_parents] if key == target_key else [])))
    if target_key and target_key != key:
        sides.append((target_key, [target_parents]))
    calls: List[Dict[str, Any]] = []
    modules: List[str] = []
    module_record = False
    for side_key, tables in sides:
        for member in _members(side_key):
            info = parse_key(member)
            if info.kind in ("module", "parameters_grad"):
                module_record = True
                p = family_path(info.module_path)
                if p is not None:
                    modules.append(p)
            elif info.kind == "api":
                # the tool's own answer first; else where the call ran (per side)
                owners = [parent] if parent else [t[member] for t in tables if t and t.get(member)]
                for owner in dict.fromkeys(owners or [None]):
                    call = {"key": member, "op": info.name,
                            "module": family_path(parse_key(owner).module_path) if owner else None}
                    if call not in calls:
                        calls.append(call)
    if parent and not module_record:      # an API call: the module it ran in
        p = family_path(parse_key(parent).module_path)
        if p is not None:
            modules.append(p)
    return {"keys": keys, "calls": calls, "ops": list(dict.fromkeys(c["op"] for c in calls)),
            "modules": list(dict.fromkeys(modules)), "module_record": module_record,
            "direction": get("direction"), "parent": parent}


def score(case: Case, fd: Any, verdict: str, golden_parents: Optional[Dict[str, Optional[str]]] = None,
          target_parents: Optional[Dict[str, Optional[str]]] = None) -> Dict[str, Any]:
    """The verdict on one case. For a bug: ``module_ok`` (None at L1, which records no module),
    ``op_ok`` (None at L0: the op name matches AND that call runs in an expected module) and
    ``ok``; for a clean pair: ``false_alarm`` and ``ok``."""
    named = locate(fd, golden_parents, target_parents) if fd is not None else None
    if case.clean:
        alarm = fd is not None or verdict == "error"
        return {"named": named, "verdict": verdict, "false_alarm": alarm, "ok": not alarm,
                "module_ok": None, "op_ok": None}
    place: Place = case.place
    records_modules, records_ops = case.level != "L1", case.level != "L0"
    if named is None:
        return {"named": None, "verdict": verdict, "module_ok": False if records_modules else None,
                "op_ok": False if records_ops else None, "ok": False, "false_alarm": False}
    module_ok = any(m in place.modules for m in named["modules"])
    if OUTSIDE in place.modules and not named["modules"] and not named["module_record"] and named["calls"]:
        module_ok = True        # a call of the training loop, outside every module, as expected
    op_ok = any(op_matches(c["op"], place.ops) and c["module"] in place.modules for c in named["calls"])
    if place.param and named["module_record"] and module_ok:
        op_ok = True            # "the weight of X differs", at X
    result = {"named": named, "verdict": verdict, "false_alarm": False,
              "module_ok": module_ok if records_modules else None, "op_ok": op_ok if records_ops else None}
    result["ok"] = all(v for v in (result["module_ok"], result["op_ok"]) if v is not None)
    return result


def score_cause(case: Case, diagnosis: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The diagnosis against the cause the bug kind should be given: ``top1``/``top3`` (the
    expected cause first / among the first three with a confidence > 0; None for a kind without
    an expected cause), and for a clean pair ``high_confidence`` (a cause asserted at or above
    HIGH_CONFIDENCE, which must not happen)."""
    named = [h for h in diagnosis if h.get("confidence", 0) > 0]
    causes = [h["cause"] for h in named]
    high = [h["cause"] for h in named if h["confidence"] >= HIGH_CONFIDENCE]
    if case.clean:
        return {"named": causes[:3], "high_confidence": bool(high), "top1": None, "top3": None}
    want = EXPECTED_CAUSE.get(case.variant)
    return {"named": causes[:3], "expected": list(want) if want else None, "high_confidence": bool(high),
            "top1": (bool(causes) and causes[0] in want) if want else None,
            "top3": any(c in want for c in causes[:3]) if want else None,
            # the first cause asserted (>= 0.8) and not the expected one
            "confidently_wrong": bool(want) and bool(named) and named[0]["confidence"] >= HIGH_CONFIDENCE
            and named[0]["cause"] not in want}
