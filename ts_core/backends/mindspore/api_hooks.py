"""L1: wrap ``mindspore.ops``, ``mindspore.mint``, ``mint.nn.functional``, ``Tensor`` methods and
operators, and communication functions listed in ``api_list.yaml``. Every patch is undone
by ``restore``.

The wrapper's fast path is two attribute reads: not collecting, or already inside a wrapped
call (nested calls, and tsprobe's own statistics ops, are not recorded).
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import yaml

from .. import patching
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


class ApiPatcher(patching.ApiPatcher):
    """mindspore.ops / mint / mint.nn.functional / Tensor / communication (see api_list.yaml)."""

    def _default_list(self) -> Dict[str, List[str]]:
        return load_api_list()

    def _owners(self, api_list: Dict[str, List[str]]) -> Iterator[Tuple[Any, str, List[str]]]:
        from mindspore import Tensor

        for section, names in api_list.items():
            namespace, prefix = SECTIONS[section]
            if namespace is None:
                owner = Tensor
            else:
                try:
                    owner = importlib.import_module(namespace)
                except ImportError:
                    continue
            yield owner, prefix, names


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
