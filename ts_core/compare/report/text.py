"""The terminal summary of a comparison: verdict, first divergence, earliest failing rows.

Takes any object shaped like ``model.CompareResult`` (this module does not import model.py,
whose ``__str__`` uses it: no import cycle).
"""
from __future__ import annotations

from typing import Any, Dict, List

from ...verdicts import ERROR, PASS, WARNING
from ...dumpfmt import STAT_FIELDS


def _fmt(v: Any, spec: str = ".4g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else "..." + s[-(n - 3):]


def where(step: Any, rank: Any) -> str:
    """A step/rank pair in words: ``step 0, rank 0``; ``step 0, not distributed`` for the folder a
    run without ranks writes (``rank``); msprobe's process folders (``proc123``) as named."""
    rank = str(rank or "")
    if rank in ("", "rank"):
        who = "not distributed" if rank else ""
    elif rank.startswith("rank") and rank[4:].isdigit():
        who = f"rank {rank[4:]}"
    else:
        who = rank
    return ", ".join(x for x in (f"step {step}" if step is not None else "", who) if x)


def terminal_text(result: Any, max_rows: int = 12) -> str:
    """The verdict, the first divergence, then the earliest failing rows as a short table."""
    c = result.counts
    differ = [p for p in result.pairs if p.programs and not p.programs.get("same", True)]
    one_empty = differ and all(any(p.counts.get(f"records_{side}") == 0 for side in ("golden", "target"))
                               for p in differ)
    label = "" if not differ else " (nothing compared)" if all(p.programs.get("calls") == 0 for p in differ) \
        else " (one side recorded nothing)" if one_empty else " (different programs)"
    lines = [f"tsprobe compare: {result.verdict.upper()}{label}  "
             f"({c.get('matched', 0)} calls matched, {c.get('unmatched_golden', 0)} only in golden, "
             f"{c.get('unmatched_target', 0)} only in target; rows: {c.get(PASS, 0)} pass, "
             f"{c.get(WARNING, 0)} warning, {c.get(ERROR, 0)} error)"]
    fd = result.first_divergence
    unreadable = list(getattr(result, "unreadable", None) or [])
    if unreadable:
        lines.append(f"unreadable input: {len(unreadable)} step/rank pair(s) not compared, the others were:")
        lines.extend(f"  {e}" for e in unreadable)
    for p in differ[:3]:
        at = where(p.step, p.rank)
        empty = [side for side in ("golden", "target") if p.counts.get(f"records_{side}") == 0]
        evidence = (f"{' and '.join(empty)} recorded no call here: was the debugger started around the model's "
                    f"forward and backward in that run?" if empty else p.programs["evidence"])
        lines.append(evidence + (f" ({at})" if at else ""))
    if fd and not differ:     # with different programs the evidence above replaces both lines below
        at = where(fd.step, fd.rank)
        lines.append(fd.describe() + (f"\n  ({at})" if at else ""))
        lines.extend(_stats_lines(fd.metrics))
    elif not differ:
        notes = [p.note for p in result.pairs if p.note and not set(p.warnings) & set(unreadable)]
        lines.append("; ".join(dict.fromkeys(notes)) or "no call introduced an error")
    lines.extend(diagnosis_lines(getattr(result, "diagnosis", None) or []))
    lines.extend(_unit_lines(result.pairs))
    bad = [r for r in result.rows if r.verdict != PASS][:max_rows]
    if bad:
        # element-wise columns when any row has them, else both sides' norms (statistics mode)
        tensor = any(r.cosine is not None for r in bad)
        heads = ("cosine", "max_abs") if tensor else ("g_norm", "t_norm")
        header = f"{'verdict':<8} {'dir':<8} {'tensor':<58} {heads[0]:>9} {heads[1]:>10} {'rel_err':>10}"
        lines += ["", header, "-" * len(header)]
        for r in bad:
            a, b = (_fmt(r.cosine, '.6f'), _fmt(r.max_abs_err)) if tensor else (_fmt(r.golden_norm), _fmt(r.target_norm))
            lines.append(f"{r.verdict:<8} {r.direction:<8} {_short(r.name, 58):<58} {a:>9} {b:>10} "
                         f"{_fmt(r.error_measure):>10}")
        more = sum(1 for r in result.rows if r.verdict != PASS) - len(bad)
        if more > 0:
            out = getattr(result, "files", {}).get("csv")
            lines.append(f"... {more} more non-passing rows " + (f"(every row: {out})" if out else
                                                                  "(-o OUT writes every row to OUT/compare.csv)"))
    lines.extend(m for m in _pair_messages(result.pairs) if not any(u in m for u in unreadable))
    if result.unpaired_golden or result.unpaired_target:
        lines.append(f"unpaired dumps: golden {result.unpaired_golden}, target {result.unpaired_target}")
    if getattr(result, "ranks", None) and result.ranks.get("steps"):
        lines.append(ranks_text(result.ranks))
    if result.report_path:
        lines.append(f"report: {result.report_path}")
    return "\n".join(lines)


_STATS = tuple(f.lower() for f in STAT_FIELDS)     # the row attributes golden_max ... target_norm


def _stats_lines(metrics: dict) -> List[str]:
    """Both sides' recorded statistics of the divergent value (msprobe's Bench/NPU max ... l2norm)."""
    if not any(metrics.get(f"{side}_{k}") is not None for side in ("golden", "target") for k in _STATS):
        return []
    return [f"  {side + ':':<8}" + "  ".join(f"{k} {_fmt(metrics.get(f'{side}_{k}'))}" for k in _STATS)
            for side in ("golden", "target")]


def diagnosis_lines(diagnosis: List[dict], shown: int = 3, width: int = 220) -> List[str]:
    """The cause hypotheses, most likely first: title, confidence, cause id, evidence."""
    diagnosis = [h for h in diagnosis if (h.get("confidence") or 0) > 0 or h.get("needs_tensors")]
    if not diagnosis:
        return []
    lines = ["Why (diagnosis, most likely first):"]
    for i, h in enumerate(diagnosis[:shown], 1):
        needs = ", needs tensors" if h.get("needs_tensors") else ""
        lines.append(f"  {i}. {h.get('title', h.get('cause'))} ({float(h.get('confidence') or 0):.0%}, "
                     f"{h.get('cause')}{needs})")
        if h.get("evidence"):
            lines.append(f"     {_short_end(str(h['evidence']), width)}")
    if len(diagnosis) > shown:
        lines.append(f"  ... {len(diagnosis) - shown} more in summary.json")
    return lines


def _short_end(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n - 3] + "..."


def _unit_lines(pairs) -> List[str]:
    """One line per step/rank when there are several: its values by verdict and where it diverged."""
    if len(pairs) < 2:
        return []
    out = ["", f"{'step/rank':<16} {'values':>7} {'error':>6} {'warning':>7}  first divergence"]
    for p in pairs:
        unit = "/".join(x for x in (f"step{p.step}" if p.step is not None else "", p.rank) if x) or "dump"
        c = p.counts
        n = c.get(PASS, 0) + c.get(WARNING, 0) + c.get(ERROR, 0)
        first = p.first_divergence.key if p.first_divergence else "-"
        out.append(f"{unit:<16} {n:>7} {c.get(ERROR, 0):>6} {c.get(WARNING, 0):>7}  {first}")
    return out


# pipeline.py's one message that is a warning (the dump is partial); the others are notes on how
# a pair was compared (cross-framework mapping, ...)
_WARNINGS = ("golden dump is marked incomplete", "target dump is marked incomplete")


def _pair_messages(pairs) -> List[str]:
    """Each message once, however many step/rank pairs carry it (the cross-framework note comes
    with every pair), prefixed ``warning:`` only when it is one."""
    carried: dict = {}
    for p in pairs:
        for w in p.warnings:
            carried.setdefault(w, []).append(p)
    out = []
    for w, ps in carried.items():
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
