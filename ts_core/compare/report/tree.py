"""The model tree of report.html: the module hierarchy of one step/rank (construct.json) with
every recorded call placed under its module, each node carrying the worst verdict and the
worst error of everything below it, and the first divergence marked.

A compact list is what the page receives: ``[label, parent, kind, verdict, error, failing,
key]`` per node, parents before children; nodes 0.. are the direction roots (forward,
backward, other). Without construct.json (level L1, or a result whose dumps are gone) the
module nodes still nest by their paths and calls sit under their direction's root.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from ...dumpfmt import BACKWARD, FORWARD, OTHER, parse_key, read_construct
from ...verdicts import PASS, worse
from ..model import PairResult, Row

_ROOTS = (FORWARD, BACKWARD, OTHER)


def construct_of(pair: PairResult) -> Dict[str, Optional[str]]:
    """construct.json of the pair's golden dump, else of its target dump; {} when neither is there."""
    for path in (pair.golden, pair.target):
        folder = os.path.dirname(path) if path else ""
        if folder and os.path.isdir(folder):
            c = read_construct(folder)
            if c:
                return c
    return {}


def _label(key: str) -> str:
    info = parse_key(key)
    if info.kind in ("module", "parameters_grad"):
        path = info.module_path or info.name
        what = "parameters_grad" if info.kind == "parameters_grad" else info.class_name
        return f"{path} ({what})" + (f" #{info.counter}" if info.counter else "")
    return key.rsplit(".", 1)[0] if info.kind == "api" else key


def _module_parent_by_path(key: str, module_keys: Dict[str, str]) -> Optional[str]:
    """Without construct.json: the module whose path is the longest proper prefix of this one's."""
    info = parse_key(key)
    parts = info.module_path.split(".") if info.module_path else []
    for n in range(len(parts) - 1, 0, -1):
        parent = module_keys.get((".".join(parts[:n]), info.direction, info.counter or 0))
        if parent:
            return parent
    return None


MAX_NODES = 30000     # per step/rank; above, passing API calls are left out of the page


def _prune(nodes: List[List[Any]], first: Optional[int], max_nodes: int):
    """A browser-sized tree: every module, every call that does not pass, the first divergence
    and their ancestors; passing API calls go when there are more than `max_nodes` nodes."""
    if len(nodes) <= max_nodes:
        return nodes, first, 0
    keep = set(range(len(_ROOTS)))
    for i, n in enumerate(nodes):
        if n[2] != "api" or n[3] != PASS or i == first:
            while i >= 0 and i not in keep:
                keep.add(i)
                i = nodes[i][1]
    new = {old: k for k, old in enumerate(sorted(keep))}
    pruned = [[n[0], new.get(n[1], -1), *n[2:]] for i, n in enumerate(nodes) if i in keep]
    return pruned, new.get(first) if first is not None else None, len(nodes) - len(pruned)


def build_tree(pair: PairResult, construct: Optional[Dict[str, Optional[str]]] = None,
               max_nodes: int = MAX_NODES) -> Dict[str, Any]:
    construct = construct_of(pair) if construct is None else construct
    rows_by_key: Dict[str, List[Row]] = {}
    order: List[str] = []
    for r in pair.rows:
        key = r.golden_key or r.target_key
        if key is None:
            continue
        if key not in rows_by_key:
            rows_by_key[key] = []
            order.append(key)
        rows_by_key[key].append(r)
    keys = list(order) + [k for k in construct if k not in rows_by_key]
    for k, parent in list(construct.items()):
        if parent and parent not in rows_by_key and parent not in keys:
            keys.append(parent)
    by_path = {}
    for k in keys:
        info = parse_key(k)
        if info.kind == "module":
            by_path.setdefault((info.module_path, info.direction, info.counter or 0), k)

    def parent_of(k: str) -> Optional[str]:
        if k in construct:
            return construct[k]
        info = parse_key(k)
        if info.kind == "parameters_grad":
            back = f"{info.name}.{BACKWARD}.{info.counter}"
            return back if back in rows_by_key or back in construct else None
        return _module_parent_by_path(k, by_path) if info.kind == "module" else None

    # parents before children: place each key after its chain of parents
    index: Dict[str, int] = {}
    nodes: List[List[Any]] = [[d, -1, "root", PASS, None, 0, ""] for d in _ROOTS]

    def place(k: str, depth: int = 0) -> int:
        if k in index:
            return index[k]
        parent = parent_of(k)
        if parent == k or depth > 200:          # a malformed construct.json: no cycles
            parent = None
        p = place(parent, depth + 1) if parent else _ROOTS.index(_direction(k))
        kind = parse_key(k).kind
        nodes.append([_label(k), p, kind, PASS, None, 0, k])
        index[k] = len(nodes) - 1
        return index[k]

    for k in keys:
        place(k)
    # own verdicts and errors, then folded up to every ancestor
    for k, i in index.items():
        rows = rows_by_key.get(k, [])
        for r in rows:
            nodes[i][3] = worse(nodes[i][3], r.verdict)
            e = r.error_measure
            if e is not None and (nodes[i][4] is None or e > nodes[i][4]):
                nodes[i][4] = e
            nodes[i][5] += r.verdict != PASS
    for i in range(len(nodes) - 1, len(_ROOTS) - 1, -1):
        p = nodes[i][1]
        nodes[p][3] = worse(nodes[p][3], nodes[i][3])
        if nodes[i][4] is not None and (nodes[p][4] is None or nodes[i][4] > nodes[p][4]):
            nodes[p][4] = nodes[i][4]
        nodes[p][5] += nodes[i][5]
    fd = pair.first_divergence
    first = index.get(fd.key) if fd else None
    nodes, first, hidden = _prune(nodes, first, max_nodes)
    roots = sorted({i for i in range(len(_ROOTS)) if any(n[1] == i for n in nodes)})
    return {"nodes": nodes, "roots": roots, "first": first, "hidden": hidden,
            "label": "/".join(x for x in (f"step{pair.step}" if pair.step is not None else "", pair.rank) if x)
            or "dump"}


def _direction(key: str) -> str:
    d = parse_key(key).direction
    return d if d in _ROOTS else OTHER


def trees(pairs: List[PairResult]) -> List[Dict[str, Any]]:
    """One tree per step/rank pair, in the result's order."""
    return [build_tree(p) for p in pairs]
