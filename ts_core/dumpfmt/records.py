"""The shape of one record of dump.json and of the summaries inside it.

Forward record   ``{"input_args": [...], "input_kwargs": {...}, "output": [...], "parameters": {...}}``
Backward record  ``{"input": [grads of the forward outputs], "output": [grads of the inputs]}``
parameters_grad  ``{"weight": [summary], "bias": [summary]}``
Tensor summary   ``{"type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"}``
                 (+ ``"md5"``, ``"data_name"``); other values ``{"type": "int", "value": 3}``.
                 A value read from memory nothing had written yet: ``"uninitialized": true``
                 and no statistics.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, List, Tuple

STAT_FIELDS = ("Max", "Min", "Mean", "Norm")
# a summary flag: the value was read from memory nothing had written yet (no statistics, never compared)
UNINITIALIZED = "uninitialized"
INPUT_ARGS, INPUT_KWARGS, OUTPUT_FIELD, PARAMETERS, BACKWARD_INPUT = (
    "input_args", "input_kwargs", "output", "parameters", "input")
INPUT, OUTPUT, PARAMETER = "input", "output", "parameter"       # roles of recorded values

# record field -> (role, the name its values carry: KEY.input.0, KEY.parameters.weight)
FIELD_ROLES = {INPUT_ARGS: (INPUT, "input"), INPUT_KWARGS: (INPUT, "input"), BACKWARD_INPUT: (INPUT, "input"),
               OUTPUT_FIELD: (OUTPUT, "output"), PARAMETERS: (PARAMETER, "parameters")}


def is_tensor_summary(v: Any) -> bool:
    return isinstance(v, dict) and isinstance(v.get("type"), str) and "shape" in v and "dtype" in v \
        and "value" not in v


@dataclass
class Entry:
    """One recorded value of a call: a tensor summary, a non-tensor value, or None."""

    role: str        # input / output / parameter
    arg: str         # "input.0", "input.eps", "output.0", "parameters.weight", "weight"
    leaf: Any        # summary dict, {"type","value"} dict, or None

    @property
    def is_tensor(self) -> bool:
        return is_tensor_summary(self.leaf)


def _is_leaf(v: Any) -> bool:
    return v is None or not isinstance(v, (dict, list)) or (isinstance(v, dict) and isinstance(v.get("type"), str))


def flatten(value: Any, prefix: str) -> Iterator[Tuple[str, Any]]:
    """(name, leaf) of every leaf of a nested argument structure, in argument order."""
    if _is_leaf(value):
        if value is not None and not isinstance(value, dict):
            value = {"type": type(value).__name__, "value": value}
        yield prefix, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from flatten(v, f"{prefix}.{k}")
    else:
        for i, v in enumerate(value):
            yield from flatten(v, f"{prefix}.{i}")


def record_entries(record: Any, is_params_grad: bool = False) -> List[Entry]:
    """Every value of one record, named as msprobe names them (``input.0``, ``output.0``,
    ``parameters.weight``; a parameters_grad record's values are named by parameter)."""
    if not isinstance(record, dict):
        return []
    out: List[Entry] = []
    if is_params_grad:
        for name, v in record.items():
            if isinstance(v, list) and len(v) == 1:      # msprobe writes {"weight": [summary]}
                v = v[0]
            out.extend(Entry(OUTPUT, a, leaf) for a, leaf in flatten(v, name))
        return out
    for section, v in record.items():
        role, name = FIELD_ROLES.get(section, (None, section))
        if role is None:
            low = section.lower()
            role = OUTPUT if "output" in low else PARAMETER if "param" in low else INPUT
        out.extend(Entry(role, a, leaf) for a, leaf in flatten(v, name))
    return out


def map_summaries(value: Any, fn) -> Any:
    """`value` (a record or part of one) with every tensor summary replaced by ``fn(summary)``."""
    if isinstance(value, list):
        return [map_summaries(v, fn) for v in value]
    if isinstance(value, dict):
        if is_tensor_summary(value):
            return fn(value)
        return {k: map_summaries(v, fn) for k, v in value.items()}
    return value
