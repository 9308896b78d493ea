"""Where the parts of a value sit: the tensor leaves of a record, the shapes that rank tiles
concatenate to, and the rank groups of a DTensor on a sub-mesh. Shared by the rank views (layouts.py, global_views.py) and the tensor-mode
assembly of sharded values (shard_tensors.py)."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

from ...dumpfmt import is_tensor_summary, parse_key, record_entries

MERGED = "merged"        # a view's value merged across ranks (``"layout"`` field of its summary)


def leaves(value: Any, path: Tuple = ()) -> List[Tuple[Tuple, dict]]:
    """(path, tensor summary) of every tensor value in a record."""
    if isinstance(value, dict):
        if is_tensor_summary(value):
            return [(path, value)]
        return [x for k, v in value.items() for x in leaves(v, path + (k,))]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in leaves(v, path + (i,))]
    return []


def at(value: Any, path: Tuple) -> Any:
    """The value at `path` in a record, None when the record has none there."""
    for p in path:
        try:
            value = value[p]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def set_at(value: Any, path: Tuple, leaf: Any) -> None:
    for p in path[:-1]:
        value = value[p]
    value[path[-1]] = leaf


def tile_dim(shapes: List[list], golden: list) -> Optional[int]:
    """The dimension along which the ranks' shapes concatenate to the golden shape."""
    if any(not isinstance(s, list) or len(s) != len(golden) for s in shapes) or not golden:
        return None
    for d in range(len(golden)):
        if all(s[:d] + s[d + 1:] == golden[:d] + golden[d + 1:] for s in shapes) \
                and sum(s[d] for s in shapes) == golden[d]:
            return d
    return None


def concat_shape(shapes: List[Any], d: int, ndim: int) -> Optional[list]:
    """The shape of `shapes` concatenated along `d`, None when they do not concatenate."""
    if any(not isinstance(x, list) or len(x) != ndim for x in shapes):
        return None
    if any(x[:d] + x[d + 1:] != shapes[0][:d] + shapes[0][d + 1:] for x in shapes):
        return None
    return shapes[0][:d] + [sum(x[d] for x in shapes)] + shapes[0][d + 1:]


def entry_leaf(data: dict, key: Optional[str], arg: str) -> Optional[dict]:
    """The tensor summary of value `arg` (``input.1``, ``output.0``, ``parameters.weight``) of
    record `key` in a dump's data, None when it has none."""
    rec = data.get(key) if key else None
    if rec is None:
        return None
    for e in record_entries(rec, parse_key(key).kind == "parameters_grad"):
        if e.arg == arg and isinstance(e.leaf, dict):
            return e.leaf
    return None
