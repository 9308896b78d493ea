"""Key names, msprobe-compatible.

API calls:  ``{Prefix}.{api}.{n}.{forward|backward}``        e.g. ``Functional.linear.0.forward``
Modules:    ``Module.{path}.{Class}.{forward|backward}.{n}``  e.g. ``Module.fc.Linear.forward.0``
Param grads ``Module.{path}.{Class}.parameters_grad.{n}``
"""
from __future__ import annotations

from collections import defaultdict

FORWARD, BACKWARD = "forward", "backward"


def api_key(base: str, index: int, direction: str) -> str:
    return f"{base}.{index}.{direction}"


def module_key(base: str, index: int, direction: str) -> str:
    return f"{base}.{direction}.{index}"


def params_grad_key(base: str, index: int = 0) -> str:
    return f"{base}.parameters_grad.{index}"


def without_direction(key: str) -> str:
    """``Functional.linear.0.forward`` and ``Module.fc.Linear.forward.0`` -> call name without direction."""
    parts = key.split(".")
    return ".".join(p for p in parts if p not in (FORWARD, BACKWARD))


class CallCounter:
    """Per-step call numbering: the n-th call of the same base name gets index n."""

    def __init__(self) -> None:
        self._next: dict[str, int] = defaultdict(int)

    def next(self, base: str) -> int:
        n = self._next[base]
        self._next[base] = n + 1
        return n

    def reset(self) -> None:
        self._next.clear()
