"""What a framework replayer returns, and how a callable is found from a dotted name.

The replayers (``backends/torch/replay.py``, ``backends/mindspore/replay.py``) share this
contract so the grading in ``check.py`` is framework-neutral. Needs only the standard library.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional


class ReplayError(Exception):
    """This call cannot be replayed; the message says why (it goes into the report)."""


@dataclass
class Resolved:
    """The callable a key names, and whether it is an implementation independent of the one
    that produced the recorded output (a framework API or a user's reference: it also gives a
    same-precision peer) or the recorded function itself (a custom API without reference)."""

    fn: Callable
    independent: bool
    how: str = ""


@dataclass
class Outcome:
    """Outputs of one replay, flattened in the order of the recorded outputs: float64 arrays
    for tensors (integers keep an integer array), plain values, or None."""

    reference: List[Any]
    peer: Optional[List[Any]] = None
    notes: List[str] = field(default_factory=list)
    grads_reference: Optional[List[Any]] = None     # in the order of the recorded backward "output"
    grads_peer: Optional[List[Any]] = None
    backward_note: str = ""


def describe(fn: Any) -> str:
    """A short name for a reference callable (``gelu``, ``gelu(approximate='tanh')``)."""
    inner = getattr(fn, "func", None)           # functools.partial
    if inner is not None:
        args = [repr(a) for a in getattr(fn, "args", ())] + [f"{k}={v!r}" for k, v in (fn.keywords or {}).items()]
        return f"{describe(inner)}({', '.join(args)})"
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def import_dotted(path: str) -> Any:
    """``pkg.mod:func`` or ``pkg.mod.func`` (``pkg.mod.Class.method`` too) -> the object.
    Raises ReplayError naming what could not be imported."""
    if ":" in path:
        mod_name, _, attr = path.partition(":")
        candidates = [(mod_name, attr.split("."))]
    else:
        bits = path.split(".")
        candidates = [(".".join(bits[:i]), bits[i:]) for i in range(len(bits) - 1, 0, -1)]
    last: Optional[str] = None
    for mod_name, attrs in candidates:
        try:
            obj = importlib.import_module(mod_name)
        except ImportError as e:
            last = str(e)
            continue
        except Exception as e:  # the module's own code failed
            raise ReplayError(f"importing {mod_name} failed: {type(e).__name__}: {e}") from None
        try:
            for a in attrs:
                obj = getattr(obj, a)
        except AttributeError:
            last = f"{mod_name} has no {'.'.join(attrs)}"
            continue
        return obj
    raise ReplayError(f"cannot import {path} ({last or 'not a dotted name'})")
