"""Which torch API calls msprobe (mindstudio-probe, PyTorch) records, so that a call that only
tsprobe recorded is told apart from one that only one program made.

msprobe hooks the names of its ``support_wrap_ops.yaml`` (sections ``functional``, ``tensor``,
``torch``, ``distributed``), and at its default ``risk_level: FOCUS`` leaves out the "low-risk"
ones of its ``api_risk_level.LOW_RISK_API_SET`` (views, casts, ``arange``, ``cat``...).
The list is read from the installed msprobe package when there is one (its file, never an
import: msprobe patches torch on import); otherwise from tsprobe's own API list less the names
msprobe 26.2's list lacks (``__getitem__``, ``__neg__``, ``view``).
"""
from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from typing import Dict, FrozenSet, Optional

# msprobe 26.2.0 msprobe/pytorch/dump/api_dump/api_risk_level.py: LOW_RISK_API_SET
LOW_RISK = frozenset("""squeeze unsqueeze reshape reshape_as view view_as flatten unflatten expand expand_as
repeat repeat_interleave tile transpose permute moveaxis movedim swapaxes swapdims chunk unsafe_chunk split
split_with_sizes unsafe_split unsafe_split_with_sizes tensor_split hsplit vsplit dsplit unbind stack cat concat
concatenate hstack vstack dstack column_stack row_stack align_as align_to atleast_1d atleast_2d atleast_3d ravel
clamp unfold type_as to float double int long half bfloat16 byte char bool cfloat numpy empty empty_like zeros
zeros_like ones ones_like full full_like arange linspace logspace eye identity diag diagflat diag_embed triu tril
triu_indices tril_indices clone __bool__ stride""".split())

_SECTIONS = {"Functional": "functional", "Tensor": "tensor", "Torch": "torch", "Distributed": "distributed"}
# tsprobe's torch list less msprobe 26.2's support_wrap_ops.yaml (tested: test_msprobe_interop.py)
NOT_IN_MSPROBE_LIST = {"tensor": frozenset({"__getitem__", "__neg__", "view"})}
TSPROBE_LIST = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "backends", "torch", "api_list.yaml")


def _msprobe_list_path() -> Optional[str]:
    spec = importlib.util.find_spec("msprobe")            # finds the package; imports nothing
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "pytorch", "dump", "api_dump", "support_wrap_ops.yaml")
        if os.path.isfile(path):
            return path
    return None


@lru_cache(maxsize=1)
def hooked() -> Dict[str, FrozenSet[str]]:
    """section -> the API names msprobe hooks (its own file when installed)."""
    import yaml

    path = _msprobe_list_path()
    with open(path or TSPROBE_LIST, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    less = {} if path else NOT_IN_MSPROBE_LIST
    return {s: frozenset(str(n) for n in data.get(s) or []) - less.get(s, frozenset()) for s in _SECTIONS.values()}


def msprobe_records(prefix: str, api: str, low_risk_too: bool = False) -> bool:
    """Would msprobe record a call of ``prefix.api`` (``Tensor``, ``view``)? ``low_risk_too``:
    the dump was made with ``risk_level: ALL`` (it holds low-risk calls)."""
    section = _SECTIONS.get(prefix)
    if section is None:
        return True          # VF, Aten, NPU...: not judged here
    return api in hooked()[section] and (low_risk_too or api not in LOW_RISK)


__all__ = ["LOW_RISK", "NOT_IN_MSPROBE_LIST", "hooked", "msprobe_records"]
