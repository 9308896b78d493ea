"""Compare an N-rank run with an M-rank run of another parallel layout (DDP on 2 ranks against
TP on 2, FSDP2 against TP, DDP on 2 against DDP on 4 or a 2-D mesh on 4).

Both dumps are reduced to the *global* view, the values a single device would have computed
(layouts.py's rank views: DTensors merged from their placements, batch or column tiles merged,
split-batch gradients scaled to the whole batch), and the views are compared with each other.
Which global shape a plain value stands for is not recorded on either side: each side lists
the shapes its ranks' values can make (the rank's own, a concatenation along one dimension,
a grid over the recorded sub-meshes), and the first one of the golden side's list that the
target side can make too is used for both. A value whose sides agree on no shape stays each
rank's own (compare then reports a shape difference, never a silent pass).

Every rank of each side is compared at least once (pairs ``k % N`` with ``k % M``); a
divergence on a value that is a rank's own is laid at the rank whose copy parts from the
other ranks of its side.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...dumpfmt import DTENSOR, DumpUnit, is_tensor_summary, parse_key, rank_number
from ...dumpfmt.shards import submesh_groups
from ..errors import DumpFormatError
from . import layouts, shard_tensors
from .layouts import SPLIT, Layout
from .tiles import at as _at, concat_shape as _concat_shape, leaves as _leaves, set_at as _set

GLOBAL = "global"


def _by_step(units: List[DumpUnit]) -> Dict[Optional[int], List[DumpUnit]]:
    out: Dict[Optional[int], List[DumpUnit]] = {}
    for u in units:
        out.setdefault(u.step, []).append(u)
    for us in out.values():
        us.sort(key=lambda u: rank_number(u.rank) if rank_number(u.rank) is not None else -1)
    return out


def applies(golden: List[DumpUnit], target: List[DumpUnit]) -> bool:
    """Several numbered ranks on both sides in every step they share."""
    g, t = _by_step(golden), _by_step(target)
    common = set(g) & set(t)
    return bool(common) and all(len(g[s]) > 1 and len(t[s]) > 1 and all(
        rank_number(u.rank) is not None for u in g[s] + t[s]) for s in common)


_PLACED = re.compile(r'"placements":\s*(\[[^\]]*\]),\s*"mesh_shape":\s*(\[[^\]]*\])')
_SHAPE = re.compile(r'"shape":\s*(\[[^\]]*\])')


def _signature(unit: DumpUnit) -> Tuple:
    """What tells two parallel layouts apart, read from rank 0's raw text without parsing it:
    the DTensor placements and meshes, and the first recorded shape (the batch as a rank sees it)."""
    try:
        text = unit.json_path.read_text()
    except OSError as e:
        raise DumpFormatError(f"{unit.json_path}: cannot be read ({e})") from None
    first = _SHAPE.search(text)
    return (first.group(1).replace(" ", "") if first else None,
            frozenset((p.replace(" ", ""), m.replace(" ", "")) for p, m in _PLACED.findall(text)))


def differ(golden: List[DumpUnit], target: List[DumpUnit]) -> bool:
    """Do the two many-rank runs use different layouts (rank counts, placements, per-rank batch)?
    Runs of one layout are compared rank by rank as before."""
    g, t = _by_step(golden), _by_step(target)
    common = sorted(set(g) & set(t), key=lambda s: (s is None, s or 0))
    if not common:
        return False
    try:
        if _signature(g[common[0]][0]) != _signature(t[common[0]][0]):
            return True
    except DumpFormatError:
        return False            # an unreadable rank: compared rank by rank, where it is reported
    # One layout with ranks missing on one side (a lost or corrupt rank folder) is compared rank by
    # rank and the rest listed unpaired; rank sets that are not nested are different layouts.
    return any(not (_ranks(g[s]) <= _ranks(t[s]) or _ranks(t[s]) <= _ranks(g[s])) for s in common)


def _ranks(units: List[DumpUnit]) -> set:
    return {rank_number(u.rank) for u in units}


# ---------------------------------------------------------------- the global shape of a value

def _concats(shapes: List[Any]) -> List[list]:
    ndim = len(shapes[0]) if isinstance(shapes[0], list) else -1
    out = []
    for d in range(max(ndim, 0)):
        s = _concat_shape(shapes, d, ndim)
        if s is not None and s not in out:
            out.append(s)
    return out


def _group_signature(members: List[dict]) -> Tuple:
    """What one sub-mesh group of a DTensor holds: its shards' coordinates and local statistics."""
    return tuple(sorted((tuple(m[DTENSOR].get("coordinate") or ()),
                         tuple(sorted((m[DTENSOR].get("local") or {}).items()))) for m in members))


def candidates(leaves: List[Any], backward: bool, partitions: List[List[List[int]]]) -> List[list]:
    """The global shapes one side's per-rank values can stand for, most likely first."""
    if not leaves or any(not is_tensor_summary(x) for x in leaves):
        return []
    own = leaves[0].get("shape")
    if all(DTENSOR in x for x in leaves):
        groups = submesh_groups(leaves)
        if groups is None:
            return [list(leaves[0][DTENSOR]["global_shape"])]
        parts = [list(leaves[g[0]][DTENSOR]["global_shape"]) for g in groups]
        joined = [s for s in _concats(parts) if s != parts[0]]
        if backward or len({_group_signature([leaves[i] for i in g]) for g in groups}) == 1:
            return [parts[0]] + joined       # the groups hold copies (or a gradient to average)
        return joined + [parts[0]]           # the groups hold different batches: their tiles
    shapes = [x.get("shape") for x in leaves]
    identical = all(layouts._same(x, leaves[0]) for x in leaves)
    out: List[list] = []
    if identical or own == [] or (backward and all(s == own for s in shapes)):     # [] : a loss, averaged
        out.append(own)
    if not identical:
        out.extend(s for s in _concats(shapes) if s not in out)
        n = len(leaves)
        blocks = [[list(range(g * k, (g + 1) * k)) for g in range(n // k)] for k in range(2, n) if not n % k]
        for partition in list(partitions) + blocks:
            for inner in range(len(own) if isinstance(own, list) else 0):
                per_group = [_concat_shape([shapes[i] for i in g], inner, len(own)) for g in partition]
                if all(p is not None for p in per_group):
                    out.extend(s for s in _concats(per_group) if s not in out)
            per_group = [shapes[g[0]] for g in partition
                         if all(layouts._same(leaves[i], leaves[g[0]]) for i in g)]
            if len(per_group) == len(partition):
                out.extend(s for s in _concats(per_group) if s not in out)
    return out


def reference(a: List[Dict[str, Any]], b: List[Dict[str, Any]], pa: List, pb: List) -> Dict[str, Any]:
    """Per record of the golden side, the global shape of each tensor value that both sides
    agree on (``{"shape": ...}`` leaves, None where they agree on none): the single run's
    shapes, as build_view reads them."""
    ref: Dict[str, Any] = {}
    for key, rec in a[0].items():
        if key not in b[0]:
            continue
        backward = parse_key(key).direction == "backward"
        new = json.loads(json.dumps(rec))
        for path, _ in _leaves(rec):
            ca = candidates([_at(d.get(key), path) for d in a], backward, pa)
            cb = candidates([_at(d.get(key), path) for d in b], backward, pb)
            shape = next((s for s in ca if s in cb), None)
            _set(new, path, None if shape is None else {"shape": shape})
        ref[key] = new
    return ref


# ---------------------------------------------------------------- the plan

def plan(golden: List[DumpUnit], target: List[DumpUnit], work_dir: Path, rank_map: Optional[str] = None) -> Layout:
    """Write both sides' global views (one per rank) under `work_dir` and pair them."""
    forced = None
    if rank_map and rank_map not in ("auto", GLOBAL):
        forced, only = layouts.parse_rank_map(rank_map)
        if only is not None:
            raise DumpFormatError(f"--rank-map {rank_map}: rank lists select ranks of a 1-rank against N-rank "
                                  "compare; for N ranks against M use same, split or global")
    g_steps, t_steps = _by_step(golden), _by_step(target)
    pairs: List[Tuple[DumpUnit, DumpUnit]] = []
    labels: List[str] = []
    counts: Dict[str, int] = {}
    rules: Dict[str, set] = {"golden": set(), "target": set()}
    shard_text: Dict[str, set] = {"golden": set(), "target": set()}
    for step in sorted(set(g_steps) & set(t_steps), key=lambda s: (s is None, s or 0)):
        sides = {}
        docs = {"golden": [layouts.load_view(u.json_path) for u in g_steps[step]],
                "target": [layouts.load_view(u.json_path) for u in t_steps[step]]}
        datas = {"golden": [layouts._strip_wrapper(d["data"], docs["target"][0]["data"]) for d in docs["golden"]],
                 "target": [layouts._strip_wrapper(d["data"], docs["golden"][0]["data"]) for d in docs["target"]]}
        parts = {side: layouts.job_partitions(ds) for side, ds in datas.items()}
        ref = reference(datas["golden"], datas["target"], parts["golden"], parts["target"])
        for side, units in (("golden", g_steps[step]), ("target", t_steps[step])):
            ds = datas[side]
            rule = forced or layouts.detect(ds)
            shards = layouts.data_shards(ds) if rule == SPLIT and not forced else len(ds)
            rules[side].add(rule)
            shard_text[side].add(shards)
            views = []
            tensors = shard_tensors.is_tensor_task(docs[side])
            dirs = [shard_tensors.tensor_dir(d, u.json_path) for d, u in zip(docs[side], units)]
            assembled: Dict[Tuple, Any] = {}
            for r, (u, doc) in enumerate(zip(units, docs[side])):
                view, c = layouts.build_view(ref, ds, r, rule, shards, parts[side])
                for k, v in c.items():
                    counts[k] = counts.get(k, 0) + v
                out = work_dir / side / (u.json_path.parent.parent.name if u.step is not None else "step") / u.rank
                if tensors:     # task tensor: merged values get their global tensor, assembled from the shards
                    made = shard_tensors.attach(view, ds, dirs, 1.0 / shards if rule == SPLIT else 1.0, out,
                                                assembled, [x.rank for x in units])
                    counts["global tensors assembled"] = counts.get("global tensors assembled", 0) + made
                views.append(layouts._write_view(doc, view, u, out))
            sides[side] = views
        gv, tv = sides["golden"], sides["target"]
        for k in range(max(len(gv), len(tv))):
            pairs.append((gv[k % len(gv)], tv[k % len(tv)]))
            labels.append(f"{gv[k % len(gv)].rank}/{tv[k % len(tv)].rank}")
    n_g, n_t = len({u.rank for u in golden}), len({u.rank for u in target})

    def says(side: str) -> str:
        rule = "/".join(sorted(rules[side]))
        scale = "/".join(map(str, sorted(shard_text[side])))
        return f"{rule}, backward scaled by 1/{scale}" if rule == SPLIT else rule
    why = "forced by --rank-map" if forced else "decided from each side's data"
    text = [f"layout: {n_g} ranks against {n_t}, both reduced to the global (single-run) view "
            f"(golden {says('golden')}; target {says('target')}; {why})",
            "  on each side sharded values (DTensor, tiles of the global shape) are merged across ranks, "
            "split-batch gradients scaled to the whole batch, replicated values kept per rank; pairs "
            "golden rank/target rank: " + ", ".join(dict.fromkeys(labels)),
            "  values: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))]
    rule = f"{'/'.join(sorted(rules['golden']))} against {'/'.join(sorted(rules['target']))}"
    return Layout(rule, pairs, text, counts, view_side=2, labels=labels,
                  replica_units=[("(golden) ", golden), ("(target) ", target)])

