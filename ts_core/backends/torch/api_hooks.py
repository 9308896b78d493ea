"""L1: wrap torch.*, torch.nn.functional.*, torch.Tensor methods/operators and
torch.distributed collectives listed in ``api_list.yaml``. Every patch is undone by ``restore``.

The wrapper's fast path is two attribute reads: not collecting, or already inside a wrapped
call (nested calls are recorded once, at the outer call).
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import yaml

from .. import patching
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


class ApiPatcher(patching.ApiPatcher):
    """torch.*, torch.nn.functional.*, torch.Tensor, torch.distributed (see api_list.yaml)."""

    def _default_list(self) -> Dict[str, List[str]]:
        return load_api_list()

    def _owners(self, api_list: Dict[str, List[str]]) -> Iterator[Tuple[Any, str, List[str]]]:
        for section, names in api_list.items():
            if section == "tensor":
                owner = torch.Tensor
            else:
                try:
                    owner = importlib.import_module(_NAMESPACES[section])
                except ImportError:
                    continue
            yield owner, PREFIXES[section], names


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
                capture.watch_inputs(args, kwargs)
        try:
            out = orig(*args, **kwargs)      # still at depth > 0: nested APIs are not recorded
        finally:
            collector.end(call)
        if capture is not None:
            if capture.watching:
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
