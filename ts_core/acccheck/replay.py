"""Replaying one recorded call: the flow every framework shares.

The reference run raises every float tensor (and float dtype argument) to float64 and runs on
CPU; when float64 is not implemented for a call on 16-bit data, float32 (msprobe's bench
precision for 16-bit) is used and the report says so. The peer run keeps the recorded dtypes
(msprobe's "GPU" side: a standard kernel of the same precision), only when the callable is
independent of the code that produced the recorded output. The backward replays the recorded
output gradients through the reference (and peer) forward.

What differs per framework (tensors, dtypes, calling, gradients) is an adapter:
``backends/torch/replay.py``, ``backends/mindspore/replay.py``.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Protocol, Tuple

import numpy as np

from .outcome import Outcome, ReplayError, Resolved
from .plan import CallPlan, OtherArg, TensorArg, decode
from .standards import dtype_name

Loader = Callable[[TensorArg], np.ndarray]
REFERENCE, PEER = "reference", "peer"
_LOW = ("float16", "bfloat16")


class Adapter(Protocol):
    """The framework side of a replay (see ``backends/torch/replay.py``)."""

    def resolve(self, plan: CallPlan, references: dict) -> Resolved: ...

    def tensor(self, arr: np.ndarray, dtype: str, shape: List[int], float_dtype: Optional[str]) -> Any:
        """A CPU tensor of `arr` in the recorded `dtype`, floats raised to `float_dtype` when given."""

    def other(self, o: OtherArg, float_dtype: Optional[str]) -> Any:
        """A framework value (dtype, device, Size) from its record; float dtypes raised likewise."""

    def is_tensor(self, x: Any) -> bool: ...

    def dtype(self, x: Any) -> str:
        """`x`'s dtype as its dumps write it (``torch.bfloat16``, ``BFloat16``)."""

    def to_numpy(self, x: Any) -> Any: ...

    def call(self, fn: Callable, args: list, kwargs: dict, autocast: Optional[str], grad: bool = False) -> Any:
        """``fn(*args, **kwargs)`` on CPU, under autocast to that dtype when given, recording
        gradients only when `grad`."""

    def shape(self, x: Any) -> List[int]: ...

    def vjp(self, run: Callable[[list], list], leaves: list, cotangents: Callable[[list], list]
            ) -> Tuple[list, list]:
        """Run ``run(leaves)`` -> outputs, then the gradients of the leaves given
        ``cotangents(outputs)`` (None where an output gets none). Returns (outputs, grads)."""


class _Builder:
    """Plan values -> call arguments for one precision; tensors that require grad become the
    leaves the backward differentiates."""

    def __init__(self, ad: Adapter, load: Loader, float_dtype: Optional[str], grad: bool,
                 leaf_values: Optional[list] = None):
        self.ad, self.load, self.float_dtype, self.grad = ad, load, float_dtype, grad
        self.leaf_values = leaf_values          # substitutes for the leaves (MindSpore's vjp)
        self.leaves: List[Any] = []

    def __call__(self, v: Any, key: str = "") -> Any:
        if isinstance(v, TensorArg):
            return self.tensor(v)
        if isinstance(v, OtherArg):
            return self.ad.other(v, self.float_dtype)
        if isinstance(v, list):
            return [self(x) for x in v]
        if isinstance(v, tuple):
            return tuple(self(x) for x in v)
        if isinstance(v, dict):
            return {k: self(x, k) for k, x in v.items()}
        if key == "device" and isinstance(v, str):
            return "cpu"
        return v

    def tensor(self, t: TensorArg, as_leaf: bool = True) -> Any:
        x = self.ad.tensor(np.array(self.load(t)), t.dtype, t.shape, self.float_dtype)
        if as_leaf and self.grad and t.requires_grad and dtype_name(self.ad.dtype(x)).startswith(("float", "bfloat")):
            i = len(self.leaves)
            self.leaves.append(x)
            if self.leaf_values is not None:
                return self.leaf_values[i]
        return x


def flatten_outputs(out: Any) -> List[Any]:
    if isinstance(out, (list, tuple)):
        return [x for o in out for x in flatten_outputs(o)]
    if isinstance(out, dict):
        return [x for o in out.values() for x in flatten_outputs(o)]
    return [out]


def _variants(plan: CallPlan) -> List[Tuple[list, dict]]:
    """The recorded arguments, and for indexing a second reading: JSON writes ``x[:, 0]``'s
    tuple and ``x[[0, 2]]``'s list alike, so ``__getitem__`` tries a tuple first."""
    if plan.api.rsplit(".", 1)[-1] in ("__getitem__", "__setitem__") and len(plan.args) > 1 \
            and isinstance(plan.args[1], list):
        as_tuple = list(plan.args)
        as_tuple[1] = tuple(as_tuple[1])
        return [(as_tuple, plan.kwargs), (plan.args, plan.kwargs)]
    return [(plan.args, plan.kwargs)]


class Replay:
    """One call's replays through one adapter."""

    def __init__(self, ad: Adapter, plan: CallPlan, resolved: Resolved, load: Loader):
        self.ad, self.plan, self.resolved, self.load = ad, plan, resolved, load

    def _shape_ok(self, outs: List[Any]) -> bool:
        for x, (_, leaf) in zip(outs, self.plan.outputs):
            if self.ad.is_tensor(x) and isinstance(leaf, dict) and isinstance(leaf.get("shape"), list) \
                    and self.ad.shape(x) != list(leaf["shape"]):
                return False
        return len(outs) == len(self.plan.outputs)

    def run(self, float_dtype: Optional[str], autocast: Optional[str] = None) -> List[Any]:
        """Forward outputs (flattened) in one precision."""
        last: List[Any] = []
        for args, kwargs in _variants(self.plan):
            b = _Builder(self.ad, self.load, float_dtype, False)
            last = flatten_outputs(self.ad.call(self.resolved.fn, b(args), b(kwargs), autocast))
            if self._shape_ok(last):
                break
        if len(last) != len(self.plan.outputs):
            raise ReplayError(f"the replay returned {len(last)} value(s), the dump recorded {len(self.plan.outputs)}")
        return last

    def backward(self, float_dtype: Optional[str], autocast: Optional[str] = None) -> Tuple[Optional[list], str]:
        """Gradients of the inputs that required grad, in the order of the recorded backward
        "output", given the recorded gradients of the outputs (backward "input")."""
        plan, ad = self.plan, self.ad
        if getattr(ad, "no_backward", ""):
            return None, ad.no_backward
        args, kwargs = _variants(plan)[0]
        probe = _Builder(ad, self.load, float_dtype, True)
        probe(args), probe(kwargs)
        leaves = probe.leaves
        if len(leaves) != len(plan.grad_outputs):
            return None, (f"backward not replayed: {len(plan.grad_outputs)} input gradient(s) recorded for "
                          f"{len(leaves)} input(s) that required grad")
        grad_in = [decode(leaf, f"input.{i}") for i, (_, leaf) in enumerate(plan.grad_inputs)]
        if any(g is not None and not isinstance(g, TensorArg) for g in grad_in):
            return None, "backward not replayed: a recorded output gradient is not a tensor"

        def run(values: list) -> list:
            b = _Builder(ad, self.load, float_dtype, True, leaf_values=values)
            return flatten_outputs(ad.call(self.resolved.fn, b(args), b(kwargs), autocast, grad=True))

        def cotangents(outs: list) -> list:
            tensors = [i for i, x in enumerate(outs) if ad.is_tensor(x)]
            if len(tensors) != len(grad_in):
                raise ReplayError(f"{len(grad_in)} output gradient(s) recorded for {len(tensors)} tensor output(s)")
            cot: List[Any] = [None] * len(outs)
            b = _Builder(ad, self.load, float_dtype, False)
            for i, g in zip(tensors, grad_in):
                cot[i] = None if g is None else b.tensor(g, as_leaf=False)
            return cot

        try:
            _, grads = ad.vjp(run, leaves, cotangents)
        except ReplayError as e:
            return None, f"backward not replayed: {e}"
        except Exception as e:
            return None, f"backward not replayed: {first_line(e)}"
        return [ad.to_numpy(g) if g is not None else None for g in grads], ""


def replay(ad: Adapter, plan: CallPlan, resolved: Resolved, load: Loader, backward: bool = True) -> Outcome:
    """Reference, peer (when `resolved` is independent) and their backward (see the module doc)."""
    r = Replay(ad, plan, resolved, load)
    want_grad = backward and plan.backward_key is not None and plan.backward_problem is None \
        and not is_inplace(plan.api)
    notes: List[str] = []
    ref = "float64"
    try:
        outs = r.run(ref)
    except ReplayError:
        raise
    except Exception as e:
        if not any(dtype_name(t.dtype) in _LOW for t in plan.tensors()):
            raise ReplayError(f"the float64 replay failed: {first_line(e)}") from None
        ref = "float32"
        try:
            outs = r.run(ref)
        except Exception as e2:
            raise ReplayError(f"the float64 replay failed: {first_line(e)}; float32 too: {first_line(e2)}") from None
        notes.append(f"float32 reference (float64 is not implemented here: {first_line(e)})")
    result = Outcome(reference=[ad.to_numpy(x) for x in outs], notes=notes)
    if resolved.how:
        notes.append(resolved.how)
    if want_grad:
        result.grads_reference, result.backward_note = r.backward(ref)
    elif plan.backward_key is not None:
        result.backward_note = plan.backward_problem or "in-place call: backward not replayed"
    if resolved.independent:
        _peer(r, want_grad and result.grads_reference is not None, result)
    return result


def _peer(r: Replay, grad: bool, result: Outcome) -> None:
    plan, ad = r.plan, r.ad
    recorded = [str(leaf.get("dtype")) if isinstance(leaf, dict) and "dtype" in leaf else None
                for _, leaf in plan.outputs]
    autocast: Optional[str] = None
    for attempt in range(2):
        try:
            outs = r.run(None, autocast)
        except Exception as e:
            result.notes.append(f"no {_dtypes(plan)} CPU peer ({first_line(e)}): graded by the ULP standard")
            return
        got = [ad.dtype(x) if ad.is_tensor(x) else None for x in outs]
        bad = [(g, rec) for g, rec in zip(got, recorded) if g and rec and dtype_name(g) != dtype_name(rec)]
        if not bad:
            break
        if attempt == 0 and dtype_name(bad[0][1]) in _LOW:
            autocast = dtype_name(bad[0][1])     # the run was under autocast: the output dtype says which
            continue
        result.notes.append(f"the CPU peer returns {bad[0][0]} where {bad[0][1]} was recorded: graded by the "
                            "ULP standard")
        return
    if autocast is not None:
        result.notes.append(f"peer run under CPU autocast({autocast})")
    result.peer = [ad.to_numpy(x) for x in outs]
    if grad:
        result.grads_peer, _ = r.backward(None, autocast)


def _dtypes(plan: CallPlan) -> str:
    return "/".join(sorted({dtype_name(t.dtype) for t in plan.tensors()})) or "same-dtype"


def is_inplace(api: str) -> bool:
    name = api.rsplit(".", 1)[-1]
    return name.startswith("__i") or name == "__setitem__" or (name.endswith("_") and not name.endswith("__"))


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]
