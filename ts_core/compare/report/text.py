"""The terminal summary of a comparison: verdict, first divergence, earliest failing rows.

Takes any object shaped like ``model.CompareResult`` (this module does not import model.py,
whose ``__str__`` uses it: no import cycle).
"""
from __future__ import annotations

from typing import Any, Dict, List

from ...verdicts import ERROR, PASS, WARNING


def _fmt(v: Any, spec: str = ".4g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else "..." + s[-(n - 3):]


def terminal_text(result: Any, max_rows: int = 12) -> str:
    """The verdict, the first divergence, then the earliest failing rows as a short table."""
    c = result.counts
    differ = [p for p in result.pairs if p.programs and not p.programs.get("same", True)]
    label = "" if not differ else " (nothing compared)" if all(p.programs.get("calls") == 0 for p in differ) \
        else " (different programs)"
    lines = [f"tsprobe compare: {result.verdict.upper()}{label}  "
             f"({c.get('matched', 0)} calls matched, {c.get('unmatched_golden', 0)} only in golden, "
             f"{c.get('unmatched_target', 0)} only in target; rows: {c.get(PASS, 0)} pass, "
             f"{c.get(WARNING, 0)} warning, {c.get(ERROR, 0)} error)"]
    fd = result.first_divergence
    for p in differ[:3]:
        where = ", ".join(x for x in (f"step {p.step}" if p.step is not None else "", p.rank) if x)
        lines.append(p.programs["evidence"] + (f" ({where})" if where else ""))
    if fd and not differ:     # with different programs the evidence above replaces both lines below
        where = ", ".join(x for x in (f"step {fd.step}" if fd.step is not None else "", fd.rank) if x)
        lines.append(fd.describe() + (f"\n  ({where})" if where else ""))
    elif not differ:
        lines.append(result.summary().get("first_divergence_note") or "no call introduced an error")
    bad = [r for r in result.rows if r.verdict != PASS][:max_rows]
    if bad:
        header = f"{'verdict':<8} {'dir':<8} {'tensor':<58} {'cosine':>9} {'max_abs':>10} {'rel_err':>10}"
        lines += ["", header, "-" * len(header)]
        for r in bad:
            lines.append(f"{r.verdict:<8} {r.direction:<8} {_short(r.name, 58):<58} {_fmt(r.cosine, '.6f'):>9} "
                         f"{_fmt(r.max_abs_err):>10} {_fmt(r.error_measure):>10}")
        more = sum(1 for r in result.rows if r.verdict != PASS) - len(bad)
        if more > 0:
            lines.append(f"... {more} more non-passing rows")
    lines.extend(_pair_messages(result.pairs))
    if result.unpaired_golden or result.unpaired_target:
        lines.append(f"unpaired dumps: golden {result.unpaired_golden}, target {result.unpaired_target}")
    if getattr(result, "ranks", None) and result.ranks.get("steps"):
        lines.append(ranks_text(result.ranks))
    if result.report_path:
        lines.append(f"report: {result.report_path}")
    return "\n".join(lines)


# pipeline.py's one message that is a warning (the dump is partial); the others are notes on how
# a pair was compared (cross-framework mapping, ...)
_WARNINGS = ("golden dump is marked incomplete", "target dump is marked incomplete")


def _pair_messages(pairs) -> List[str]:
    """Each message once, however many step/rank pairs carry it (the cross-framework note comes
    with every pair), prefixed ``warning:`` only when it is one."""
    where: dict = {}
    for p in pairs:
        for w in p.warnings:
            where.setdefault(w, []).append(p)
    out = []
    for w, ps in where.items():
        kind = "warning" if w.startswith(_WARNINGS) else "note"
        out.append(f"{kind}: {w}" + (f" ({len(ps)} step/rank pairs)" if len(ps) > 1 else ""))
    return out


def ranks_text(summary: Dict[str, Any], max_links: int = 5) -> str:
    """The many-rank part of the terminal summary."""
    lines = []
    for s in summary.get("steps", []):
        step = "" if s["step"] is None else f" step {s['step']}"
        lines.append(f"ranks{step}: {s['explanation']}")
        for r in s["ranks"]:
            fd = r["first_divergence"]
            if fd is None:
                lines.append(f"  {r['rank']:<8} {r['verdict']}: no first divergence")
            else:
                src = f"  at {fd['source']}" if fd.get("source") else ""
                lines.append(f"  {r['rank']:<8} {fd['key']} [{fd['direction']}], {fd['collectives_before']} "
                             f"collective(s) before{src}")
        for link in s["collectives"][:max_links]:
            state = ", ".join(f"{rank}: in {v['input'] or '-'} / out {v['output'] or '-'}" if v else f"{rank}: absent"
                              for rank, v in link["ranks"].items())
            lines.append(f"  collective {link['key']}: {state}")
        if len(s["collectives"]) > max_links:
            lines.append(f"  ... {len(s['collectives']) - max_links} more collectives with differences (ranks.json)")
    return "\n".join(lines)
