"""From dump.json records to replay plans: which callable, which arguments, which outputs.

A plan keeps tensors as references to their ``.npy`` files (loaded only when replayed) and
non-tensor values decoded from their ``{type, value}`` summaries. Anything that makes a call
impossible to replay is written into ``plan.problem`` in words, so the report lists it;
nothing is dropped silently. Framework objects (``torch.dtype``, devices) are decoded by the
framework's replayer (``backends/<framework>/replay.py``). Needs only numpy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..dumpfmt import BACKWARD, FORWARD, api_key, is_tensor_summary, parse_key
from ..dumpfmt.records import flatten



@dataclass
class TensorArg:
    """One recorded tensor: where its data is and what it was."""

    name: str                  # KEY.input.0
    dtype: str                 # as recorded: torch.bfloat16, Float32 ...
    shape: List[int]
    requires_grad: bool
    data_name: Optional[str]


@dataclass
class OtherArg:
    """A framework value recorded as ``{type, value}`` (``torch.dtype``, ``torch.Size``, a device)."""

    type: str
    value: Any


@dataclass
class Unrecorded:
    """A value the dump summarised without content (``{type: "Foo", value: null}``)."""

    type: str


@dataclass
class CallPlan:
    key: str                   # Functional.linear.0.forward
    name: str                  # Functional.linear
    api: str                   # linear (the part after the prefix; linalg.norm for Torch.linalg.norm)
    args: List[Any]
    kwargs: Dict[str, Any]
    outputs: List[Tuple[str, Any]]           # (output.0, leaf) in flatten order
    grad_inputs: List[Tuple[str, Any]] = field(default_factory=list)    # backward record "input"
    grad_outputs: List[Tuple[str, Any]] = field(default_factory=list)   # backward record "output"
    backward_key: Optional[str] = None
    problem: Optional[str] = None            # why it cannot be replayed, if known before trying
    backward_problem: Optional[str] = None

    @property
    def prefix(self) -> str:
        return self.name.split(".", 1)[0]

    def tensors(self) -> List[TensorArg]:
        out: List[TensorArg] = []
        _collect(self.args, out)
        _collect(self.kwargs, out)
        return out


def _collect(value: Any, out: List[TensorArg]) -> None:
    if isinstance(value, TensorArg):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, out)


_PLAIN = {"int": int, "float": float, "bool": bool, "str": str}


def decode(value: Any, name: str) -> Any:
    """A recorded argument structure -> plan values (TensorArg / OtherArg / plain / structure)."""
    if value is None:
        return None
    if is_tensor_summary(value):
        return TensorArg(name, str(value.get("dtype")), list(value.get("shape") or []),
                         bool(value.get("requires_grad")), value.get("data_name"))
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        t, v = value["type"], value.get("value")
        if t in _PLAIN:
            return v if not (t == "float" and isinstance(v, str)) else float(v)    # "nan", "inf"
        if t == "slice" and isinstance(v, list) and len(v) == 3:
            return slice(*v)
        if t == "ellipsis":
            return Ellipsis
        if v is None:
            return Unrecorded(t)
        return OtherArg(t, v)
    if isinstance(value, list):
        return [decode(v, f"{name}.{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: decode(v, f"{name}.{k}") for k, v in value.items()}
    return value


def _unrecorded(value: Any, name: str) -> Optional[str]:
    """Why the first argument whose content the dump does not hold cannot be rebuilt."""
    if isinstance(value, Unrecorded):
        return f"argument {name} (a {value.type}) is recorded without its value"
    if isinstance(value, TensorArg) and not value.data_name:
        return f"argument {value.name} has no tensor data (a statistics dump: acc-check needs task: tensor)"
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            hit = _unrecorded(v, f"{name}.{i}")
            if hit:
                return hit
    if isinstance(value, dict):
        for k, v in value.items():
            hit = _unrecorded(v, f"{name}.{k}")
            if hit:
                return hit
    return None


def api_of(name: str) -> str:
    """``Torch.linalg.norm`` -> ``linalg.norm``; ``mylib.ops.fused_gelu`` -> ``fused_gelu``."""
    return name.split(".", 1)[1] if "." in name else name


def build_plans(data: Dict[str, Any], random_apis: List[str]) -> Tuple[List[CallPlan], Dict[str, int]]:
    """A plan for every forward API record of one dump.json, in execution order; and counts of
    the records that are not API calls (modules, parameter gradients, debug saves)."""
    plans: List[CallPlan] = []
    other = {"module": 0, "parameters_grad": 0, "other": 0}
    for key, rec in data.items():
        info = parse_key(key)
        if info.kind != "api":
            other[info.kind if info.kind in other else "other"] += 1
            continue
        if info.direction != FORWARD or not isinstance(rec, dict):
            continue
        plans.append(_plan(key, info, rec, data, random_apis))
    return plans, other


def _plan(key: str, info, rec: Dict[str, Any], data: Dict[str, Any], random_apis: List[str]) -> CallPlan:
    args = decode(rec.get("input_args") or [], "input")
    kwargs = decode(rec.get("input_kwargs") or {}, "input")
    if not isinstance(kwargs, dict):
        kwargs = {}
    outputs = list(flatten(rec.get("output"), "output"))
    api = api_of(info.name)
    plan = CallPlan(key, info.name, api, args if isinstance(args, list) else [args], kwargs, outputs)
    bkey = api_key(info.name, info.counter, BACKWARD)
    brec = data.get(bkey)
    if isinstance(brec, dict):
        plan.backward_key = bkey
        plan.grad_inputs = list(flatten(brec.get("input"), "input"))
        plan.grad_outputs = list(flatten(brec.get("output"), "output"))
        missing = [n for n, leaf in plan.grad_inputs + plan.grad_outputs
                   if is_tensor_summary(leaf) and not leaf.get("data_name")]
        if missing:
            plan.backward_problem = f"no tensor data for {bkey}.{missing[0]} (a statistics dump)"
    short = api.rsplit(".", 1)[-1]
    if short in random_apis and not _deterministic_dropout(short, plan):
        plan.problem = "random: its output depends on the random generator's state, not only on its inputs"
    elif not any(is_tensor_summary(leaf) or leaf is not None for _, leaf in outputs):
        plan.problem = "no output recorded (nothing to grade)"
    else:
        plan.problem = _unrecorded(plan.args, "input") or _unrecorded(plan.kwargs, "input")
        if plan.problem is None:
            missing = [n for n, leaf in outputs if is_tensor_summary(leaf) and not leaf.get("data_name")]
            if missing:
                plan.problem = f"output {missing[0]} has no tensor data (a statistics dump: acc-check needs task: tensor)"
    return plan


def _deterministic_dropout(api: str, plan: CallPlan) -> bool:
    """``F.dropout(x, p, training=False)`` or ``p=0`` returns its input: replayable."""
    if "dropout" not in api:
        return False
    p = plan.kwargs.get("p", plan.args[1] if len(plan.args) > 1 else 0.5)
    training = plan.kwargs.get("training", plan.args[2] if len(plan.args) > 2 else True)
    return training is False or p == 0
