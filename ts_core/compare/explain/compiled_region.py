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
from typing import Iterable, Optional

from ...dumpfmt.keys import parse_key
from ..model import FirstDivergence

OPTION = "compile_mode: shadow (TSPROBE_COMPILE=shadow)"
_NOTE = re.compile(r"the model (\w+) ran compiled as a whole")


def region_name(notes: Iterable[str]) -> Optional[str]:
    """The class name of the model a dump's notes say ran compiled as a whole (None: none did)."""
    for note in notes:
        m = _NOTE.search(note)
        if m:
            return m.group(1)
    return None


def inside(fd: FirstDivergence, region: str) -> bool:
    """Is `fd` the region's boundary record (``Module.Net``, ``Module.0.Net`` for one model of
    several) or a module's parameter gradient (every module of a model compiled as a whole lies
    inside its region)?"""
    for key in (fd.golden_key, fd.target_key, fd.key):
        if not key:
            continue
        info = parse_key(key)
        if info.prefix != "Module":
            continue
        if info.kind == "parameters_grad" or re.fullmatch(rf"Module\.(\d+\.)?{re.escape(region)}", info.name):
            return True
    return False


def localise(fd: Optional[FirstDivergence], *dumps_notes: Iterable[str]) -> None:
    """Reword `fd` in place when it lies inside a region compiled as a whole (see the module doc)."""
    if fd is None:
        return
    region = next((name for notes in dumps_notes for name in [region_name(notes)] if name), None)
    if region is None or not inside(fd, region):
        return
    fd.cause = (f"inside the compiled region {region}: the model ran compiled as a whole and only its boundary and "
                f"parameter gradients are recorded, so the error entered somewhere inside {region}, not at this "
                f"record; set {OPTION} to localise it further. ({fd.cause})")
