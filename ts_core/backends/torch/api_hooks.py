"""L1: wrap torch.*, torch.nn.functional.*, torch.Tensor methods/operators and
torch.distributed collectives listed in ``api_list.yaml``. Every patch is undone by ``restore``.

The wrapper's fast path is two attribute reads: not collecting, or already inside a wrapped
call (nested calls are recorded once, at the outer call).
"""
from __future__ import annotations

import functools
import importlib
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import yaml

from .._depth import DEPTH
from .grad_capture import GradCapture

API_LIST = os.path.join(os.path.dirname(__file__), "api_list.yaml")
PREFIXES = {"torch": "Torch", "functional": "Functional", "tensor": "Tensor", "distributed": "Distributed"}
_NAMESPACES = {"torch": "torch", "functional": "torch.nn.functional", "distributed": "torch.distributed"}

# Calls whose result may alias an input: the input must stay the user's own tensor.
ALIASING = frozenset("""view view_as reshape reshape_as transpose transpose_ t permute __getitem__ narrow
select squeeze unsqueeze expand expand_as flatten unflatten split chunk unbind split_with_sizes
tensor_split hsplit vsplit dsplit movedim moveaxis swapaxes swapdims diagonal as_strided contiguous
detach detach_ unfold real imag view_as_real view_as_complex to type type_as float half double
bfloat16 int long bool byte char short cpu cuda adjoint mT mH T H ravel broadcast_to
broadcast_tensors atleast_1d atleast_2d atleast_3d align_to align_as rename""".split())


def is_inplace(name: str, kwargs: dict) -> bool:
    if name.startswith("__i") or name == "__setitem__":
        return True
    if name.endswith("_") and not name.endswith("__"):
        return True
    return bool(kwargs.get("inplace")) or kwargs.get("out") is not None


def load_api_list(path: str = API_LIST) -> Dict[str, List[str]]:
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    unknown = set(data) - set(PREFIXES)
    if unknown:
        raise ValueError(f"{path}: unknown sections {sorted(unknown)}; allowed: {sorted(PREFIXES)}")
    return {k: list(v or []) for k, v in data.items()}


def _resolve(owner: Any, dotted: str) -> Tuple[Any, str, Any]:
    parts = dotted.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    return owner, parts[-1], getattr(owner, parts[-1])


class ApiPatcher:
    """Installs wrappers that report to `runner(orig, base, name, args, kwargs)`."""

    def __init__(self, runner: Callable, switch: Any):
        self.runner = runner
        self.switch = switch
        self._saved: List[Tuple[Any, str, Any]] = []

    def install(self, api_list: Optional[Dict[str, List[str]]] = None) -> int:
        api_list = api_list if api_list is not None else load_api_list()
        for section, names in api_list.items():
            if section == "tensor":
                owner = torch.Tensor
            else:
                try:
                    owner = importlib.import_module(_NAMESPACES[section])
                except ImportError:
                    continue
            for name in names:
                self.patch(owner, name, f"{PREFIXES[section]}.{name}")
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


_MISSING = object()


def run_api(collector, orig: Callable, base: str, name: str, args: tuple, kwargs: dict,
            want_backward: bool) -> Any:
    """Record one API call: inputs before it runs, outputs after, gradients when they come."""
    DEPTH.value += 1
    try:
        call = collector.begin(base, is_module=False)
        if not call.selected:
            try:
                return orig(*args, **kwargs)
            finally:
                collector.end(call)
        collector.forward_inputs(call, args, kwargs)
        capture = None
        inplace = False
        if want_backward and torch.is_grad_enabled():
            capture = GradCapture(lambda go, gi: collector.backward(call, go, gi))
            inplace = is_inplace(name, kwargs)
            if not inplace and name not in ALIASING and not base.startswith("Distributed"):
                args, kwargs = capture.tap_inputs(args, kwargs)
        try:
            out = orig(*args, **kwargs)      # still at depth > 0: nested APIs are not recorded
        finally:
            collector.end(call)
        if capture is not None:
            if capture.tapped:
                capture.watch_outputs(out)
            else:
                capture.watch_node(_node_target(out, args, inplace))
        collector.forward_outputs(call, out)
        return out
    finally:
        DEPTH.value -= 1


def _node_target(out: Any, args: tuple, inplace: bool) -> Optional[torch.Tensor]:
    if inplace:
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        return first if first is not None and first.requires_grad else None
    outs = out if isinstance(out, (list, tuple)) else (out,)
    inputs = {id(a) for a in args if isinstance(a, torch.Tensor)}
    for t in outs:
        if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None:
            return None if id(t) in inputs else t     # returned an input as-is: nothing to hook
    return None
