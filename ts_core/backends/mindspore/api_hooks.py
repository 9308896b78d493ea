"""L1: wrap ``mindspore.ops``, ``mindspore.mint``, ``mint.nn.functional``, ``Tensor`` methods and
operators, and communication functions listed in ``api_list.yaml``. Every patch is undone
by ``restore``.

The wrapper's fast path is two attribute reads: not collecting, or already inside a wrapped
call (nested calls, and tsprobe's own statistics ops, are not recorded).
"""
from __future__ import annotations

import functools
import importlib
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import yaml

from .._depth import DEPTH
from ._runtime import grad_recording
from .grad_capture import GradCapture, Pending, flat_tensors

API_LIST = os.path.join(os.path.dirname(__file__), "api_list.yaml")

# api_list.yaml section -> (namespace, key prefix). Section names are msprobe's
# (support_wrap_ops.yaml), so a list edited for msprobe drops in.
SECTIONS: Dict[str, Tuple[Optional[str], str]] = {
    "ops": ("mindspore.ops", "Functional"),
    "tensor": (None, "Tensor"),
    "mint.ops": ("mindspore.mint", "Mint"),
    "mint.nn.functional": ("mindspore.mint.nn.functional", "MintFunctional"),
    "communication.comm_func": ("mindspore.communication.comm_func", "Distributed"),
    "mint.distributed": ("mindspore.mint.distributed", "MintDistributed"),
}
_COLLECTIVE_PREFIXES = ("Distributed.", "MintDistributed.")

# Calls whose result may alias an input (views): the input must stay the caller's own tensor,
# so it is not routed through the gradient tap.
ALIASING = frozenset("""view view_as reshape reshape_as transpose permute __getitem__ narrow select
squeeze unsqueeze expand expand_as expand_dims flatten unflatten split chunk unbind tensor_split
movedim moveaxis swapaxes swapdims diagonal as_strided contiguous t T mT ravel broadcast_to
real imag to astype float half double bfloat16 int long bool byte short copy""".split())


def is_inplace(name: str, kwargs: dict) -> bool:
    if name.startswith("__i") or name == "__setitem__":
        return True
    if name.endswith("_") and not name.endswith("__"):
        return True
    return bool(kwargs.get("inplace")) or kwargs.get("out") is not None


_LIST_CACHE: Dict[Tuple[str, float], Dict[str, List[str]]] = {}


def load_api_list(path: str = API_LIST) -> Dict[str, List[str]]:
    """The sections of an API-list file (parsed once per file version: ~1,000 names)."""
    key = (path, os.path.getmtime(path))
    cached = _LIST_CACHE.get(key)
    if cached is None:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of sections to lists of names")
        unknown = set(data) - set(SECTIONS)
        if unknown:
            raise ValueError(f"{path}: unknown sections {sorted(unknown)}; allowed: {sorted(SECTIONS)}")
        cached = _LIST_CACHE[key] = {k: [str(n) for n in (v or [])] for k, v in data.items()}
    return {k: list(v) for k, v in cached.items()}


def _resolve(owner: Any, dotted: str) -> Tuple[Any, str, Any]:
    parts = dotted.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    return owner, parts[-1], getattr(owner, parts[-1])


_MISSING = object()


class ApiPatcher:
    """Installs wrappers that report to `runner(orig, base, name, args, kwargs)`."""

    def __init__(self, runner: Callable, switch: Any):
        self.runner = runner
        self.switch = switch
        self._saved: List[Tuple[Any, str, Any]] = []

    @property
    def count(self) -> int:
        return len(self._saved)

    def install(self, api_list: Optional[Dict[str, List[str]]] = None) -> int:
        from mindspore import Tensor

        api_list = api_list if api_list is not None else load_api_list()
        for section, names in api_list.items():
            namespace, prefix = SECTIONS[section]
            if namespace is None:
                owner = Tensor
            else:
                try:
                    owner = importlib.import_module(namespace)
                except ImportError:
                    continue
            for name in names:
                self.patch(owner, name, f"{prefix}.{name}")
        return len(self._saved)

    def patch(self, owner: Any, dotted: str, base: str) -> bool:
        try:
            parent, attr, orig = _resolve(owner, dotted)
        except AttributeError:
            return False
        if not callable(orig) or isinstance(orig, type) or getattr(orig, "__tsprobe_orig__", None):
            return False
        self._saved.append((parent, attr, parent.__dict__.get(attr, _MISSING)))
        setattr(parent, attr, self._wrap(orig, base, attr))
        return True

    def restore_one(self, owner: Any, dotted: str) -> bool:
        parent, attr, _ = _resolve(owner, dotted)
        for i, (p, a, orig) in enumerate(self._saved):
            if p is parent and a == attr:
                self._put_back(p, a, orig)
                del self._saved[i]
                return True
        return False

    def restore(self) -> None:
        while self._saved:
            self._put_back(*self._saved.pop())

    @staticmethod
    def _put_back(parent: Any, attr: str, orig: Any) -> None:
        if orig is _MISSING:
            delattr(parent, attr)
        else:
            setattr(parent, attr, orig)

    def _wrap(self, orig: Callable, base: str, name: str) -> Callable:
        runner, switch = self.runner, self.switch

        @functools.wraps(orig)
        def wrapper(*args, **kwargs):
            if DEPTH.value or not switch.active:
                return orig(*args, **kwargs)
            return runner(orig, base, name, args, kwargs)

        wrapper.__tsprobe_orig__ = orig
        return wrapper


def run_api(collector, orig: Callable, base: str, name: str, args: tuple, kwargs: dict,
            pending: Optional[Pending], inplace: Optional[bool] = None) -> Any:
    """Record one call: inputs before it runs, outputs after, gradients when they come.
    `pending` is None when backward records are not wanted."""
    DEPTH.value += 1
    try:
        call = collector.begin(base, is_module=False)
        if not call.selected:
            try:
                return orig(*args, **kwargs)
            finally:
                collector.end(call)
        capture = None
        run_args, run_kwargs = args, kwargs
        if inplace is None:
            inplace = is_inplace(name, kwargs)
        if pending is not None and grad_recording():
            capture = GradCapture(lambda go, gi: collector.backward(call, go, gi), pending)
            if not inplace and name not in ALIASING and not base.startswith(_COLLECTIVE_PREFIXES):
                # Tap before summarising: the summary's statistics ops would otherwise be
                # waited for by the tap (each MindSpore hook placement syncs the pipeline).
                run_args, run_kwargs = capture.tap_inputs(args, kwargs)
        collector.forward_inputs(call, args, kwargs)
        args, kwargs = run_args, run_kwargs
        try:
            out = orig(*args, **kwargs)      # still at depth > 0: nested APIs are not recorded
        finally:
            collector.end(call)
        if capture is not None:
            # An output that is an input returned as-is carries no gradient of this call
            # (in-place calls excepted: their output is the input's new value).
            skip = () if inplace else {id(t) for t in flat_tensors((args, kwargs), [])}
            capture.watch_outputs(out, skip)
        collector.forward_outputs(call, out)
        return out
    finally:
        DEPTH.value -= 1
