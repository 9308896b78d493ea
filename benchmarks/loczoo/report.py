"""Tables and JSON of a localisation run."""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List

from .spec import LEVELS, PAIRS


def _frac(num: int, den: int) -> str:
    return f"{num}/{den} ({100.0 * num / den:.0f}%)" if den else "-"


def summary_rows(outcomes) -> List[Dict]:
    """One row per (task, pair kind, level): bugs named at the right module / op / place, and
    false alarms on clean pairs."""
    groups = defaultdict(list)
    for o in outcomes:
        groups[(o.case.task, o.case.pair, o.case.level)].append(o)
    rows = []
    for task in sorted({k[0] for k in groups}):
        for pair in PAIRS:
            for level in LEVELS:
                os_ = groups.get((task, pair, level))
                if not os_:
                    continue
                bugs = [o for o in os_ if not o.case.clean]
                clean = [o for o in os_ if o.case.clean]
                rows.append({
                    "task": task, "pair": pair, "level": level, "cases": len(os_), "bugs": len(bugs),
                    "module_ok": sum(1 for o in bugs if o.score.get("module_ok")) if level != "L1" else None,
                    "op_ok": sum(1 for o in bugs if o.score.get("op_ok")) if level != "L0" else None,
                    "right_place": sum(1 for o in bugs if o.score.get("ok")),
                    "clean": len(clean), "false_alarms": sum(1 for o in clean if o.score.get("false_alarm")),
                    "crashed": sum(1 for o in os_ if o.error)})
    return rows


def table(outcomes) -> str:
    rows = summary_rows(outcomes)
    head = (f"{'task':10s} {'pair':12s} {'level':5s} {'cases':>5s}  {'bugs at right module':22s} "
            f"{'bugs at right op':22s} {'bugs at right place':22s} {'false alarms (clean)':22s} crashed")
    lines = [head, "-" * len(head)]
    for r in rows:
        mod = _frac(r["module_ok"], r["bugs"]) if r["module_ok"] is not None else "n/a (L1)"
        op = _frac(r["op_ok"], r["bugs"]) if r["op_ok"] is not None else "n/a (L0)"
        lines.append(f"{r['task']:10s} {r['pair']:12s} {r['level']:5s} {r['cases']:5d}  {mod:22s} {op:22s} "
                     f"{_frac(r['right_place'], r['bugs']):22s} {_frac(r['false_alarms'], r['clean']):22s} "
                     f"{r['crashed']}")
    return "\n".join(lines)


def family_table(outcomes) -> str:
    """Right place / false alarms per family and level (all pair kinds and tasks together)."""
    agg = defaultdict(lambda: [0, 0, 0, 0])
    for o in outcomes:
        a = agg[(o.case.pair, o.case.family, o.case.level)]
        if o.case.clean:
            a[2] += 1
            a[3] += bool(o.score.get("false_alarm"))
        else:
            a[0] += 1
            a[1] += bool(o.score.get("ok"))
    lines = [f"{'pair':12s} {'family':12s} " + " ".join(f"{lv:>16s}" for lv in LEVELS) + "   (right/bugs, alarms/clean)"]
    for pair in PAIRS:
        for fam in sorted({f for p, f, _ in agg if p == pair}):
            cells = []
            for lv in LEVELS:
                a = agg.get((pair, fam, lv))
                cells.append(f"{a[1]}/{a[0]}, {a[3]}/{a[2]}" if a else "-")
            lines.append(f"{pair:12s} {fam:12s} " + " ".join(f"{c:>16s}" for c in cells))
    return "\n".join(lines)


def describe_named(o) -> str:
    if o.error:
        return "CRASH: " + o.error.splitlines()[0][:160]
    fd = o.first_divergence
    if fd is None:
        return f"nothing named (verdict {o.score.get('verdict')}; {o.note[:110]})"
    named = o.score.get("named") or {}
    calls = "; ".join(f"{c['op']} in {c['module'] if c['module'] is not None else '?'}" for c in named.get("calls", []))
    where = f"module {fd.get('module')}" if fd.get("module") else "no module"
    tkey = f" <-> {fd.get('target_key')}" if fd.get("target_key") and fd.get("target_key") != fd.get("key") else ""
    return (f"{fd.get('key')}{tkey} [{fd.get('direction')}, {o.score.get('order')}] ({where}; calls: {calls or '-'}) "
            f"- {str(fd.get('reason', ''))[:120]}")


def miss_cause(o) -> str:
    """A coarse, automatic label for why a case failed, read off the compare result (for
    grouping the listing; the JSON has the details)."""
    c, s, fd = o.case, o.score, o.first_divergence
    if o.error:
        return "crash"
    if fd is None:
        return "error rows but no first divergence" if c.clean else "nothing named"
    if c.clean:
        if "only in" in str(fd.get("reason", "")):
            return "clean: names a call present on one side only"
        return "clean: names a call whose values differ (float noise / other decomposition / pairing)"
    named = s.get("named") or {}
    if s.get("order") == "after backward":
        return "names an optimizer call"
    if named.get("calls") and all(call["module"] is None for call in named["calls"]) and not named.get("module_record"):
        return "names a call with no module"
    if fd.get("direction") == "backward" and c.place.direction == "forward":
        return "names a backward call for a forward bug"
    mods = named.get("modules", [])
    if c.level == "L1":
        mods = [call["module"] for call in named.get("calls", []) if call["module"] is not None]
    if any(m in c.place.modules for m in mods):
        where = "right module, another op" if c.level != "L0" else "right module"
    elif any(m.startswith(e + ".") or (e == "" and m) for m in mods for e in c.place.modules):
        where = "names a submodule of the bug's module (the next module its own code feeds)"
    elif any(e.startswith(m + ".") or (m == "" and e) for m in mods for e in c.place.modules):
        where = "names an enclosing module"
    else:
        where = "names another module"
    if "only in" in str(fd.get("reason", "")):
        where += "; the named call is present on one side only"
    return where


def misses(outcomes) -> str:
    lines = []
    for o in outcomes:
        if o.score.get("ok"):
            continue
        c = o.case
        exp = "no divergence" if c.clean else (f"module {'|'.join(m or '<model>' for m in c.place.modules)}"
                                              + (f", op {'|'.join(c.place.ops)}" if c.level != "L0" else ""))
        lines.append(f"- {c.id}: expected {exp}\n    [{miss_cause(o)}] named: {describe_named(o)}")
    return "\n".join(lines) if lines else "(none)"


def cause_counts(outcomes) -> str:
    counts = defaultdict(lambda: defaultdict(int))
    for o in outcomes:
        if not o.score.get("ok"):
            counts[miss_cause(o)][f"{o.case.pair} {o.case.level}"] += 1
    lines = []
    for cause, by in sorted(counts.items(), key=lambda kv: -sum(kv[1].values())):
        lines.append(f"{sum(by.values()):4d}  {cause}  ({', '.join(f'{k}: {v}' for k, v in sorted(by.items()))})")
    return "\n".join(lines) if lines else "(none)"


def cause_rows(outcomes) -> List[Dict]:
    """Per bug kind with an expected cause: how often the diagnosis names it first / in its top 3
    (over every case of the kind, localised or not), and the same over the cases named at the
    right place; then the clean pairs given a high-confidence cause."""
    from .spec import EXPECTED_CAUSE

    by = defaultdict(list)
    for o in outcomes:
        if not o.case.clean and o.case.variant in EXPECTED_CAUSE:
            by[o.case.variant].append(o)
    rows = []
    for kind in sorted(by):
        os_ = by[kind]
        placed = [o for o in os_ if o.score.get("ok")]
        rows.append({"kind": kind, "cause": "|".join(EXPECTED_CAUSE[kind]), "cases": len(os_),
                     "top1": sum(1 for o in os_ if o.cause.get("top1")),
                     "top3": sum(1 for o in os_ if o.cause.get("top3")),
                     "placed": len(placed), "placed_top1": sum(1 for o in placed if o.cause.get("top1")),
                     "confidently_wrong": sum(1 for o in os_ if o.cause.get("confidently_wrong"))})
    return rows


def cause_table(outcomes) -> str:
    rows = cause_rows(outcomes)
    head = (f"{'bug kind':22s} {'expected cause':18s} {'cases':>5s}  {'top-1':14s} {'top-3':14s} "
            f"{'top-1 where localised':22s} confidently wrong")
    lines = [head, "-" * len(head)]
    tot = [0, 0, 0, 0, 0, 0]
    keys = ("cases", "top1", "top3", "placed", "placed_top1", "confidently_wrong")
    for r in rows:
        lines.append(f"{r['kind']:22s} {r['cause'][:18]:18s} {r['cases']:5d}  {_frac(r['top1'], r['cases']):14s} "
                     f"{_frac(r['top3'], r['cases']):14s} {_frac(r['placed_top1'], r['placed']):22s} "
                     f"{r['confidently_wrong']}")
        for i, k in enumerate(keys):
            tot[i] += r[k]
    lines.append(f"{'all of the above':22s} {'':18s} {tot[0]:5d}  {_frac(tot[1], tot[0]):14s} "
                 f"{_frac(tot[2], tot[0]):14s} {_frac(tot[4], tot[3]):22s} {tot[5]}")
    clean = [o for o in outcomes if o.case.clean]
    high = [o for o in clean if o.cause.get("high_confidence")]
    lines.append(f"clean pairs given a cause with confidence >= 0.8: {_frac(len(high), len(clean))}"
                 + (f" ({', '.join(o.case.id for o in high[:5])})" if high else ""))
    other = [o for o in outcomes if not o.case.clean and o.cause.get("top1") is None and not o.error]
    if other:
        firsts = defaultdict(lambda: defaultdict(int))
        for o in other:
            firsts[o.case.variant][(o.cause.get("named") or ["-"])[0]] += 1
        lines.append("kinds without an expected cause, their first cause: " + "; ".join(
            f"{k}: " + ", ".join(f"{c} {n}" for c, n in sorted(v.items(), key=lambda x: -x[1])) for k, v in sorted(firsts.items())))
    return "\n".join(lines)


def cause_misses(outcomes) -> str:
    lines = []
    for o in outcomes:
        if o.case.clean or o.cause.get("top1") is not False:
            continue
        fd = o.first_divergence
        lines.append(f"- {o.case.id}: expected {'|'.join(o.cause.get('expected') or [])}, named "
                     f"{', '.join(o.cause.get('named') or []) or 'nothing'} (at {fd.get('key') if fd else 'no divergence'}"
                     f"{'' if o.score.get('ok') else ', wrong place'})")
    return "\n".join(lines) if lines else "(none)"


def write_json(path: str, outcomes, options: Dict, seconds: float) -> None:
    from ts_core.dumpfmt import json_safe, write_json_atomic

    cases = []
    for o in outcomes:
        d = o.to_dict()
        d["miss_cause"] = None if o.score.get("ok") else miss_cause(o)
        cases.append(d)
    doc = {"options": options, "seconds": round(seconds, 1), "table": summary_rows(outcomes),
           "causes": cause_rows(outcomes), "cases": cases}
    write_json_atomic(path, json_safe(doc))
