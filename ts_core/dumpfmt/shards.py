"""How a sharded value (torch's DTensor) is recorded, and how its shards merge back.

A DTensor's summary is its local shard's, in msprobe's fields (``shape`` is the local shape,
``Max``/``Min``/``Mean``/``Norm`` the local shard's), plus an additive ``dtensor`` block::

    "dtensor": {"global_shape": [8, 16], "placements": ["Shard(0)"], "mesh_shape": [2],
                "mesh_dim_names": null, "coordinate": [1], "mesh_ranks": [0, 1],
                "local": {"count": 64, "sum": ..., "sum_sq": ..., "max": ..., "min": ...,
                          "nan": 0, "inf": 0}}

Placements: ``Shard(d)``, ``StridedShard(d, sf=k)`` (FSDP2 over TP: a shard made of k interleaved
chunks of dimension d), ``Replicate()``, ``Partial(op)`` (a pending reduction), ``MaskPartial(op)``
(a vocabulary-parallel embedding's output: a pending sum whose local shards still hold the rows
that the reduction masks out; neither its statistics nor its Mean merge).
``mesh_ranks`` lists the global ranks of the mesh in its row-major order (the coordinates' ranks):
on a 2-D job a sub-mesh's groups (e.g. tensor-parallel peers that are not contiguous ranks) are
read from it rather than guessed from the rank order.
``local`` holds statistics that merge exactly: counts and sums add, extremes combine. So the
global value's Max/Min/Mean/Norm follow from the shards of one record across ranks
(``merge_shards``), uneven shards included, without the tensors.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

DTENSOR = "dtensor"
LOCAL_FIELDS = ("max", "min", "sum", "sum_sq", "nan", "inf")     # the order of a shard row


def is_pending(placement: str) -> bool:
    """A pending reduction (``Partial``/``MaskPartial``): the global value is not the shards'."""
    return placement.startswith(("Partial", "MaskPartial"))


def is_shard(placement: str) -> bool:
    """Does this mesh dimension split the value (each coordinate holds a distinct part)?"""
    return placement.startswith(("Shard", "StridedShard"))


def dtensor_block(global_shape: List[int], placements: List[str], mesh_shape: List[int],
                  mesh_dim_names: Optional[Sequence[str]], coordinate: Optional[Sequence[int]],
                  mesh_ranks: Optional[Sequence[int]] = None) -> dict:
    """The ``dtensor`` block of a summary, before its local statistics are known."""
    block = {"global_shape": global_shape, "placements": placements, "mesh_shape": mesh_shape,
             "mesh_dim_names": list(mesh_dim_names) if mesh_dim_names else None,
             "coordinate": list(coordinate) if coordinate is not None else None}
    if mesh_ranks is not None:
        block["mesh_ranks"] = [int(r) for r in mesh_ranks]
    return block


def shard_stats(row: Sequence[float], count: int) -> Tuple[Tuple[Any, Any, Any, Any], dict]:
    """((Max, Min, Mean, Norm), local block) from a shard row (``LOCAL_FIELDS`` order)."""
    mx, mn, total, squares, nan, inf = (float(v) for v in row)
    local = {"count": count, "sum": total, "sum_sq": squares, "max": mx, "min": mn,
             "nan": int(nan), "inf": int(inf)}
    return (mx, mn, total / count, math.sqrt(squares) if squares == squares else squares), local


def _unique_shards(summaries: Iterable[dict]) -> List[dict]:
    """One summary per distinct shard: along a mesh dimension that replicates the value only
    coordinate 0 counts (the others hold copies)."""
    out, seen = [], set()
    for s in summaries:
        block = s[DTENSOR]
        coord = block.get("coordinate") or []
        placements = block["placements"]
        key = tuple(c for c, p in zip(coord, placements) if not p.startswith("Replicate"))
        if any(c for c, p in zip(coord, placements) if p.startswith("Replicate")) or key in seen:
            continue
        seen.add(key)
        out.append(s)
    return out


def merge_shards(summaries: Iterable[dict]) -> Optional[Dict[str, Any]]:
    """The global value's ``{"Max", "Min", "Mean", "Norm", "count"}`` from the summaries of one
    DTensor record on every rank of its mesh; None when they do not determine it (a ``Partial``
    placement: the global value is a sum of the shards, whose extremes are not known)."""
    shards = _unique_shards(summaries)
    if not shards or any(is_pending(p) for s in shards for p in s[DTENSOR]["placements"]):
        return None
    block = shards[0][DTENSOR]
    expected = math.prod(n for n, p in zip(block["mesh_shape"], block["placements"]) if is_shard(p))
    locals_ = [s[DTENSOR].get("local") for s in shards]
    if len(shards) != expected or any(loc is None for loc in locals_):
        return None                          # a rank's shard is missing
    count = sum(loc["count"] for loc in locals_)
    if any(loc["nan"] for loc in locals_):
        nan = float("nan")
        return {"Max": nan, "Min": nan, "Mean": nan, "Norm": nan, "count": count}
    total = math.fsum(loc["sum"] for loc in locals_)
    squares = math.fsum(loc["sum_sq"] for loc in locals_)
    return {"Max": max(loc["max"] for loc in locals_), "Min": min(loc["min"] for loc in locals_),
            "Mean": total / count if count else None, "Norm": math.sqrt(squares), "count": count}


def submesh_groups(leaves: List[dict]) -> Optional[List[List[int]]]:
    """The rank groups of a DTensor whose mesh is smaller than the job (contiguous blocks: the inner
    dimension of a 2-D mesh; or strided: its outer one), found from the coordinates: each group
    holds every coordinate of the mesh once; exactly from ``mesh_ranks`` where the dump recorded
    it). None when the mesh spans every rank."""
    n = len(leaves)
    blocks = [s[DTENSOR] for s in leaves]
    m = math.prod(blocks[0].get("mesh_shape") or [n])
    if m >= n or n % m or any(math.prod(b.get("mesh_shape") or [n]) != m for b in blocks):
        return None
    recorded = mesh_groups(blocks, n)
    if recorded is not None:
        return recorded
    for groups in ([list(range(g * m, (g + 1) * m)) for g in range(n // m)],
                   [list(range(j, n, n // m)) for j in range(n // m)]):
        if all(len({tuple(blocks[i].get("coordinate") or ()) for i in g}) == m for g in groups):
            return groups
    return None


def mesh_groups(blocks: List[dict], n: int) -> Optional[List[List[int]]]:
    """The sub-mesh groups as the dump recorded them (each rank's ``mesh_ranks``), each in
    coordinate order, when they partition ranks 0..n-1; else None."""
    groups = {tuple(b["mesh_ranks"]) for b in blocks if isinstance(b.get("mesh_ranks"), list)}
    if len(groups) < 2 or sorted(r for g in groups for r in g) != list(range(n)):
        return None
    return [list(g) for g in sorted(groups)]
