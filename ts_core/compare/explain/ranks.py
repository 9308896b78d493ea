"""Many ranks in one summary: each rank's first divergence, which rank diverged first, and the
collectives that carried a difference from one rank to the others.

Ranks exchange data only through collectives (``Distributed.*``, ``MintDistributed.*``). A
rank's first divergence that comes after it joined the k-th collective may have been received
through it; one that comes before any collective where no other rank differed was computed
there. So the rank that diverged first is the one whose first divergence has the fewest
collectives before it in its own execution order (``collectives_before``); a divergence inside
a collective counts as after entering it. The n-th call of one collective on every rank is the
same exchange (SPMD programs: same keys on every rank), so ``Distributed.all_reduce.0.forward``
is compared across ranks: where its inputs differ on some ranks and not on others, the later
divergences of the others are linked to it.

Works on a CompareResult (``tsprobe compare``) or on merged results (``tsprobe merge``): the
execution order of each pair is kept in ``PairResult.timeline`` so merging needs no dump.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ...dumpfmt import parse_key, read_header_and_data, without_direction
from ...verdicts import ERROR, worse
from ..judge.verdict import pair_verdict
from ..model import CompareResult, PairResult, Row

COLLECTIVE_PREFIXES = ("Distributed", "MintDistributed")


def is_collective(key: Optional[str]) -> bool:
    return bool(key) and parse_key(key).kind == "api" and parse_key(key).prefix in COLLECTIVE_PREFIXES


def timeline(pair: PairResult) -> Dict[str, Any]:
    """What the many-rank summary needs of one pair, from its golden dump.json: the record
    order of its collectives and of its first divergence (dump.json holds records in the order
    they were made; compare rows list forward calls before backward ones)."""
    try:
        _, data = read_header_and_data(pair.golden)
    except Exception:
        return {}
    order = {k: i for i, k in enumerate(data)}
    fd = pair.first_divergence
    return {"collectives": [[i, k] for k, i in order.items() if is_collective(k)],
            "first_divergence_index": order.get(fd.key) if fd else None}


def _worst(rows: List[Row]) -> Optional[str]:
    verdict = None
    for r in rows:
        verdict = r.verdict if verdict is None else worse(verdict, r.verdict)
    return verdict


def _collective_rows(pair: PairResult) -> Dict[str, Dict[str, Optional[str]]]:
    """Per collective key of one pair: worst verdict of its inputs and of its outputs."""
    out: Dict[str, Dict[str, List[Row]]] = {}
    for r in pair.rows:
        key = r.golden_key or r.target_key
        if is_collective(key):
            side = out.setdefault(key, {"input": [], "output": []})
            side["output" if r.role == "output" else "input"].append(r)
    return {k: {"input": _worst(v["input"]), "output": _worst(v["output"])} for k, v in out.items()}


def _position(pair: PairResult) -> Tuple[float, int]:
    """(collectives before the first divergence, record index); a divergence inside a
    collective counts as half a collective later."""
    tl = pair.timeline or {}
    fd = pair.first_divergence
    idx = tl.get("first_divergence_index")
    colls = tl.get("collectives") or []
    if fd is None:
        return (float("inf"), 0)
    if idx is None:     # no timeline (a result from an older tsprobe): the row order instead
        idx = min((r.order for r in pair.rows if r.golden_key == fd.key), default=0)
        colls = [[r.order, r.golden_key] for r in pair.rows if is_collective(r.golden_key)]
    before = sum(1 for i, _ in {tuple(c) for c in colls} if i < idx)
    return (before + (0.5 if is_collective(fd.key) else 0.0), idx)


def rank_summary(result: CompareResult) -> Dict[str, Any]:
    """Per step: each rank's first divergence, the rank(s) that diverged first, collectives
    linked across ranks. ``{"steps": [...]}``; empty when there is one rank per step."""
    by_step: Dict[Any, List[PairResult]] = {}
    for p in result.pairs:
        by_step.setdefault(p.step, []).append(p)
    steps = []
    for step, pairs in sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        if len({p.rank for p in pairs}) < 2:
            continue
        steps.append(_step_summary(step, sorted(pairs, key=lambda p: _rank_no(p.rank))))
    return {"steps": steps}


def _rank_no(rank: str) -> Tuple[int, str]:
    digits = "".join(ch for ch in rank if ch.isdigit())
    return (int(digits) if digits else -1, rank)


def _step_summary(step, pairs: List[PairResult]) -> Dict[str, Any]:
    ranks = []
    pos = {p.rank: _position(p) for p in pairs}
    for p in pairs:
        fd = p.first_divergence
        entry: Dict[str, Any] = {"rank": p.rank, "verdict": pair_verdict(p.first_divergence is not None, p.counts), "first_divergence": None}
        if fd is not None:
            entry["first_divergence"] = {"key": fd.key, "direction": fd.direction, "tensor": fd.tensor,
                                         "reason": fd.reason, "source": fd.source, "module": fd.module,
                                         "collectives_before": int(pos[p.rank][0]),
                                         "inside_collective": is_collective(fd.key)}
        ranks.append(entry)
    diverged = [p for p in pairs if p.first_divergence is not None]
    first: List[str] = []
    if diverged:
        best = min(pos[p.rank][0] for p in diverged)
        first = [p.rank for p in diverged if pos[p.rank][0] == best]
    links = _links(pairs, pos)
    return {"step": step, "ranks": ranks, "diverged_first": first, "collectives": links,
            "explanation": _explain(pairs, first, links, pos)}


def _links(pairs: List[PairResult], pos: Dict[str, Tuple[float, int]]) -> List[Dict[str, Any]]:
    """Each collective whose inputs differ on some ranks: where, and which other ranks first
    diverge after joining it (they received the difference through it)."""
    per_rank = {p.rank: _collective_rows(p) for p in pairs}
    index = {p.rank: {k: i for i, k in (p.timeline or {}).get("collectives", [])} for p in pairs}
    keys: List[str] = []
    for p in pairs:
        for k in per_rank[p.rank]:
            if k not in keys:
                keys.append(k)
    keys.sort(key=lambda k: min((index[r].get(k, 1 << 30) for r in index), default=0))
    links = []
    for k in keys:
        verdicts = {r: per_rank[r].get(k) for r in per_rank}
        differ = [r for r, v in verdicts.items() if v and v["input"] == ERROR]
        absent = [r for r, v in verdicts.items() if v is None]
        link: Dict[str, Any] = {"key": k, "api": without_direction(k), "ranks": verdicts,
                                "inputs_differ_on": differ, "missing_on": absent, "reached": []}
        if differ:
            n_before = _collective_number(k, pairs)
            for p in pairs:
                fd = p.first_divergence
                if p.rank in differ or fd is None or verdicts.get(p.rank) is None:
                    continue
                if pos[p.rank][0] >= n_before + 0.5 and not _claimed(links, p.rank):
                    link["reached"].append(p.rank)
        if differ or absent or any(v and v["output"] == ERROR for v in verdicts.values()):
            links.append(link)
    return links


def _collective_number(key: str, pairs: List[PairResult]) -> int:
    """How many collectives precede `key` on the ranks (its position among them)."""
    for p in pairs:
        colls = sorted((p.timeline or {}).get("collectives") or [])
        for n, (_, k) in enumerate(colls):
            if k == key:
                return n
    return 0


def _claimed(links: List[Dict[str, Any]], rank: str) -> bool:
    return any(rank in link["reached"] for link in links)


def _explain(pairs: List[PairResult], first: List[str], links: List[Dict[str, Any]],
             pos: Dict[str, Tuple[float, int]]) -> str:
    if not first:
        return "no rank diverged"
    fd = {p.rank: p.first_divergence for p in pairs}
    head = ", ".join(first)
    where = fd[first[0]]
    n = int(pos[first[0]][0])
    when = "before any collective" if n == 0 and not is_collective(where.key) else \
        f"after {n} collective(s)" + (" (inside one)" if is_collective(where.key) else "")
    text = [f"{head} diverged first: {where.key} ({when})"]
    for link in links:
        if link["inputs_differ_on"] and link["reached"]:
            text.append(f"{link['key']}: inputs differ on {', '.join(link['inputs_differ_on'])}; it reached "
                        f"{', '.join(link['reached'])} (first divergence after this collective)")
    independent = [p.rank for p in pairs if fd[p.rank] is not None and p.rank not in first
                   and not _claimed(links, p.rank)]
    if independent:
        text.append(f"{', '.join(independent)} diverged later, not through a collective whose inputs differ")
    return "; ".join(text)

