"""Walking the argument structures calls receive (lists, tuples, dicts), for every backend."""
from __future__ import annotations

from typing import Any, Callable, List


def leaves(obj: Any, keep: Callable[[Any], bool], out: List[Any]) -> List[Any]:
    """Append every leaf of `obj` for which `keep` is true to `out` (in argument order)."""
    if isinstance(obj, (list, tuple)):
        for v in obj:
            leaves(v, keep, out)
    elif isinstance(obj, dict):
        for v in obj.values():
            leaves(v, keep, out)
    elif keep(obj):
        out.append(obj)
    return out


def map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """`obj` rebuilt with `fn` applied to each leaf; namedtuples are leaves (kept whole)."""
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(map_leaves(v, fn) for v in obj)
    if isinstance(obj, list):
        return [map_leaves(v, fn) for v in obj]
    if isinstance(obj, dict):
        return {k: map_leaves(v, fn) for k, v in obj.items()}
    return fn(obj)
