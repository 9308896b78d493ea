"""``record_hyperparameters``: the user's call that adds hyperparameters to the fingerprint
(collect.py). Apart from collect.py because it looks up the open debugger, and the debugger
calls collect.py: one direction each, no import cycle."""
from __future__ import annotations

from typing import Any

from .collect import add_hyperparameters


def record_hyperparameters(values: Any, debugger: Any = None) -> None:
    """Add hyperparameters to the fingerprint of the current (or given) debugger: a dict, an
    ``argparse.Namespace``, a dataclass, any object with ``__dict__``, or the path of a JSON or
    YAML file. Written into the open step folder's fingerprint and every later one."""
    from ..debugger import PrecisionDebugger

    dbg = debugger or PrecisionDebugger.current()
    if dbg is None:
        raise RuntimeError("record_hyperparameters: no PrecisionDebugger is open; create one first")
    add_hyperparameters(dbg, values)
