"""The model tree of report.html: the module hierarchy of one step/rank (construct.json) with
every recorded call placed under its module, each node carrying the worst verdict and the
worst error of everything below it, and the first divergence marked.

A compact list is what the page receives: ``[label, parent, kind, verdict, error, failing,
key, target_key, target_label, fold, bar]`` per node, parents before children; nodes 0.. are
the direction roots (forward, backward, other). Golden and target sit on one line: the target
column names the call paired with the golden one. A call only the target runs (MindSpore's
Shape/Reshape) hangs under the golden module its target module is paired with (the target's
construct.json). A merged call group (``A+B+C``) sits where its first call does, labelled by
its op names. ``fold`` marks calls the page folds away by default: layout-only calls (shape,
reshape, view, cast ...) and calls one side runs alone. ``bar`` counts the values below a node
by verdict ``[pass, warning, error]``. Without construct.json (level L1, or a result whose
dumps are gone) the module nodes still nest by their paths and calls sit under their
direction's root.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from ...dumpfmt import BACKWARD, FORWARD, OTHER, parse_key, read_construct
from ...verdicts import ERROR, PASS, WARNING, worse
from ..align.dataflow import op_name
from ..model import PairResult, Row
from ..ops import CAST_OPS, QUERY_OPS, VIEW_OPS

LAYOUT_OPS = QUERY_OPS | VIEW_OPS | CAST_OPS     # change no value: folded away in the tree
_BAR = {PASS: 0, WARNING: 1, ERROR: 2}

_ROOTS = (FORWARD, BACKWARD, OTHER)


def _construct_at(path: Optional[str]) -> Dict[str, Optional[str]]:
    folder = os.path.dirname(path) if path else ""
    return read_construct(folder) if folder and os.path.isdir(folder) else {}


def construct_of(pair: PairResult) -> Dict[str, Optional[str]]:
    """construct.json of the pair's golden dump, else of its target dump; {} when neither is there."""
    return _construct_at(pair.golden) or _construct_at(pair.target)


def _label(key: str) -> str:
    if "+" in key:
        return group_label(key)
    info = parse_key(key)
    if info.kind in ("module", "parameters_grad"):
        path = info.module_path or info.name
        what = "parameters_grad" if info.kind == "parameters_grad" else info.class_name
        return f"{path} ({what})" + (f" #{info.counter}" if info.counter else "")
    return key.rsplit(".", 1)[0] if info.kind == "api" else key


def group_label(key: str) -> str:
    """A merged call group ``Functional.linear.0.forward+...`` named by its ops: ``MatMul + BiasAdd``,
    ``view + transpose + ... (8 calls)``: the full key is the node's title."""
    parts = key.split("+")
    names = [_op_label(p) for p in parts]
    if len(names) <= 3:
        return " + ".join(names)
    return " + ".join(names[:2]) + f" + ... ({len(names)} calls)"


def _op_label(key: str) -> str:
    info = parse_key(key)
    if info.kind != "api":
        return info.class_name or key
    return info.class_name if info.prefix == "Primitive" and info.class_name else info.api_name


def layout_only(key: Optional[str]) -> bool:
    """A call that changes no value (shape, reshape, view, cast ...; every call of a group)."""
    if not key:
        return False
    return all(parse_key(k).kind == "api" and op_name(k) in LAYOUT_OPS for k in key.split("+"))


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
               max_nodes: int = MAX_NODES, target_construct: Optional[Dict[str, Optional[str]]] = None
               ) -> Dict[str, Any]:
    construct = construct_of(pair) if construct is None else construct
    tconstruct = _construct_at(pair.target) if target_construct is None else target_construct
    rows_by_key: Dict[str, List[Row]] = {}
    order: List[str] = []
    to_golden: Dict[str, str] = {}          # target key (and each member of a group) -> golden key
    for r in pair.rows:
        key = r.golden_key or r.target_key
        if key is None:
            continue
        if key not in rows_by_key:
            rows_by_key[key] = []
            order.append(key)
        rows_by_key[key].append(r)
        if r.golden_key and r.target_key:
            for t in [r.target_key, *r.target_key.split("+")]:
                to_golden.setdefault(t, r.golden_key)
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
        if "+" in k:                            # a merged group sits where its first call does
            return parent_of(k.split("+")[0])
        if k in construct:
            return construct[k]
        if k in tconstruct:                     # a call only the target runs: under the paired module
            parent = tconstruct[k]
            return to_golden.get(parent, parent) if parent else None
        info = parse_key(k)
        if info.kind == "parameters_grad":
            back = f"{info.name}.{BACKWARD}.{info.counter}"
            return back if back in rows_by_key or back in construct else None
        return _module_parent_by_path(k, by_path) if info.kind == "module" else None

    # parents before children: place each key after its chain of parents
    index: Dict[str, int] = {}
    nodes: List[List[Any]] = [[d, -1, "root", PASS, None, 0, "", None, "", 0, [0, 0, 0]] for d in _ROOTS]

    def place(k: str, depth: int = 0) -> int:
        if k in index:
            return index[k]
        parent = parent_of(k)
        if parent == k or depth > 200:          # a malformed construct.json: no cycles
            parent = None
        p = place(parent, depth + 1) if parent else _ROOTS.index(_direction(k))
        rows = rows_by_key.get(k, [])
        tkey = next((r.target_key for r in rows if r.target_key), None)
        golden = any(r.golden_key for r in rows) or not rows
        kind = parse_key(k.split("+")[0]).kind
        one_sided = bool(rows) and all(r.golden_key is None or r.target_key is None for r in rows)
        fold = int(kind == "api" and (layout_only(k) or one_sided))
        nodes.append([_label(k) if golden else "", p, kind, PASS, None, 0, k, tkey,
                      _label(tkey) if tkey else "", fold, [0, 0, 0]])
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
            nodes[i][10][_BAR.get(r.verdict, 1)] += 1
    for i in range(len(nodes) - 1, len(_ROOTS) - 1, -1):
        p = nodes[i][1]
        nodes[p][3] = worse(nodes[p][3], nodes[i][3])
        if nodes[i][4] is not None and (nodes[p][4] is None or nodes[i][4] > nodes[p][4]):
            nodes[p][4] = nodes[i][4]
        nodes[p][5] += nodes[i][5]
        nodes[p][10] = [a + b for a, b in zip(nodes[p][10], nodes[i][10])]
    fd = pair.first_divergence
    first = index.get(fd.key) if fd else None
    if first is None and fd and fd.golden_key:
        first = index.get(fd.golden_key)
    if first is not None:
        nodes[first][9] = 0                     # the first divergence is never folded away
    nodes, first, hidden = _prune(nodes, first, max_nodes)
    roots = sorted({i for i in range(len(_ROOTS)) if any(n[1] == i for n in nodes)})
    return {"nodes": nodes, "roots": roots, "first": first, "hidden": hidden,
            "label": "/".join(x for x in (f"step{pair.step}" if pair.step is not None else "", pair.rank) if x)
            or "dump"}


def _direction(key: str) -> str:
    d = parse_key(key.split("+")[0]).direction
    return d if d in _ROOTS else OTHER


def trees(pairs: List[PairResult]) -> List[Dict[str, Any]]:
    """One tree per step/rank pair, in the result's order."""
    return [build_tree(p) for p in pairs]
