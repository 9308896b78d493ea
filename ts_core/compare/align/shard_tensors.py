"""Task tensor: a sharded value's global tensor assembled from its ranks' local files, and the
rank whose shard is wrong.

Where each rank's local tensor sits in the global one follows from the DTensor placements
exactly as torch splits (``Shard(d)``: ``torch.chunk`` of the dimension, the last chunks
smaller or empty when it does not divide; ``StridedShard(d, sf)``: chunked into ``sf`` pieces
first, each piece chunked over the mesh dimension, a rank's shard the concatenation of its
chunk of every piece; ``Replicate()``: all of it; ``Partial(sum)``: all of it, a term of the
sum). A plain value tiled over the ranks along one dimension sits at the rank's offset in rank
order. The assembled tensor is written into the rank view (layouts.py), so compare judges it
element by element; each merged value lists its ``regions`` (rank, local file, index runs per
dimension, scale), so a divergence on it is laid at the ranks whose local tensor differs from
the other run's global tensor in their region.
"""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...dumpfmt import DTENSOR, is_tensor_summary, parse_key
from ...dumpfmt.shards import is_pending
from ...dumpfmt.shards import submesh_groups
from .tiles import MERGED, at, leaves as tree_leaves, tile_dim

REGIONS = "regions"


def chunk_bounds(n: int, k: int) -> List[Tuple[int, int]]:
    """``torch.chunk(range(n), k)`` padded with empty chunks to k: [start, stop) of each."""
    size = -(-n // k) if n else 0
    return [(min(i * size, n), min((i + 1) * size, n)) for i in range(k)]


def shard_index(global_shape: Sequence[int], placements: Sequence[str], mesh_shape: Sequence[int],
                coordinate: Sequence[int]) -> Optional[List[np.ndarray]]:
    """Per dimension, the global indices the local tensor holds (in its order); None for a
    placement this does not know."""
    idx = [np.arange(n) for n in global_shape]
    for p, m, c in zip(placements, mesh_shape, coordinate):
        if p.startswith("Shard("):
            d = int(p[6:-1])
            a, b = chunk_bounds(len(idx[d]), m)[c]
            idx[d] = idx[d][a:b]
        elif p.startswith("StridedShard("):
            d, sf = (int(x.split("=")[-1]) for x in p[13:-1].split(","))
            pieces = [idx[d][a:b] for a, b in chunk_bounds(len(idx[d]), sf)]
            idx[d] = np.concatenate([piece[slice(*chunk_bounds(len(piece), m)[c])] for piece in pieces])
        elif not (p.startswith("Replicate") or p.startswith("Partial(sum")):
            return None
    return idx


def _runs(index: np.ndarray) -> List[List[int]]:
    """Index array -> [[start, stop], ...] of consecutive runs (compact in the view)."""
    if not len(index):
        return []
    cut = np.flatnonzero(np.diff(index) != 1) + 1
    return [[int(part[0]), int(part[-1]) + 1] for part in np.split(index, cut)]


def _index(runs: List[List[List[int]]]) -> List[np.ndarray]:
    return [np.concatenate([np.arange(a, b) for a, b in dim]) if dim else np.arange(0) for dim in runs]


def _file(leaf: dict, tensor_dir: Path) -> Optional[Path]:
    name = leaf.get("data_name")
    if not name:
        return None
    path = tensor_dir / os.path.basename(str(name))
    return path if path.is_file() else None


def load(path: Path) -> np.ndarray:
    from ..load.loader import load_tensor_file

    return np.asarray(load_tensor_file(path))


def _dtensor_global(leaves: List[dict], files: List[Path], ranks: List[int]
                    ) -> Optional[Tuple[np.ndarray, List[dict]]]:
    """The global tensor of one DTensor over its mesh (the ranks holding it: `ranks`) and the
    regions of its non-pending shards."""
    out, regions = None, []
    for r, leaf, f in zip(ranks, leaves, files):
        block = leaf[DTENSOR]
        placements = block["placements"]
        if any(p.startswith("MaskPartial") for p in placements):
            return None
        coord = block.get("coordinate") or []
        idx = shard_index(block["global_shape"], placements, block["mesh_shape"], coord)
        if idx is None:
            return None
        local = load(f)
        if tuple(local.shape) != tuple(len(i) for i in idx):
            return None
        if out is None:
            out = np.zeros(block["global_shape"], dtype=np.float64)
        if not any(c for c, p in zip(coord, placements) if p.startswith("Replicate")):
            out[np.ix_(*idx)] += local          # a Replicate() coordinate other than 0 holds a copy
        if not any(is_pending(p) for p in placements):
            regions.append({"rank": r, "file": str(f), "index": [_runs(i) for i in idx], "scale": 1.0})
    return (out, regions) if out is not None else None


def assemble(leaves: List[dict], files: List[Optional[Path]], view_leaf: dict, scale: float,
             backward: bool = True) -> Optional[Tuple[np.ndarray, List[dict]]]:
    """The global tensor of one merged value (shape ``view_leaf["shape"]``) and its regions, from
    the ranks' leaves and local files (`scale`: of tiles, 1/shards for split-batch gradients). A
    DTensor on a sub-mesh (2-D job) is assembled per group, then the groups, in rank order, are
    copies, tiles or a split-batch gradient's terms (`backward`; forward groups that differ in
    the global shape are each group's own value, left to the statistics; a scalar such as the
    loss is the ranks' average). None when the layout
    is not one this assembles (a 2-D grid of plain tiles, a masked pending sum)."""
    if any(f is None for f in files):
        return None
    shape = view_leaf.get("shape")
    if not isinstance(shape, list):
        return None
    n = len(leaves)
    if all(DTENSOR in x for x in leaves):
        groups = submesh_groups(leaves) or [list(range(n))]
        parts = [_dtensor_global([leaves[i] for i in g], [files[i] for i in g], g) for g in groups]
        if any(p is None for p in parts):
            return None
        if len(parts) == 1 or all(np.array_equal(p[0], parts[0][0]) for p in parts):
            return parts[0][0], [reg for p in parts for reg in p[1]]
        if all(list(p[0].shape) == shape for p in parts):      # split-batch gradient terms
            return (np.mean([p[0] for p in parts], axis=0), []) if backward else None
        d = tile_dim([list(p[0].shape) for p in parts], shape)
        if d is None:
            return None
        regions, start = [], 0
        for array, regs in parts:
            for reg in regs:
                index = [list(map(list, dim)) for dim in reg["index"]]
                index[d] = [[a + start, b + start] for a, b in index[d]]
                regions.append({**reg, "index": index, "scale": scale})
            start += array.shape[d]
        return np.concatenate([p[0] for p in parts], axis=d) * scale, regions
    if any(DTENSOR in x for x in leaves):
        return None
    arrays = [load(f) for f in files]
    if all(list(a.shape) == shape for a in arrays):             # split-batch gradients before the all-reduce
        return (np.mean([a.astype(np.float64) for a in arrays], axis=0), []) if backward or not shape else None
    d = tile_dim([list(a.shape) for a in arrays], shape)
    if d is None:
        return None
    out = np.concatenate([a.astype(np.float64) for a in arrays], axis=d) * scale
    regions, start = [], 0
    for r, a in enumerate(arrays):
        idx = [[[0, m]] for m in shape]
        idx[d] = [[start, start + a.shape[d]]]
        start += a.shape[d]
        regions.append({"rank": r, "file": str(files[r]), "index": idx, "scale": scale})
    return out, regions


def attach(view: Dict[str, Any], datas: List[Dict[str, Any]], tensor_dirs: List[Path], backward_scale: float,
           out_dir: Path, cache: Dict[Tuple, Any], ranks: List[str]) -> int:
    """Give every merged value of a rank view its assembled global tensor (a file in the view's
    tensor folder, named in ``data_name``) and its regions; `cache` shares the assembled files
    between the views of one step; `backward_scale` scales backward tiles (split batch: 1/shards).
    Returns how many values got one."""
    done = 0
    folder = out_dir / "dump_tensor_data"
    for key, rec in view.items():
        backward = parse_key(key).direction == "backward"
        for path, leaf in tree_leaves(rec):
            if leaf.get("layout") != MERGED:
                continue
            leaves = [at(d.get(key), path) for d in datas]
            if any(not is_tensor_summary(x) for x in leaves):
                continue
            name = MERGED + "." + ".".join(map(str, (key,) + path)) + ".npy"
            if (key, path) not in cache:
                made = assemble(leaves, [_file(x, t) for x, t in zip(leaves, tensor_dirs)], leaf,
                                backward_scale if backward else 1.0, backward)
                if made is None:
                    cache[(key, path)] = None
                else:
                    array, regions = made
                    src = out_dir.parent / "merged_tensors" / name      # one per step
                    src.parent.mkdir(parents=True, exist_ok=True)
                    np.save(src, array.astype(np.float32) if _is_float32(leaf) else array)
                    for reg in regions:
                        reg["rank"] = ranks[reg["rank"]]
                    cache[(key, path)] = (src, regions)
            made = cache[(key, path)]
            if made is None:
                continue
            folder.mkdir(parents=True, exist_ok=True)
            try:
                os.link(made[0], folder / name)
            except OSError:
                shutil.copyfile(made[0], folder / name)
            leaf["data_name"] = name
            leaf[REGIONS] = made[1]
            done += 1
    return done


def _is_float32(leaf: dict) -> bool:
    return "float32" in str(leaf.get("dtype") or "") or "bfloat16" in str(leaf.get("dtype") or "") \
        or "float16" in str(leaf.get("dtype") or "")


def bad_regions(regions: List[dict], reference: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5) -> List[dict]:
    """The regions whose rank's local tensor (scaled as merged) differs from `reference` (the
    other run's global tensor) there: ``[{"rank", "max_abs_diff", "elements"}]``, worst first."""
    bad = []
    for reg in regions:
        idx = _index(reg["index"])
        want = reference[np.ix_(*idx)].astype(np.float64)
        got = load(Path(reg["file"])).astype(np.float64) * reg.get("scale", 1.0)
        if got.shape != want.shape:
            bad.append({"rank": reg["rank"], "max_abs_diff": math.inf, "elements": int(want.size)})
            continue
        off = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        if off.any():
            bad.append({"rank": reg["rank"], "max_abs_diff": float(np.nanmax(np.abs(got - want))),
                        "elements": int(off.sum())})
    return sorted(bad, key=lambda b: -b["max_abs_diff"])


def tensor_dir(doc: dict, json_path: Path) -> Path:
    """A rank's tensor folder: next to its dump.json, else the header's ``dump_data_dir``."""
    here = json_path.parent / "dump_tensor_data"
    if here.is_dir() or not isinstance(doc.get("dump_data_dir"), str):
        return here
    return Path(doc["dump_data_dir"])


def is_tensor_task(docs: List[dict]) -> bool:
    return all(str(d.get("task") or "") == "tensor" for d in docs)


def name_shards(view_leaf: Optional[dict], reference: Optional[dict], reference_dir: Optional[Path],
                reference_data_dir: Optional[str]) -> Optional[List[dict]]:
    """The ranks whose shard of a merged value differs from the other run's global tensor, or
    None when this cannot tell (statistics only, no regions, no reference tensor)."""
    if not view_leaf or not view_leaf.get(REGIONS) or not reference or not reference.get("data_name"):
        return None
    name = os.path.basename(str(reference["data_name"]))
    for folder in filter(None, (reference_dir, Path(reference_data_dir) if reference_data_dir else None)):
        path = Path(folder) / name
        if path.is_file():
            return bad_regions(view_leaf[REGIONS], load(path))
    return None


def shards_text(bad: List[dict], value: str) -> str:
    return ", ".join(b["rank"] for b in bad) + f" (tensor mode: its shard of {value} differs from the other " \
        "run's global tensor in its region: " + "; ".join(
            f"{b['rank']} {b['elements']} elements, max abs diff {b['max_abs_diff']:.3g}" for b in bad) + ")"
