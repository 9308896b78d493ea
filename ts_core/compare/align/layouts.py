"""Compare a single-device run with its data- or tensor-parallel twin (1 rank against N).

The N-rank dump is turned into one *view* per rank, a dump.json written next to the compare
output, whose values are comparable with the single run's:

* a DTensor value (``dtensor`` block) is replaced by its global statistics merged across the
  mesh (``merge_shards``); a ``Partial`` one (a pending sum) keeps only what the shards
  determine, the Mean (the sum of the shards' sums over the global count);
* a plain value whose shape is a tile of the single run's (the ranks' shapes concatenated along
  one dimension give it: a batch shard under DDP/FSDP2, a column-parallel output under TP) is
  merged across ranks: counts and sums add (``sum = Mean*count``, ``sum_sq = Norm**2``), Max/Min
  combine;
* in a *split batch* layout (each rank saw its own part of the batch), a backward value is also
  scaled by 1/N: each rank's loss is the mean over its 1/N of the batch, so the gradients a rank
  computes before the all-reduce are N times the single run's; a backward value the single run
  has in the same shape (a local weight gradient before the all-reduce) is the ranks' average,
  of which only the Mean is known; a scalar (the loss) is the ranks' average;
* any other value is the rank's own (replicated values: parameters, reduced gradients; every
  value in a *same batch* layout), so a rank whose replica differs is named.

Which layout is in force is decided from the data (the first tensor input recorded on each rank:
equal on every rank means the ranks saw the same batch) unless ``--rank-map`` says; it is
printed. A merged value carries ``"layout": "merged"`` in its view, so a divergence found on
it is reported as belonging to no single rank.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...dumpfmt import DTENSOR, STAT_FIELDS, DumpUnit, is_tensor_summary, merge_shards, parse_key, rank_number
from ...dumpfmt.shards import submesh_groups
from ..errors import DumpFormatError
from . import shard_tensors
from .tiles import MERGED, at as _at, concat_shape as _concat_shape, leaves as _leaves, set_at as _set, \
    tile_dim as _tile_dim

SAME, SPLIT = "same-batch", "split-batch"
OWN = "own"


@dataclass
class Layout:
    """The pairs to compare (golden unit, view of one target rank) and the rule, in words."""

    rule: str
    pairs: List[Tuple[DumpUnit, DumpUnit]]
    text: List[str] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)
    view_side: int = 1          # which member of each pair is the view (0: golden, 1: target, 2: both)
    labels: List[str] = field(default_factory=list)     # each pair's rank label, when both are views
    # the many-rank dumps whose replicas the compare checks (explain/replicas.py): (label, units)
    replica_units: List[Tuple[str, List[DumpUnit]]] = field(default_factory=list)


def applies_either_way(golden: List[DumpUnit], target: List[DumpUnit]) -> bool:
    """A single run on one side, a many-rank one on the other."""
    return applies(golden, target) or applies(target, golden)


def applies(golden: List[DumpUnit], target: List[DumpUnit]) -> bool:
    """One rank on the golden side per step, several numbered ranks on the target side."""
    g_steps: Dict[Optional[int], int] = {}
    t_steps: Dict[Optional[int], List[DumpUnit]] = {}
    for u in golden:
        g_steps[u.step] = g_steps.get(u.step, 0) + 1
    for u in target:
        t_steps.setdefault(u.step, []).append(u)
    common = set(g_steps) & set(t_steps)
    return bool(common) and all(g_steps[s] == 1 and len(t_steps[s]) > 1
                                and all(rank_number(u.rank) is not None for u in t_steps[s]) for s in common)


def parse_rank_map(spec: Optional[str]) -> Tuple[Optional[str], Optional[List[int]]]:
    """``same``, ``split`` or the target ranks to compare, e.g. ``0,1`` (``same`` for those)."""
    if not spec or spec == "auto":
        return None, None
    if spec in ("same", "split"):
        return (SAME if spec == "same" else SPLIT), None
    if re.fullmatch(r"\d+(,\d+)*", spec):
        return SAME, [int(x) for x in spec.split(",")]
    raise DumpFormatError(f"--rank-map {spec!r}: expected same, split or target ranks like 0,1")


def plan(golden: List[DumpUnit], target: List[DumpUnit], work_dir: Path,
         rank_map: Optional[str] = None) -> Layout:
    """Write the views of the ranks of the many-rank side under `work_dir` and pair each with the
    single run (the single run may be the golden or the target side)."""
    forced, only = parse_rank_map(rank_map)
    reverse = not applies(golden, target) and applies(target, golden)
    single, many = (target, golden) if reverse else (golden, target)
    t_steps: Dict[Optional[int], List[DumpUnit]] = {}
    for u in many:
        t_steps.setdefault(u.step, []).append(u)
    pairs: List[Tuple[DumpUnit, DumpUnit]] = []
    rules, counts, text, n_shards = set(), {}, [], set()
    for g in single:
        units = sorted(t_steps.get(g.step, []), key=lambda u: rank_number(u.rank))
        if not units:
            continue
        g_data = load_view(g.json_path)["data"]
        t_docs = [load_view(u.json_path) for u in units]
        datas = [_strip_wrapper(d["data"], g_data) for d in t_docs]
        rule = forced or detect(datas)
        rules.add(rule)
        shards = data_shards(datas) if rule == SPLIT and not forced else len(datas)
        n_shards.add(shards)
        partitions = job_partitions(datas)
        tensors = shard_tensors.is_tensor_task(t_docs)
        dirs = [shard_tensors.tensor_dir(d, u.json_path) for d, u in zip(t_docs, units)]
        assembled: Dict[Tuple, Any] = {}
        for r, (u, doc) in enumerate(zip(units, t_docs)):
            if only is not None and rank_number(u.rank) not in only:
                continue
            view, c = build_view(g_data, datas, r, rule, shards, partitions)
            for k, v in c.items():
                counts[k] = counts.get(k, 0) + v
            out = work_dir / (u.json_path.parent.parent.name if u.step is not None else "step") / u.rank
            if tensors:         # task tensor: merged values get their global tensor, assembled from the shards
                n_t = shard_tensors.attach(view, datas, dirs, 1.0 / shards if rule == SPLIT else 1.0, out, assembled,
                                           [x.rank for x in units])
                counts["global tensors assembled"] = counts.get("global tensors assembled", 0) + n_t
            v_unit = _write_view(doc, view, u, out)
            pairs.append((v_unit, g) if reverse else (g, v_unit))
    rule = "/".join(sorted(rules)) or SAME
    n = len({u.rank for u in many})
    why = "forced by --rank-map" if forced else "decided from the data: the first tensor input " + \
        ("is equal on every rank" if rule == SAME else "differs across ranks")
    text.append(f"layout: {f'{n} ranks against 1' if reverse else f'1 rank against {n}'} ({rule}, {why})")
    if rule == SAME:
        text.append("  each rank is compared with the single run; sharded values (DTensor, tiles of the single "
                    "run's shape) are merged across ranks first")
    else:
        scale = "/".join(map(str, sorted(n_shards))) or n
        text.append(f"  the ranks' batch shards are merged (counts and sums add, Max/Min combine); backward "
                    f"values scaled by 1/{scale} (each rank's loss averages its own shard); replicated values "
                    "(parameters, reduced gradients) compared rank by rank")
    text.append("  values: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    return Layout(rule, pairs, text, counts, view_side=1 - int(reverse),
                  replica_units=[("", [u for us in t_steps.values() for u in us])])


# ---------------------------------------------------------------- reading

def load_view(path: Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise DumpFormatError(f"{path}: cannot be read ({e})") from None


def _strip_wrapper(data: Dict[str, Any], golden: Dict[str, Any]) -> Dict[str, Any]:
    """DDP's wrapper adds ``module.`` to every module name: removed when the single run has none."""
    if any(k.startswith("Module.module.") for k in golden):
        return data
    out = {}
    for k, v in data.items():
        if k.startswith("Module.module."):
            k = "Module." + k[len("Module.module."):]
            if k not in golden and re.fullmatch(r"Module\.[A-Za-z_]\w*\.(forward|backward)\.\d+", k):
                continue        # the wrapped model itself, which the single run records as no module
        out[k] = v
    return out


def _first_input_versions(datas: List[Dict[str, Any]]) -> int:
    """How many distinct versions (shape and statistics) the first recorded tensor input (the
    batch as the model first sees it) has across the ranks; 1 when there is none."""
    for key, rec in datas[0].items():
        if parse_key(key).direction != "forward":
            continue
        for path, leaf in _leaves(rec):
            if not path or path[0] not in ("input_args", "input_kwargs", "input"):
                continue
            others = [_at(d.get(key), path) for d in datas]
            return len({None if o is None else json.dumps([o.get("shape")] + [o.get(s) for s in STAT_FIELDS])
                        for o in others})
    return 1


def detect(datas: List[Dict[str, Any]]) -> str:
    """SAME when the first recorded tensor input is the same on every rank, else SPLIT."""
    return SAME if _first_input_versions(datas) == 1 else SPLIT


def data_shards(datas: List[Dict[str, Any]]) -> int:
    """How many distinct batch shards the ranks saw: N under DDP/FSDP2, the data-parallel size on
    a 2-D mesh whose tensor-parallel peers share their batch."""
    return _first_input_versions(datas)


# ---------------------------------------------------------------- merging

def _local(s: dict) -> Optional[Tuple[int, float, float, float, float]]:
    """(count, sum, sum_sq, max, min) of a plain tensor summary."""
    shape = s.get("shape")
    vals = [s.get(k) for k in STAT_FIELDS]
    if not isinstance(shape, list) or any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in vals):
        return None
    count = math.prod(shape)
    mx, mn, mean, norm = (float(v) for v in vals)
    return count, mean * count, norm * norm, mx, mn


def _summary(like: dict, shape: List[int], count: int, total: float, squares: float, mx, mn, how: str) -> dict:
    out = {k: v for k, v in like.items() if k not in ("data_name", "md5", DTENSOR) + STAT_FIELDS}
    out.update(shape=list(shape), Max=mx, Min=mn, Mean=total / count if count else None,
               Norm=math.sqrt(max(squares, 0.0)), layout=how)
    return out


def _same(a: dict, b: dict) -> bool:
    return a.get("shape") == b.get("shape") and all(a.get(k) == b.get(k) for k in STAT_FIELDS)


def _grid_tiles(leaves: List[dict], golden: list, partitions: Optional[List[List[List[int]]]] = None
                ) -> Optional[Tuple[List[dict], int, int]]:
    """A 2-D mesh: each inner group (the recorded sub-meshes' ranks in `partitions`, e.g. the
    tensor-parallel peers of one data-parallel group, contiguous or not; else contiguous blocks
    ``g*k .. g*k+k-1``) holds one replica or tiles along one dimension, and the groups' results
    tile the golden shape. Returns the distinct tiles (each counted once), the inner and the
    outer dimension (-1: replicated within the group)."""
    n = len(leaves)
    blocks = [[list(range(g * k, (g + 1) * k)) for g in range(n // k)] for k in range(2, n) if not n % k]
    for partition in list(partitions or []) + blocks:
        groups = [[leaves[i] for i in members] for members in partition]
        replicas = [all(_same(s, g[0]) for s in g) for g in groups]
        if all(replicas):
            shapes = [g[0].get("shape") for g in groups]
            outer = _tile_dim(shapes, golden)
            if outer is not None:
                return [g[0] for g in groups], -1, outer
            continue
        if any(replicas):
            continue
        for inner in range(len(golden)):        # the dimension each group's members tile
            shapes = [_concat_shape([s.get("shape") for s in g], inner, len(golden)) for g in groups]
            if any(sh is None for sh in shapes):
                continue
            outer = _tile_dim(shapes, golden)
            if outer is not None:
                return [s for g in groups for s in g], inner, outer
    return None


def job_partitions(datas: List[Dict[str, Any]]) -> List[List[List[int]]]:
    """The rank groups of the job's recorded sub-meshes (e.g. its tensor-parallel groups): the
    candidates for a plain value's 2-D tiling, read from the DTensor blocks of every rank."""
    n = len(datas)
    found: Dict[Tuple, set] = {}
    for data in datas:
        for rec in data.values():
            for _, leaf in _leaves(rec):
                block = leaf.get(DTENSOR)
                ranks = block.get("mesh_ranks") if block else None
                if isinstance(ranks, list) and 1 < len(ranks) < n:
                    found.setdefault((tuple(block.get("mesh_dim_names") or ()), len(ranks)), set()).add(tuple(ranks))
    out = []
    for groups in found.values():
        if sorted(r for g in groups for r in g) == list(range(n)):
            out.append([list(g) for g in sorted(groups)])
    return out


def _merge_means(parts: List[dict], own: dict, golden: Optional[dict], rule: str, backward: bool,
                 shards: Optional[int]) -> Tuple[dict, str]:
    """Mean-only values (a Partial DTensor per sub-mesh group) of the groups: tiles of the single
    run's shape combine their Means by count; same-shape split-batch gradients average."""
    g_shape = golden.get("shape") if golden else None
    shapes = [p.get("shape") for p in parts]
    if g_shape is None or any(p.get("Mean") is None for p in parts):
        return own, "DTensor merged (sub-mesh)"
    if all(sh == g_shape for sh in shapes):
        if all(p.get("Mean") == parts[0].get("Mean") for p in parts):
            return own, "DTensor merged (sub-mesh)"
        if not (rule == SPLIT and backward):
            return own, "DTensor merged (sub-mesh)"
        out = dict(own, Mean=math.fsum(p["Mean"] for p in parts) / len(parts))
        return out, "DTensor merged (sub-mesh) + averaged over ranks"
    d = _tile_dim(shapes, g_shape)
    if d is None:
        return own, "DTensor merged (sub-mesh)"
    scale = 1.0 / (shards or len(parts)) if (rule == SPLIT and backward) else 1.0
    counts = [math.prod(sh) for sh in shapes]
    mean = math.fsum(p["Mean"] * c for p, c in zip(parts, counts)) / sum(counts) * scale
    return dict(own, shape=list(g_shape), Mean=mean), f"DTensor merged (sub-mesh) + tiles merged (dim {d})"


def _merge_value(leaves: List[dict], r: int, golden: Optional[dict], rule: str, backward: bool,
                 shards: Optional[int] = None, partitions: Optional[List[List[List[int]]]] = None
                 ) -> Tuple[dict, str]:
    """The value of rank `r` as the view shows it, and how it was made (`partitions`: the job's
    recorded sub-mesh groups, for plain values tiled over a 2-D mesh)."""
    own = leaves[r]
    n = len(leaves)
    if DTENSOR in own:
        if any(DTENSOR not in s for s in leaves):
            return own, "own"
        groups = submesh_groups(leaves)
        if groups is not None:      # a DTensor on a sub-mesh (the TP mesh of a 2-D one): merged per group first
            per_rank: List[dict] = [{}] * n
            for group in groups:
                members = [leaves[i] for i in group]
                for j, i in enumerate(group):
                    per_rank[i] = _merge_value(members, j, None, SAME, False)[0]
            if any(s.get("Max") is None for s in per_rank):      # Partial: Means, tiled across the groups
                return _merge_means([per_rank[g[0]] for g in groups], per_rank[r], golden, rule, backward, shards)
            value, how = _merge_value(per_rank, r, golden, rule, backward, shards, [groups] + list(partitions or []))
            return value, "DTensor merged (sub-mesh)" + ("" if how == "own" else " + " + how)
        merged = merge_shards(leaves)
        block = own[DTENSOR]
        base = {k: v for k, v in own.items() if k not in ("data_name", "md5", DTENSOR) + STAT_FIELDS}
        base.update(shape=list(block["global_shape"]), layout=MERGED)
        if merged is not None:
            base.update({k: merged[k] for k in STAT_FIELDS})
            return base, "DTensor merged"
        if any(p.startswith("Partial") for p in block["placements"]) and all(s[DTENSOR].get("local") for s in leaves):
            count = math.prod(block["global_shape"])
            if "sum" in block["placements"][0] or all(p.startswith("Partial") for p in block["placements"]):
                total = math.fsum(s[DTENSOR]["local"]["sum"] for s in leaves
                                  if not any(c for c, p in zip(s[DTENSOR].get("coordinate") or [],
                                                               s[DTENSOR]["placements"]) if p.startswith("Replicate")))
                base.update(Max=None, Min=None, Norm=None, Mean=total / count if count else None)
                return base, "Partial (Mean only)"
        base.update(Max=None, Min=None, Mean=None, Norm=None)
        return base, "not mergeable"
    g_shape = golden.get("shape") if golden else None
    shapes = [s.get("shape") for s in leaves]
    identical = all(s.get("shape") == own.get("shape") and all(s.get(k) == own.get(k) for k in STAT_FIELDS) for s in leaves)
    if identical or g_shape is None or g_shape == own.get("shape"):
        if rule == SPLIT and backward and not identical and g_shape is not None and all(sh == g_shape for sh in shapes):
            locs = [_local(s) for s in leaves]
            if any(loc is None for loc in locs):
                return own, "own"
            mean = math.fsum(loc[1] / loc[0] for loc in locs if loc[0]) / n
            out = _summary(own, g_shape, 1, mean, 0.0, None, None, MERGED)
            out.update(Mean=mean, Norm=None)
            if not g_shape:      # a scalar: its average is known whole
                out.update(Max=mean, Min=mean, Norm=abs(mean))
            return out, "averaged over ranks"
        if rule == SPLIT and not g_shape and g_shape is not None and not identical:
            locs = [_local(s) for s in leaves]       # a scalar such as the loss: the ranks' average
            if all(loc is not None for loc in locs):
                mean = math.fsum(loc[1] for loc in locs) / n
                return _summary(own, [], 1, mean, mean * mean, mean, mean, MERGED), "averaged over ranks"
        return own, "own"
    d = _tile_dim(shapes, g_shape)
    how = f"tiles merged (dim {d})"
    if d is None:
        grid = _grid_tiles(leaves, g_shape, partitions)
        if grid is None:
            return own, "own"
        leaves, inner, outer = grid
        how = f"tiles merged (dim {outer})" if inner == -1 else f"tiles merged (dims {outer}, {inner})"
    locs = [_local(s) for s in leaves]
    if any(loc is None for loc in locs):
        return own, "own"
    scale = 1.0 / (shards or n) if (rule == SPLIT and backward) else 1.0
    count = sum(loc[0] for loc in locs)
    total = math.fsum(loc[1] for loc in locs) * scale
    squares = math.fsum(loc[2] for loc in locs) * scale * scale
    mx, mn = max(loc[3] for loc in locs) * scale, min(loc[4] for loc in locs) * scale
    return _summary(own, g_shape, count, total, squares, mx, mn, MERGED), how


def build_view(golden: Dict[str, Any], datas: List[Dict[str, Any]], r: int, rule: str,
               shards: Optional[int] = None, partitions: Optional[List[List[List[int]]]] = None
               ) -> Tuple[Dict[str, Any], Dict[str, int]]:
    """Rank `r`'s records with every tensor value as comparable with the single run's (split
    batch: `shards` batch shards, default one per rank, scale the backward tiles)."""
    counts: Dict[str, int] = {}
    view: Dict[str, Any] = {}
    for key, rec in datas[r].items():
        backward = parse_key(key).direction == "backward"
        new = json.loads(json.dumps(rec))
        for path, _ in _leaves(rec):
            leaves = [_at(d.get(key), path) for d in datas]
            if all(is_tensor_summary(x) for x in leaves):
                g_leaf = _at(golden.get(key), path)
                value, how = _merge_value(leaves, r, g_leaf, rule, backward, shards, partitions)
                if how == "own" and not _same_shape(g_leaf, leaves[r]):
                    for near in _shifted(golden, key, path):      # the ranks' call counters shifted
                        value, how = _merge_value(leaves, r, near, rule, backward, shards, partitions)
                        if how != "own":
                            how += " (shape of a shifted call)"
                            break
            else:       # a call the other ranks did not make alike: the rank's own value
                value, how = leaves[r], "own"
            counts[how] = counts.get(how, 0) + 1
            _set(new, path, value)
        view[key] = new
    return view, counts


_COUNTED = re.compile(r"^(?P<api>.+)\.(?P<n>\d+)\.(?P<dir>forward|backward)$")


def _same_shape(golden: Optional[dict], leaf: dict) -> bool:
    return isinstance(golden, dict) and golden.get("shape") == leaf.get("shape")


def _shifted(golden: Dict[str, Any], key: str, path: Tuple, reach: int = 2) -> List[dict]:
    """The same value of the same API's nearest calls in the single run (counter +-1, +-2): where
    a parallel run makes extra calls of an API (a redistribute, a collective's reshape), its
    counters run ahead and the exact key names another call. Only the global shape is taken from
    it, so a wrong neighbour can make no value pass: the tiles still have to make that shape."""
    m = _COUNTED.match(key)
    if not m:
        return []
    n = int(m.group("n"))
    out = []
    for d in sorted(range(-reach, reach + 1), key=abs):
        other = f"{m.group('api')}.{n + d}.{m.group('dir')}"
        leaf = _at(golden.get(other), path) if d and n + d >= 0 else None
        if isinstance(leaf, dict):
            out.append(leaf)
    return out


def _write_view(doc: dict, view: Dict[str, Any], unit: DumpUnit, out: Path) -> DumpUnit:
    out.mkdir(parents=True, exist_ok=True)
    src = unit.json_path.parent
    import shutil      # only global views write files: not imported for every compare

    for name in ("stack.json", "construct.json"):
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    header = {k: v for k, v in doc.items() if k != "data"}
    # the rank's own tensor files, where they are (a recorded dump_data_dir may be relative to the job's cwd)
    header["dump_data_dir"] = str(shard_tensors.tensor_dir(doc, unit.json_path).resolve())
    with open(out / "dump.json", "w") as f:
        json.dump({**header, "data": view}, f)
    return DumpUnit(unit.step, unit.rank, out / "dump.json")

