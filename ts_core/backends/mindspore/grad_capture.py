"""Backward records for one call in PyNative, without changing a single gradient bit.

- Inputs: the call's floating-point tensor inputs pass through ONE ``ops.HookBackward``
  identity (so they share one autodiff node); its hook receives this call's gradients w.r.t.
  those inputs, in argument order, and returns None (gradients pass through untouched).
- Outputs: ``Tensor.register_hook`` on each floating output sees the gradient w.r.t. it
  (again returning None). Output objects are not replaced.

Autodiff runs output grads first, then the input tap, which completes the record. MindSpore
prunes backward branches that lead to no requested input or weight: a call whose inputs are
all plain data (a first layer fed by the dataset) never gets its input tap called. Such calls
are completed by ``Pending.flush`` at the end of the step, with the gradients of their outputs
and an empty list for their inputs (the same record the torch backend writes when no input
requires grad).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from mindspore import Tensor, ops

from .._depth import internal
from ..structure import leaves, map_leaves
from .tensors import FLOATING


def flat_tensors(obj: Any, out: List[Tensor]) -> List[Tensor]:
    return leaves(obj, lambda v: isinstance(v, Tensor), out)


class _Slot:
    """Placeholder for a floating tensor argument, filled with its tapped alias."""

    __slots__ = ()


_SLOT = _Slot()


def _collect(obj: Any, slots: List[Tensor]) -> Any:
    """`obj` with each floating tensor replaced by a placeholder (appended to `slots`)."""
    def slot(v: Any) -> Any:
        if isinstance(v, Tensor) and v.dtype in FLOATING:
            slots.append(v)
            return _SLOT
        return v
    return map_leaves(obj, slot)


def _fill(obj: Any, it) -> Any:
    return map_leaves(obj, lambda v: next(it) if v is _SLOT else v)


class Pending:
    """Captures of the current step that have not completed yet."""

    def __init__(self) -> None:
        self.captures: Dict[int, "GradCapture"] = {}

    def flush(self) -> None:
        """Complete every capture that saw some output gradient but will get no input one."""
        for cap in list(self.captures.values()):
            if cap.received and not cap.done:
                cap.finish([])

    def clear(self) -> None:
        self.captures.clear()


class GradRecord:
    """One call's output gradients as they arrive, and the one moment its record is complete:
    ``finish`` hands ``emit(grads_of_outputs, grads_of_inputs)`` the record exactly once."""

    __slots__ = ("emit", "on_start", "out_grads", "expected", "received", "done", "tapped")

    def __init__(self, emit: Callable[[list, list], None]):
        self.emit = emit
        self.on_start: Optional[Callable[[], None]] = None   # unused: MindSpore records no call inside a backward
        self.out_grads: List[Any] = []     # one slot per output tensor
        self.expected = 0                  # output hooks placed
        self.received = 0                  # output gradients arrived
        self.done = False
        self.tapped = False                # the inputs pass a tap, whose gradients complete the record

    def output_grad(self, i: int, grad: Any) -> None:
        """Output `i`'s gradient arrived; without an input tap the last one completes the record."""
        self.out_grads[i] = grad
        self.received += 1
        if not self.tapped and self.received == self.expected:
            self.finish([])

    def finish(self, in_grads: list) -> None:
        """Emit the record with the gradients of the inputs (once; later calls do nothing)."""
        if not self.done:
            self.done = True
            self.emit(self.out_grads, in_grads)


class GradCapture(GradRecord):
    """Collects one call's gradients, then hands them to ``emit(grads_of_outputs, grads_of_inputs)``;
    registered in `pending` until then."""

    __slots__ = ("pending", "__weakref__")

    def __init__(self, emit: Callable[[list, list], None], pending: Pending):
        super().__init__(emit)
        self.pending = pending
        pending.captures[id(self)] = self

    @property
    def replaces_inputs(self) -> bool:
        """The call runs with tapped aliases of its inputs (see ``before_call``)."""
        return self.tapped

    def before_call(self, args: tuple, kwargs: dict):
        """The backend flow's hook point before the call: MindSpore taps the inputs."""
        return self.tap_inputs(args, kwargs)

    def tap_inputs(self, args: tuple, kwargs: dict):
        """Route floating tensor inputs through one HookBackward; returns new (args, kwargs).

        Every occurrence is tapped separately (``x * x`` gets two aliases): each use keeps its
        own edge back to the tensor, so MindSpore sums the contributions to it in the same
        order as without the tap (a shared alias would pre-sum them and change the bits)."""
        slots: List[Tensor] = []
        args = _collect(args, slots)
        kwargs = _collect(kwargs, slots)
        if not slots:
            return args, kwargs
        with internal():
            hooked = ops.HookBackward(self._on_input_grads)(*slots)
        if not isinstance(hooked, tuple):
            hooked = (hooked,)
        self.tapped = True
        it = iter(hooked)
        return _fill(args, it), _fill(kwargs, it)

    def watch_outputs(self, output: Any, skip_ids=()) -> None:
        outs = flat_tensors(output, [])
        self.out_grads = [None] * len(outs)
        for i, t in enumerate(outs):
            if t.dtype in FLOATING and id(t) not in skip_ids:
                try:
                    t.register_hook(self._out_hook(i))
                except RuntimeError:      # "requires grad is false": not in the autodiff graph
                    continue
                self.expected += 1
        if self.expected == 0 and not self.tapped:
            self._drop()

    def _out_hook(self, i: int):
        def hook(grad):
            if self.done:
                return None
            with internal():
                self.output_grad(i, grad)
            return None
        return hook

    def _on_input_grads(self, grads):
        with internal():
            self.finish(list(grads) if isinstance(grads, (tuple, list)) else [grads])
        return None

    def finish(self, in_grads: list) -> None:
        if not self.done:
            self._drop()
            out_grads, self.out_grads = self.out_grads, []    # a hook may outlive the step: keep no grads
            self.emit(out_grads, in_grads)

    def _drop(self) -> None:
        self.done = True
        self.pending.captures.pop(id(self), None)
