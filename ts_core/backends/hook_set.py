"""The bookkeeping of module (torch) and Cell (MindSpore) hooks: the handles to remove, the
models already hooked, the calls in flight, and the parameter gradients awaiting their record.

Models and parameters are held weakly: hooking a model never keeps it alive, so a model the
user drops is freed even while the debugger stays open (its hooks live on the model itself).
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, Iterator, List, Tuple

from ..dumpfmt import params_grad_key, value_name


class WeakIdSet:
    """Objects by identity (never by ``__eq__``/``__hash__``, which a model class may redefine),
    held by weak reference: an entry disappears when its object is freed."""

    def __init__(self) -> None:
        self._refs: Dict[int, weakref.ref] = {}

    def add(self, obj: Any) -> bool:
        """Remember `obj`; False when it already was."""
        if obj in self:
            return False
        key, refs = id(obj), self._refs

        def forget(ref: weakref.ref) -> None:
            if refs.get(key) is ref:
                del refs[key]

        refs[key] = weakref.ref(obj, forget)
        return True

    def __contains__(self, obj: Any) -> bool:
        ref = self._refs.get(id(obj))
        return ref is not None and ref() is obj

    def __bool__(self) -> bool:
        return any(ref() is not None for ref in self._refs.values())

    def clear(self) -> None:
        self._refs.clear()


class HookSet:
    def __init__(self, collector: Any):
        self.collector = collector
        self.handles: List[Any] = []
        self.hooked = WeakIdSet()
        self._open: Dict[int, list] = {}          # per module: the calls in flight (re-entrancy)
        self._params: List[Tuple[str, str, weakref.ref]] = []     # parameters whose .grad can be re-read
        self.param_grads: Dict[str, Dict[str, Any]] = {}
        self._grads_seen: Dict[Tuple[str, str], Tuple[Any, Any]] = {}   # (base, param) -> (grad ref, content key)

    def calls_in_flight(self, module: Any) -> list:
        """The stack of `module`'s calls between its pre and post hook (a module may re-enter)."""
        stack = self._open.get(id(module))
        if stack is None:
            stack = self._open[id(module)] = []
        return stack

    def finished_call(self, module: Any) -> Any:
        """Pop `module`'s innermost call in flight; None when there is none (or it is not recorded)."""
        stack = self._open.get(id(module))
        return stack.pop() if stack else None

    def abandon(self, call: Any) -> Any:
        """Forget the call in flight whose record is `call` (its module's end never came);
        returns its gradient capture (or None)."""
        for stack in self._open.values():
            for i, entry in enumerate(stack):
                if entry is not None and entry[0] is call:
                    del stack[i]
                    return entry[1]
        return None

    def watch_param(self, base: str, pname: str, param: Any) -> None:
        """Remember a hooked parameter (weakly) so its gradient can be read again later."""
        self._params.append((base, pname, weakref.ref(param)))

    def watched_params(self) -> Iterator[Tuple[str, str, Any]]:
        for base, pname, ref in self._params:
            param = ref()
            if param is not None:
                yield base, pname, param

    def store_param_grad(self, base: str, pname: str, grad: Any) -> None:
        """Summarise a parameter's gradient now; the latest one per parameter is recorded. A
        re-read of a gradient already summarised and unchanged since (``capture_param_grads``
        after the hooks) keeps that summary instead of summarising and writing it again."""
        seen_key = self._content_key(grad)
        seen = self._grads_seen.get((base, pname))
        if seen_key is not None and seen is not None and seen[0]() is grad and seen[1] == seen_key:
            return
        key = params_grad_key(base, 0)
        summary = self.collector.summarize_for(key, grad, value_name(key, pname))
        self.param_grads.setdefault(base, {})[pname] = [summary]     # msprobe: a one-element list
        if seen_key is not None:
            self._grads_seen[(base, pname)] = (weakref.ref(grad), seen_key)

    def _content_key(self, grad: Any) -> Any:
        key_of = self.collector.adapter.content_key     # optional in TensorAdapter
        return key_of(grad) if key_of is not None else None

    def forget_grads_seen(self) -> None:
        """The next reading of every gradient is summarised anew (``capture_param_grads``)."""
        self._grads_seen.clear()

    def emit_param_grads(self) -> None:
        """One ``parameters_grad`` record per module with gradients this step."""
        grads, self.param_grads = self.param_grads, {}
        self._grads_seen.clear()
        for base, rec in grads.items():
            self.collector.params_grad(base, rec)

    def reset(self) -> None:
        self._open.clear()
        self.param_grads.clear()
        self._grads_seen.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.hooked.clear()
        self._params.clear()
        self.reset()
