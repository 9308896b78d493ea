"""A first divergence inside a model compiled as a whole (issue 37).

In compile_mode ``boundaries`` (the default) a model handed to the debugger as
``torch.compile(model)`` is recorded only at its boundary (``Module.Net.forward.0`` and its
backward: the compiled region's inputs, outputs and their gradients) and through its parameter
gradients; its dump.json carries a note saying so. A first divergence at that boundary, or at a
parameter gradient of a module inside the region, is then not the cause site it looks like: the
error entered somewhere inside the region. The first divergence says so, and names the one
option that records inside it.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, List, Optional

from ...dumpfmt.keys import parse_key
from ..model import FirstDivergence

OPTION = "compile_mode: shadow (TSPROBE_COMPILE=shadow)"
_NOTE = re.compile(r"the model (\w+) ran compiled as a whole")


def region_name(*dumps_notes: Iterable[str]) -> Optional[str]:
    """The class name of the model the dumps' notes say ran compiled as a whole (None: none did)."""
    for notes in dumps_notes:
        for note in notes:
            m = _NOTE.search(note)
            if m:
                return m.group(1)
    return None


def _boundary(key: str, region: str) -> bool:
    """Is `key` a record of the region's boundary (``Module.Net.*``, ``Module.0.Net.*``)?"""
    info = parse_key(key)
    return info.kind == "module" and re.fullmatch(rf"Module\.(\d+\.)?{re.escape(region)}", info.name) is not None


def without_lone_boundaries(seqs: List[List[Any]], region: Optional[str]) -> List[List[Any]]:
    """`seqs` less the region's boundary records that have no partner (the other dump ran the
    model eagerly, where the root module is not recorded): what ``same_program`` judges, so that
    the boundary alone is not taken for a module tree of another program."""
    if region is None:
        return seqs
    return [[cp for cp in seq if cp.matched or not _boundary(cp.key, region)] for seq in seqs]


def inside(fd: FirstDivergence, region: str) -> bool:
    """Is `fd` the region's boundary record (``Module.Net``, ``Module.0.Net`` for one model of
    several), a module's parameter gradient (every module of a model compiled as a whole lies
    inside its region), or a module record of one side only (the other dump, which ran the model
    eagerly, recorded the modules the region hides)?"""
    one_sided = fd.golden_key is None or fd.target_key is None
    for key in (fd.golden_key, fd.target_key, fd.key):
        if not key or not key.startswith("Module."):
            continue
        kind = parse_key(key).kind
        if _boundary(key, region) or kind == "parameters_grad" or (one_sided and kind == "module"):
            return True
    return False


def localise(fd: Optional[FirstDivergence], region: Optional[str]) -> None:
    """Reword `fd` in place when it lies inside `region`, compiled as a whole (see the module doc)."""
    if fd is None or region is None or not inside(fd, region):
        return
    fd.cause = (f"inside the compiled region {region}: the model ran compiled as a whole and only its boundary and "
                f"parameter gradients are recorded, so the error entered somewhere inside {region}, not at this "
                f"record; set {OPTION} to localise it further. ({fd.cause})")
