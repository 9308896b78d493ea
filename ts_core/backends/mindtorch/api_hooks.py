"""L1 under mindtorch: the torch API list (``backends/torch/api_list.yaml``, the same file the
PyTorch backend reads, as msprobe's MSAdapter scenario reuses its PyTorch list), patched where
mindtorch really defines each name.

``import torch`` under mindtorch yields proxy modules (``torch``, ``torch.nn.functional``) that
look attributes up in ``mindtorch`` / ``mindtorch.nn.functional`` on every access; a patch set on
a proxy would stay on the proxy, and ``nn.Linear`` (which calls ``mindtorch.nn.functional``)
would never see it. So the owners patched here are mindtorch's real modules, which both the
user's ``torch.*`` calls and mindtorch's own modules reach. Tensor methods live on MindSpore's
``Tensor`` class (mindtorch installs its torch methods there). Keys keep torch's prefixes
(``Torch``, ``Functional``, ``Tensor``, ``Distributed``) so a dump pairs name for name with a
real PyTorch dump of the same script.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Dict, Iterator, List, Tuple


from .. import patching

API_LIST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch", "api_list.yaml")
# api_list.yaml section -> (mindtorch module, key prefix); "tensor" is MindSpore's Tensor class.
SECTIONS: Dict[str, Tuple[str, str]] = {
    "torch": ("mindtorch", "Torch"),
    "functional": ("mindtorch.nn.functional", "Functional"),
    "tensor": ("mindspore", "Tensor"),
    "distributed": ("mindtorch.distributed", "Distributed"),
}

# Calls whose result may alias an input: the input must stay the caller's own tensor (torch's
# list, plus MindSpore's own names for the same views that mindtorch tensors also carry).
ALIASING = frozenset("""view view_as reshape reshape_as transpose transpose_ t permute __getitem__ narrow
select squeeze unsqueeze expand expand_as flatten unflatten split chunk unbind split_with_sizes
tensor_split hsplit vsplit dsplit movedim moveaxis swapaxes swapdims diagonal as_strided contiguous
detach detach_ unfold real imag view_as_real view_as_complex to type type_as float half double
bfloat16 int long bool byte char short cpu cuda adjoint mT mH T H ravel broadcast_to
broadcast_tensors atleast_1d atleast_2d atleast_3d align_to align_as rename
expand_dims astype copy""".split())

# On CPU mindtorch's views are copies, so only these stay untapped: calls that return their
# input itself when there is nothing to do (a cast to the same dtype), for which torch records
# no backward either.
RETURNS_SELF = frozenset("""contiguous detach detach_ to type type_as float half double bfloat16 int long
bool byte char short cpu cuda astype""".split())


# Sections of torch's list that mindtorch has no counterpart for (no torch._VF recurrent kernels).
NOT_IN_MINDTORCH = ("_VF",)


def load_api_list(path: str = API_LIST) -> Dict[str, List[str]]:
    """The sections of torch's API-list file that mindtorch has."""
    api_list = patching.read_api_list(path, set(SECTIONS) | set(NOT_IN_MINDTORCH))
    for section in NOT_IN_MINDTORCH:
        api_list.pop(section, None)
    return api_list


class ApiPatcher(patching.ApiPatcher):
    """mindtorch.*, mindtorch.nn.functional.*, Tensor methods, mindtorch.distributed."""

    aliasing = ALIASING
    collective_prefixes = ("Distributed",)

    def _default_list(self) -> Dict[str, List[str]]:
        return load_api_list()

    def _owners(self, api_list: Dict[str, List[str]]) -> Iterator[Tuple[Any, str, List[str]]]:
        for section, names in api_list.items():
            namespace, prefix = SECTIONS[section]
            try:
                module = importlib.import_module(namespace)
            except ImportError:
                continue
            yield (module.Tensor if section == "tensor" else module), prefix, names
