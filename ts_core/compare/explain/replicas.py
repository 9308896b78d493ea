"""Replica consistency in one many-rank dump (``tsprobe check-replicas DUMP``).

Some values must be the same on every rank whatever the data: a DTensor along the mesh
dimensions where it is ``Replicate()`` (its local statistics equal on the coordinates that differ
only there), a plain parameter as a module uses it (DDP and TP keep replicas; FSDP2 gathers the
whole parameter), and a plain ``parameters_grad`` (reduced across ranks by DDP before the
optimizer reads it). Their recorded statistics are compared across ranks, exactly by default:
replicas are bitwise copies. The first record (in each rank's dump order) where a rank's copy
differs is reported with the ranks that hold each version.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from ...dumpfmt import DTENSOR, STAT_FIELDS, find_dumps, parse_key, rank_number, record_entries
from ...dumpfmt.shards import submesh_groups
from ..errors import DumpFormatError



def _signature(leaf: dict) -> Tuple:
    return (tuple(leaf.get("shape") or ()),) + tuple(leaf.get(k) for k in STAT_FIELDS)


def _replica_group(leaf: dict, rank: int) -> Optional[Tuple]:
    """The ranks holding this value as copies of each other share the returned key; None when
    the value need not be replicated."""
    block = leaf.get(DTENSOR)
    if block is None:
        return ("plain",)
    coord, placements = block.get("coordinate") or [], block.get("placements") or []
    if not any(p.startswith("Replicate") for p in placements):
        return None
    return tuple(c if not p.startswith("Replicate") else "*" for c, p in zip(coord, placements))


def _must_match(key: str, role: str, leaf: dict) -> bool:
    info = parse_key(key)
    if DTENSOR in leaf:
        return True
    return info.kind == "parameters_grad" or (role == "parameter" and info.direction == "forward")


def _close(a: Tuple, b: Tuple, rtol: float) -> bool:
    if a[0] != b[0]:
        return False
    for x, y in zip(a[1:], b[1:]):
        if x == y:
            continue
        if not (isinstance(x, (int, float)) and isinstance(y, (int, float))) or not rtol:
            return False
        if abs(x - y) > rtol * max(abs(x), abs(y)):
            return False
    return True


def check_replicas(dump: str, rtol: float = 0.0) -> Dict[str, Any]:
    """``{"steps": [{"step", "ranks", "checked", "first": {...} or None, "mismatches": n}]}``."""
    return check_units(find_dumps(dump), rtol, where=str(dump))


def check_units(units: list, rtol: float = 0.0, where: str = "the dump") -> Dict[str, Any]:
    """``check_replicas`` on already found step/rank units."""
    units = [u for u in units if rank_number(u.rank) is not None]
    by_step: Dict[Any, list] = {}
    for u in units:
        by_step.setdefault(u.step, []).append(u)
    if not by_step:
        raise DumpFormatError(f"{where}: no numbered rank folders (rank0, rank1, ...) to check")
    steps = []
    for step, us in sorted(by_step.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        us.sort(key=lambda u: rank_number(u.rank))
        datas = []
        for u in us:
            with open(u.json_path) as f:
                datas.append(json.load(f).get("data") or {})
        checked, mismatches, first = 0, 0, None
        for key, rec in datas[0].items():
            info = parse_key(key)
            per_rank = [record_entries(d.get(key), info.kind == "parameters_grad") for d in datas]
            for i, e in enumerate(per_rank[0]):
                if not e.is_tensor or not _must_match(key, e.role, e.leaf):
                    continue
                groups: Dict[Tuple, List[Tuple[str, Tuple]]] = {}
                others = [next((x for x in entries if x.arg == e.arg), None) for entries in per_rank]
                sub = None      # a DTensor on a sub-mesh (2-D job): replicas only within each sub-mesh group
                if all(o is not None and o.is_tensor and DTENSOR in o.leaf for o in others):
                    found = submesh_groups([o.leaf for o in others])
                    sub = None if found is None else {i: gi for gi, grp in enumerate(found) for i in grp}
                for idx, (u, other) in enumerate(zip(us, others)):
                    if other is None or not other.is_tensor:
                        continue
                    g = _replica_group(other.leaf, rank_number(u.rank))
                    if g is not None and sub is not None:
                        g = (sub[idx],) + g
                    if g is not None:
                        groups.setdefault(g, []).append((u.rank, _signature(other.leaf)))
                for members in groups.values():
                    if len(members) < 2:
                        continue
                    checked += 1
                    versions: List[Tuple[Tuple, List[str]]] = []
                    for rank, sig in members:
                        for v in versions:
                            if _close(v[0], sig, rtol):
                                v[1].append(rank)
                                break
                        else:
                            versions.append((sig, [rank]))
                    if len(versions) > 1:
                        mismatches += 1
                        if first is None:
                            versions.sort(key=lambda v: -len(v[1]))
                            first = {"key": key, "value": f"{key}.{e.arg}",
                                     "versions": [{"ranks": v[1], "Max": v[0][1], "Min": v[0][2], "Mean": v[0][3],
                                                   "Norm": v[0][4]} for v in versions]}
        steps.append({"step": step, "ranks": [u.rank for u in us], "checked": checked,
                      "mismatches": mismatches, "first": first})
    return {"steps": steps}


def replicas_text(report: Dict[str, Any]) -> str:
    lines = []
    for s in report["steps"]:
        label = "" if s["step"] is None else f"step {s['step']}: "
        if s["first"] is None:
            lines.append(f"{label}{s['checked']} replicated values checked on {len(s['ranks'])} ranks: all equal")
            continue
        f = s["first"]
        parts = "; ".join(f"{', '.join(v['ranks'])}: Max {v['Max']} Norm {v['Norm']}" for v in f["versions"])
        odd = f["versions"][-1]["ranks"] if len(f["versions"][0]["ranks"]) > len(f["versions"][-1]["ranks"]) else None
        who = f" ({', '.join(odd)} parted from the others)" if odd else ""
        lines.append(f"{label}{s['mismatches']} of {s['checked']} replicated values differ across ranks; first at "
                     f"{f['value']}{who}: {parts}")
    return "\n".join(lines)
