"""L1: which torch APIs are wrapped: torch.*, torch.nn.functional.*, torch.Tensor
methods/operators, torch._VF (what nn.LSTM/GRU/RNN call) and torch.distributed collectives
listed in ``api_list.yaml``. The wrapper
(patching.py) and the body that records a call (base.Backend.run_api) are shared by backends.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from .. import patching
from .compiled import in_compiler, skip_as_frame

API_LIST = os.path.join(os.path.dirname(__file__), "api_list.yaml")
# api_list.yaml section -> key prefix (msprobe's: its support_wrap_ops.yaml names the same sections)
PREFIXES = {"torch": "Torch", "functional": "Functional", "tensor": "Tensor", "distributed": "Distributed",
            "_VF": "VF"}
_NAMESPACES = {"torch": "torch", "functional": "torch.nn.functional", "distributed": "torch.distributed",
               "_VF": "torch._VF"}

# Calls whose result may alias an input: the input must stay the user's own tensor.
ALIASING = frozenset("""view view_as reshape reshape_as transpose transpose_ t permute __getitem__ narrow
select squeeze unsqueeze expand expand_as flatten unflatten split chunk unbind split_with_sizes
tensor_split hsplit vsplit dsplit movedim moveaxis swapaxes swapdims diagonal as_strided contiguous
detach detach_ unfold real imag view_as_real view_as_complex to type type_as float half double
bfloat16 int long bool byte char short cpu cuda adjoint mT mH T H ravel broadcast_to
broadcast_tensors atleast_1d atleast_2d atleast_3d align_to align_as rename""".split())


def load_api_list(path: str = API_LIST) -> Dict[str, List[str]]:
    """The sections of this backend's API-list file."""
    return patching.read_api_list(path, PREFIXES)


class ApiPatcher(patching.ApiPatcher):
    """torch.*, torch.nn.functional.*, torch.Tensor, torch._VF, torch.distributed (see api_list.yaml)."""

    aliasing = ALIASING
    collective_prefixes = ("Distributed",)
    compiling = staticmethod(in_compiler)

    def _default_list(self) -> Dict[str, List[str]]:
        return load_api_list()

    def _wrap(self, orig, base: str, name: str):
        wrapper = super()._wrap(orig, base, name)
        skip_as_frame(wrapper.__code__)       # never a torch.compile frame of its own (compiled.py)
        return wrapper

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


def node_target(out: Any, args: tuple, inplace: bool) -> Optional[torch.Tensor]:
    """The tensor whose autograd node sees this call's gradients (node strategy), or None."""
    if inplace:
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        return first if first is not None and first.requires_grad else None
    outs = out if isinstance(out, (list, tuple)) else (out,)
    inputs = {id(a) for a in args if isinstance(a, torch.Tensor)}
    for t in outs:
        if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None:
            return None if id(t) in inputs else t     # returned an input as-is: nothing to hook
    return None
