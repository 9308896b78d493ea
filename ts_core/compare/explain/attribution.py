"""Which rank a layout compare's first divergence belongs to, per step: a 1-rank run against its
N-rank twin (``align/layouts.py``) or N ranks against M (``align/global_views.py``).

One walk for both: per step, each pair's first divergence and its failing values; the
earliest is named. A value that is a rank's own (not merged across ranks) names that rank; a
value merged across ranks names the rank whose shard differs where a task tensor dump has the
shards (``align/shard_tensors.py``), else says the rank is not known from statistics. The two
layouts differ only in how a rank is read off the views: the view side's own rows (one view per
target rank) or the ranks of a side whose copies part from the others (global views).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ...dumpfmt import STAT_FIELDS, rank_number
from ...verdicts import ERROR
from ..align import shard_tensors
from ..align.layouts import load_view
from ..align.tiles import MERGED, entry_leaf
from ..errors import DumpFormatError

Found = Tuple[Any, Any, list]       # (pair, its first divergence, its failing values of that call)


def attribute(result: Any, layout: Any) -> List[str]:
    """Lines naming, per step, the first divergence and the rank it belongs to (``layout``: the
    ``Layout`` the compare ran through; with ``labels``, N ranks against M)."""
    if layout.labels:
        name, quiet = _global_named(layout), "rank pair (differences within the tolerances, i.e. the " \
                                             "reduction-order noise of different parallel layouts)"
    else:
        name, quiet = _view_named(layout.view_side), "rank (differences within the tolerances, i.e. the " \
                                                     "reduction-order noise of a different parallel layout)"
    lines = []
    steps: Dict[Any, list] = {}
    for p in result.pairs:
        steps.setdefault(p.step, []).append(p)
    for step, pairs in sorted(steps.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        label = "" if step is None else f"step {step}: "
        found: List[Found] = []
        for p in pairs:
            fd = p.first_divergence
            if fd is not None:
                found.append((p, fd, [r for r in p.rows if r.verdict == ERROR
                                      and (r.golden_key == fd.key or r.target_key == fd.target_key)]))
        lines.append(label + (name(step, pairs, found) if found else f"no divergence on any {quiet}"))
    return lines


def _order(bad: list) -> int:
    return min((r.order for r in bad), default=1 << 30)


# ---------------------------------------------------------------- 1 rank against N: one view per rank

def _view_named(view_side: int) -> Callable[[Any, list, List[Found]], str]:
    def name(step, pairs: list, found: List[Found]) -> str:
        ranked = []
        for p, fd, bad in found:
            bad = [row for row in bad if row.target_key or row.golden_key]
            view = p.target if view_side else p.golden
            vkey = (lambda row: row.target_key or fd.key) if view_side else (lambda row: row.golden_key or fd.key)
            own = [row for row in bad if not _merged_row(view, vkey(row), row.arg)]
            ranked.append((0 if own else 1, _order(bad), p.rank, fd, own[0].name if own else None))
        ranked.sort(key=lambda x: (x[1], x[0]))
        first = ranked[0]
        alike = [f[2] for f in ranked if f[0] == 0 and f[1] == first[1] and f[3].key == first[3].key]
        if first[0] == 0 and len(alike) > 1:        # every such rank's own copy differs: no one rank to blame
            return (f"first divergence {first[3].key} on {', '.join(alike)} ({first[4]}, each rank's own "
                    "value, differs on each of them)")
        if first[0] == 0:
            return f"first divergence {first[3].key} on {first[2]} ({first[4]}, that rank's own value)"
        fd = first[3]
        rows = [r for p in pairs for r in p.rows if r.verdict == ERROR
                and (r.golden_key == fd.key or (r.target_key and r.target_key == fd.target_key))]
        named = _tensor_named([p for p in pairs if p.first_divergence is not None], fd, view_side, rows)
        if named:
            return f"first divergence {fd.key} on a value merged across ranks, on {named}"
        return (f"first divergence {fd.key} on a value merged across ranks: the rank is not known from "
                f"statistics ({', '.join(sorted({f[2] for f in ranked}))} see it); a task tensor dump names "
                "the rank whose shard differs")
    return name


def _merged_row(view_path: str, key: str, arg: str) -> bool:
    try:
        data = load_view(Path(view_path))["data"]
    except DumpFormatError:
        return False
    leaf = entry_leaf(data, key, arg)
    return bool(leaf) and leaf.get("layout") == MERGED


def _tensor_named(pairs: list, fd: Any, view_side: int, rows: list) -> Optional[str]:
    """Task tensor: the ranks whose shard of a failing merged value differs from the other run's
    global tensor in their region (shard_tensors.bad_regions), in words; None when that cannot be
    told (statistics only, or a value without regions)."""
    docs: Dict[str, dict] = {}

    def doc(path: str) -> dict:
        if path not in docs:
            docs[path] = load_view(Path(path))
        return docs[path]
    for p in pairs:
        view, other = (p.target, p.golden) if view_side else (p.golden, p.target)
        for row in sorted(rows, key=lambda r: r.order):
            vkey, okey = (row.target_key, row.golden_key) if view_side else (row.golden_key, row.target_key)
            leaf = entry_leaf(doc(view)["data"], vkey or fd.key, row.arg)
            ref = entry_leaf(doc(other)["data"], okey or fd.key, row.arg)
            bad = shard_tensors.name_shards(leaf, ref, Path(other).parent / "dump_tensor_data",
                                            doc(other).get("dump_data_dir"))
            if bad:
                return shard_tensors.shards_text(bad, row.name)
    return None


# ---------------------------------------------------------------- N ranks against M: global views

def _global_named(layout: Any) -> Callable[[Any, list, List[Found]], str]:
    cache: Dict[str, Any] = {}

    def name(step, pairs: list, found: List[Found]) -> str:
        first = min(_order(bad) for _, _, bad in found)
        p, fd, _ = next(f for f in found if _order(f[2]) == first)
        bad = sorted((r for f in found if f[1].key == fd.key for r in f[2]), key=lambda r: r.order)  # every pair's
        named = []
        for row in bad:
            for side, idx, key in (("golden", 0, row.golden_key), ("target", 1, row.target_key)):
                views = {u[idx].rank: str(u[idx].json_path) for u in layout.pairs if u[idx].step == step}
                leaves = {r: _leaf(cache, v, key, row.arg) for r, v in views.items()}
                if any(x is None or x.get("layout") == MERGED for x in leaves.values()):
                    continue
                odd = _odd_ranks(leaves)
                if odd:         # the side's copies differ: the ranks met only in pairs where this value fails
                    fails = {q.rank.split("/")[idx] for q in pairs
                             if any(r.name == row.name and r.verdict == ERROR for r in q.rows)}
                    passes = {q.rank.split("/")[idx] for q in pairs} - fails
                    odd = sorted(fails - passes, key=lambda x: rank_number(x) or 0) or odd
                if odd:
                    named.append(f"{side} {', '.join(odd)} ({row.name}, that rank's own value, differs from "
                                 f"the other {side} ranks')")
            if named:
                return f"first divergence {fd.key} on {named[0]}"
        for row in bad:       # task tensor: the shard that differs
            for view, other, vkey, okey, side in ((p.target, p.golden, row.target_key, row.golden_key, "target"),
                                                  (p.golden, p.target, row.golden_key, row.target_key, "golden")):
                shards = shard_tensors.name_shards(
                    _leaf(cache, view, vkey, row.arg), _leaf(cache, other, okey, row.arg),
                    Path(other).parent / "dump_tensor_data", cache[other].get("dump_data_dir"))
                if shards:
                    return (f"first divergence {fd.key} on a value merged across ranks, on {side} "
                            + shard_tensors.shards_text(shards, row.name))
        return (f"first divergence {fd.key} (pair {p.rank}): on a value merged across ranks or alike on every "
                "rank of a side: the rank is not known from statistics; a task tensor dump names the rank whose "
                "shard differs")
    return name


def _leaf(cache: Dict[str, Any], view_path: str, key: Optional[str], arg: str) -> Optional[dict]:
    if view_path not in cache:
        cache[view_path] = load_view(Path(view_path))
    return entry_leaf(cache[view_path]["data"], key, arg)


def _odd_ranks(leaves: Dict[str, Optional[dict]]) -> List[str]:
    """The ranks whose copy parts from the most common one (none when all agree; every rank
    when no copy is the most common)."""
    versions: Dict[Tuple, List[str]] = {}
    for rank, leaf in leaves.items():
        if leaf is None:
            continue
        sig = (tuple(leaf.get("shape") or ()),) + tuple(leaf.get(k) for k in STAT_FIELDS)
        versions.setdefault(sig, []).append(rank)
    if len(versions) < 2:
        return []
    ordered = sorted(versions.values(), key=len, reverse=True)
    if len(ordered[0]) == len(ordered[1]):
        return [r for v in ordered for r in v]       # no majority: every rank is named
    return [r for v in ordered[1:] for r in v]
