"""Step x rank x module: where and when the error shows, one cell per (step/rank, module).

The columns are the model's modules at the deepest level that still fits a screen: from the
forward root, every module is replaced by its child modules while the row stays within
`max_columns` (GPT-2: transformer + lm_head -> wte, wpe, drop, h.0 ... h.11, ln_f, lm_head).
A cell holds the worst verdict and error of that module (every call of it, by module path) in
one direction. report.html draws it and summary.json carries it when the dumps hold several
steps or ranks.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ...dumpfmt import parse_key
from ..judge.verdict import PASS, worse

MAX_COLUMNS = 40


def _module_path(node: List[Any]) -> Optional[str]:
    if node[2] != "module" or not node[6]:
        return None
    info = parse_key(node[6])
    return info.module_path or info.name


def columns(tree: Dict[str, Any], max_columns: int = MAX_COLUMNS) -> List[str]:
    """Module paths of one tree at the deepest level whose row fits `max_columns`."""
    nodes = tree["nodes"]
    kids: Dict[int, List[int]] = {}
    for i, n in enumerate(nodes):
        if n[2] == "module" and n[1] >= 0:
            kids.setdefault(n[1], []).append(i)
    frontier = kids.get(0, [])                  # node 0: the forward root
    while True:
        deeper = [c for i in frontier for c in (kids.get(i) or [i])]
        if deeper == frontier or len(_paths(nodes, deeper)) > max_columns:
            break
        frontier = deeper
    return _paths(nodes, frontier)


def _paths(nodes: List[List[Any]], idx: List[int]) -> List[str]:
    return list(dict.fromkeys(p for p in (_module_path(nodes[i]) for i in idx) if p))


def heatmap(trees: List[Dict[str, Any]], max_columns: int = MAX_COLUMNS) -> Optional[Dict[str, Any]]:
    """``{"columns", "units", "forward", "backward"}`` with cells ``[verdict, error]`` (None: the
    module was not recorded there); None for a single step/rank."""
    if len(trees) < 2:
        return None
    cols: List[str] = []
    for t in trees:
        cols += [c for c in columns(t, max_columns) if c not in cols]
    cols = cols[:max_columns]
    out: Dict[str, Any] = {"columns": cols, "units": [t["label"] for t in trees], "forward": [], "backward": []}
    for t in trees:
        cells: Dict[str, Dict[str, List[Any]]] = {"forward": {}, "backward": {}}
        for n in t["nodes"]:
            path = _module_path(n)
            if path is None:
                continue
            direction = parse_key(n[6]).direction
            # a column's cell covers the module and every module below it (h.1 holds h.1.attn)
            for c in cols:
                if direction in cells and (path == c or path.startswith(c + ".")):
                    cell = cells[direction].setdefault(c, [PASS, None])
                    cell[0] = worse(cell[0], n[3])
                    if n[4] is not None and (cell[1] is None or n[4] > cell[1]):
                        cell[1] = n[4]
        for d in ("forward", "backward"):
            out[d].append([cells[d].get(c) for c in cols])
    return out
