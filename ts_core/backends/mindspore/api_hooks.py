"""L1: which MindSpore APIs are wrapped: ``mindspore.ops``, ``mindspore.mint``,
``mint.nn.functional``, ``Tensor`` methods and operators, and communication functions listed in
``api_list.yaml``. The wrapper (patching.py) and the body that records a call
(base.Backend.run_api) are shared by backends.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple


from .. import patching

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
COLLECTIVE_PREFIXES = ("Distributed.", "MintDistributed.")

# Calls whose result may alias an input (views): the input must stay the caller's own tensor,
# so it is not routed through the gradient tap.
ALIASING = frozenset("""view view_as reshape reshape_as transpose permute __getitem__ narrow select
squeeze unsqueeze expand expand_as expand_dims flatten unflatten split chunk unbind tensor_split
movedim moveaxis swapaxes swapdims diagonal as_strided contiguous t T mT ravel broadcast_to
real imag to astype float half double bfloat16 int long bool byte short copy""".split())




def load_api_list(path: str = API_LIST) -> Dict[str, List[str]]:
    """The sections of this backend's API-list file."""
    return patching.read_api_list(path, SECTIONS)


class ApiPatcher(patching.ApiPatcher):
    """mindspore.ops / mint / mint.nn.functional / Tensor / communication (see api_list.yaml)."""

    aliasing = ALIASING
    collective_prefixes = COLLECTIVE_PREFIXES

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
