"""Forward (post) hooks for Cells that define ``bprop``.

MindSpore 2.10 ignores ``register_forward_hook`` on such a Cell (it returns an empty handle and
registers nothing), while its forward pre-hook does run. Without the post hook the Cell's
forward record is never written and its call is never ended, so everything recorded after it
would get it as parent. So each such Cell gets its own subclass (same name, module and
qualname) whose ``__call__`` runs the original ``Cell.__call__`` (pre-hooks, the custom-bprop
op) and then the hooks, also when the call raises (with output None, as ``always_call=True``).
Removing the last hook puts the original class back.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, List


def has_bprop(cell: Any) -> bool:
    return bool(getattr(cell, "has_bprop", False))


def _run(fns: List[Callable], cell: Any, args: tuple, kwargs: dict, output: Any) -> None:
    for fn in list(fns):
        fn(cell, args, kwargs, output)


def _subclass(orig_cls: type) -> type:
    def __call__(self, *args, **kwargs):
        fns = type(self).__tsprobe_post_hooks__
        try:
            out = orig_cls.__call__(self, *args, **kwargs)
        except BaseException:
            _run(fns, self, args, kwargs, None)
            raise
        _run(fns, self, args, kwargs, out)
        return out

    return type(orig_cls.__name__, (orig_cls,), {
        "__call__": __call__, "__module__": orig_cls.__module__, "__qualname__": orig_cls.__qualname__,
        "__tsprobe_orig_class__": orig_cls, "__tsprobe_post_hooks__": []})


class PostHookHandle:
    """Removes one hook; the last one removed restores the Cell's class."""

    def __init__(self, cell: Any, fn: Callable):
        self._cell = weakref.ref(cell)
        self._fn = fn

    def remove(self) -> None:
        cell = self._cell()
        if cell is None or self._fn is None:
            return
        cls = type(cell)
        fns = cls.__dict__.get("__tsprobe_post_hooks__")
        if fns is not None:
            if self._fn in fns:
                fns.remove(self._fn)
            if not fns:
                cell.__class__ = cls.__tsprobe_orig_class__
        self._fn = None


def register_post_hook(cell: Any, fn: Callable) -> PostHookHandle:
    """Run ``fn(cell, args, kwargs, output)`` after every call of `cell` (a Cell with ``bprop``)."""
    cls = type(cell)
    if "__tsprobe_post_hooks__" not in cls.__dict__:
        cell.__class__ = cls = _subclass(cls)
    cls.__tsprobe_post_hooks__.append(fn)
    return PostHookHandle(cell, fn)
