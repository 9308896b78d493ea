"""Record keys, msprobe-compatible: the one place that builds and parses them.

API calls   ``{Prefix}.{api}.{n}.{forward|backward}``                ``Functional.linear.0.forward``
Modules     ``{Module|Cell}.{path}.{Class}.{forward|backward}.{n}``  ``Module.fc.Linear.forward.0``
Param grads ``{Module|Cell}.{path}.{Class}.parameters_grad.{n}``
Primitives  ``Primitive.{attr}.{PrimitiveClass}.{n}.{direction}``    (an API key)
Jit regions ``Jit.{function or Cell class}.{n}.{direction}``          (an API key: ``Jit.fused.0.forward``)
Debug save  ``{name}.{n}.debug``
Values of a record are named by suffixes: ``KEY.input.0``, ``KEY.output.0``,
``KEY.parameters.weight``, ``KEY.input.eps`` (a keyword argument).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Tuple

FORWARD, BACKWARD, PARAMETERS_GRAD, DEBUG, OTHER = "forward", "backward", "parameters_grad", "debug", "other"
MODULE_PREFIXES = ("Module", "Cell")
PRIMITIVE_PREFIX = "Primitive"
JIT_PREFIX = "Jit"          # a mindspore.jit region recorded at its boundary (seed 003)

_API = re.compile(r"^(?P<name>.+)\.(?P<n>\d+)\.(?P<dir>forward|backward)$")
_MODULE = re.compile(r"^(?P<name>.+)\.(?P<dir>forward|backward|parameters_grad)\.(?P<n>\d+)$")


def api_key(base: str, index: int, direction: str) -> str:
    return f"{base}.{index}.{direction}"


def jit_base(name: str) -> str:
    """``Jit.fused``: the base of a ``mindspore.jit`` region's API keys (function name, or the
    class name of a Cell whose ``construct`` is decorated)."""
    return f"{JIT_PREFIX}.{name}"


def api_base(prefix: str, name: str) -> str:
    """``Functional.linear``: the base of an API's keys (`prefix` from api_list.yaml)."""
    return f"{prefix}.{name}"


def primitive_base(attr: str, class_name: str) -> str:
    """``Primitive.matmul.MatMul``: the base of a MindSpore Primitive call made through a Cell
    attribute."""
    return f"{PRIMITIVE_PREFIX}.{attr}.{class_name}"


def module_key(base: str, index: int, direction: str) -> str:
    return f"{base}.{direction}.{index}"


def params_grad_key(base: str, index: int = 0) -> str:
    return f"{base}.{PARAMETERS_GRAD}.{index}"


def debug_key(name: str, index: int) -> str:
    return f"{name}.{index}.{DEBUG}"


def module_base(path: str, class_name: str, prefix: str = "Module") -> str:
    """``Module.encoder.layer.0.Linear``: the name every record of that module starts with."""
    return f"{prefix}.{path}.{class_name}" if path else f"{prefix}.{class_name}"


def value_name(key: str, part: object, index: object = None) -> str:
    """``KEY.input.0``, ``KEY.parameters.weight``, ``NAME.0`` (a nested value): the name of one
    value of a record (and the stem of its tensor file). On the recording hot path."""
    return f"{key}.{part}" if index is None else f"{key}.{part}.{index}"


@dataclass(frozen=True)
class KeyInfo:
    key: str
    name: str                  # without counter and direction: "Functional.linear", "Module.fc.Linear"
    direction: str             # forward / backward (parameters_grad counts as backward) / other
    counter: Optional[int]
    kind: str                  # "api", "module", "parameters_grad" or "other"

    @property
    def prefix(self) -> str:
        """``Functional``, ``Tensor``, ``Module``, ``Cell``, ``Primitive`` ..."""
        return self.name.split(".", 1)[0]

    @property
    def module_path(self) -> str:
        """``encoder.layer.0`` of ``Module.encoder.layer.0.Linear`` ("" for APIs)."""
        return split_module_name(self.name)[1] if self.kind in ("module", "parameters_grad") else ""

    @property
    def class_name(self) -> str:
        """``Linear`` of a module key, ``MatMul`` of a Primitive key, else ""."""
        if self.kind in ("module", "parameters_grad") or self.prefix == "Primitive":
            return self.name.rsplit(".", 1)[-1] if "." in self.name else ""
        return ""

    @property
    def api_name(self) -> str:
        """``linear`` of ``Functional.linear``, ``matmul`` of ``Primitive.matmul.MatMul``."""
        if self.kind != "api":
            return ""
        parts = self.name.split(".")
        return parts[1] if len(parts) > 1 else parts[0]

    def with_counter(self, counter: int) -> str:
        """The same call renumbered (per-request split: counters restart in each new dump)."""
        if self.kind == "api":
            return api_key(self.name, counter, self.direction)
        if self.kind == "parameters_grad":
            return params_grad_key(self.name, counter)
        if self.kind == "module":
            return module_key(self.name, counter, self.direction)
        return self.key

    @property
    def forward_key(self) -> str:
        """The forward key of a backward/parameters_grad key (where its stack is recorded)."""
        if self.kind in ("module", "parameters_grad"):
            return module_key(self.name, self.counter, FORWARD)
        if self.kind == "api":
            return api_key(self.name, self.counter, FORWARD)
        return self.key


@lru_cache(maxsize=65536)
def parse_key(key: str) -> KeyInfo:
    """Any key of a tsprobe or msprobe dump. Debug-level keys (``x.0.debug``) and unknown shapes
    come back whole, as kind and direction "other" (compare pairs them by exact key)."""
    m = _MODULE.match(key)
    if m:
        d = m.group("dir")
        kind = "parameters_grad" if d == PARAMETERS_GRAD else "module"
        return KeyInfo(key, m.group("name"), FORWARD if d == FORWARD else BACKWARD, int(m.group("n")), kind)
    m = _API.match(key)
    if m:
        return KeyInfo(key, m.group("name"), m.group("dir"), int(m.group("n")), "api")
    return KeyInfo(key, key, OTHER, None, "other")


def forward_key(key: str) -> str:
    return parse_key(key).forward_key


def without_direction(key: str) -> str:
    """``Functional.linear.0.forward`` / ``Module.fc.Linear.forward.0`` -> the call's name with its
    counter but without direction (``Functional.linear.0``, ``Module.fc.Linear.0``); a name
    given without direction comes back unchanged."""
    parts = key.split(".")
    return ".".join(p for p in parts if p not in (FORWARD, BACKWARD))


def split_module_name(name: str) -> Tuple[str, str, str]:
    """``Cell.attn.q.Dense`` -> ("Cell", "attn.q", "Dense"); ``Module.Linear`` -> ("Module", "", "Linear")."""
    parts = name.split(".")
    if len(parts) == 1:
        return parts[0], "", ""
    return parts[0], ".".join(parts[1:-1]), parts[-1]
