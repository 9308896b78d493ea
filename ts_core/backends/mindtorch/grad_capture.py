"""Backward records under mindtorch, with torch's meaning: a call's record lists the gradients
of its inputs that *require grad* in torch's sense (they lead to a parameter), not of every
floating-point input.

MindSpore has no per-tensor ``requires_grad``: every op run while a gradient is recorded joins
the autodiff graph, data-only ones included. What it does have is pruning: backward never
visits an edge that leads to no weight. So each floating input occurrence passes through its
own ``ops.HookBackward`` identity; the taps of inputs that torch would call "requires grad"
fire, the others never do. Which taps fire is known only once backward has moved past the call.
MindSpore runs backward in reverse creation order (a call's output hooks, then its input taps,
then the calls created before it; checked on MindSpore 2.7, also across parallel branches), so
a call is complete as soon as an input gradient of an *earlier-created* call arrives (or an
output gradient that completes a call without live taps, for the calls made after that one
returned), when the next forward starts, or at the end of the step (``Sequencer``). Records
thus come in torch's backward order.

Two mindtorch facts are absorbed here as well: mindtorch replaces ``Tensor.register_hook`` with
a method that fails (it reads a ``_data`` attribute MindSpore tensors do not have), so hooks go
through MindSpore's own implementation (``ms_register_hook``); and a mindtorch tensor keeps its
torch device in ``_device``, which a tap's fresh output lacks, so each alias gets its source's.

Gradients pass through every hook untouched (each returns None). Each occurrence of a tensor in
one call (``x * x``) has its own tap, so MindSpore adds the contributions to it as it would
without taps; the record shows their sum, as torch's does. The one exception: a call that uses
an input several times *inside* (mindtorch composes exact GELU from mul/erf/div on CPU) sums
those uses at its tap before other consumers' contributions join, which can move the input's
gradient in its last digits (docs/mindtorch.md).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from mindspore import Tensor, ops
from mindspore._c_expression import TensorPy
from mindspore.common.hook_handle import _TensorHookHandle

from .._depth import internal
from ..mindspore._runtime import no_grad
from ..mindspore.grad_capture import GradRecord
from ..mindspore.tensors import FLOATING
from ..structure import leaves, map_leaves

__all__ = ["GradCapture", "Sequencer", "ms_register_hook", "flat_tensors"]


def ms_register_hook(tensor: Any, hook: Callable[[Any], Any]) -> _TensorHookHandle:
    """MindSpore's ``Tensor.register_hook`` (mindtorch overrides the method on the class).
    Raises RuntimeError for a tensor outside the autodiff graph."""
    handle = _TensorHookHandle(tensor)
    handle.id = TensorPy.register_hook(tensor, hook)
    return handle


def flat_tensors(obj: Any, out: List[Tensor]) -> List[Tensor]:
    return leaves(obj, lambda v: isinstance(v, Tensor), out)


_has_auto_grad = getattr(TensorPy, "_has_auto_grad", None)


def may_require_grad(t: Tensor) -> bool:
    """Could `t` require grad in torch's sense? A tensor that no op recorded for autodiff made
    (data handed to ``value_and_grad``) cannot, unless it is a parameter or the user called
    ``requires_grad_()`` on it, as torch would need. Its tap would never fire, and a call whose
    inputs all are such data is then complete when its outputs' gradients are, as in torch."""
    if getattr(t, "requires_grad", False) is True:
        return True
    return _has_auto_grad is None or bool(_has_auto_grad(t))


class Sequencer:
    """The captures that have received a gradient and may still receive more, completed in
    backward order (see the module doc). One per backend; ``flush``/``clear`` at step ends."""

    def __init__(self) -> None:
        self._count = 0
        self._waiting: Dict[int, "GradCapture"] = {}

    def number(self) -> int:
        """A new capture's creation number. A forward call: the previous backward is over."""
        if self._waiting:
            self.flush()
        self._count += 1
        return self._count

    @property
    def count(self) -> int:
        """The number of the latest capture made."""
        return self._count

    def arrived(self, cap: "GradCapture", passed: Optional[int]) -> None:
        """A gradient of `cap` arrived, showing that backward is done with every capture made
        after number `passed` (None: it shows nothing): those still waiting are complete."""
        waiting = self._waiting
        if passed is not None:
            later = [n for n in waiting if n > passed]
            for n in sorted(later, reverse=True):
                waiting.pop(n).complete()
        if not cap.done:
            waiting[cap.seq] = cap

    def flush(self) -> None:
        """Complete every waiting capture, latest-created first (backward order)."""
        waiting, self._waiting = self._waiting, {}
        for n in sorted(waiting, reverse=True):
            waiting[n].complete()

    def clear(self) -> None:
        self._waiting.clear()


class GradCapture(GradRecord):
    """Collects one call's gradients, then hands them to ``emit(grads_of_outputs, grads_of_inputs)``."""

    __slots__ = ("seq", "last", "sequencer", "in_grads")

    def __init__(self, emit: Callable[[list, list], None], sequencer: Sequencer):
        super().__init__(emit)
        self.sequencer = sequencer
        self.seq = sequencer.number()
        self.last = self.seq                    # the latest capture made before this call returned
        self.in_grads: Dict[int, Any] = {}      # unique input index -> gradient (summed over its uses)

    @property
    def replaces_inputs(self) -> bool:
        """The call runs with tapped aliases of its inputs (see ``before_call``)."""
        return self.tapped

    def before_call(self, args: tuple, kwargs: dict):
        """The backend flow's hook point before the call: taps on the inputs."""
        return self.tap_inputs(args, kwargs)

    def tap_inputs(self, args: tuple, kwargs: dict):
        """Route each floating tensor occurrence through its own HookBackward; new (args, kwargs)."""
        index: Dict[int, int] = {}

        def tap(v: Any) -> Any:
            if not (isinstance(v, Tensor) and v.dtype in FLOATING and may_require_grad(v)):
                return v
            alias = ops.HookBackward(self._in_hook(index.setdefault(id(v), len(index))))(v)
            if isinstance(alias, tuple):
                alias = alias[0]
            device = getattr(v, "_device", None)
            if device is not None:
                alias._device = device
            return alias

        with internal():
            new_args, new_kwargs = map_leaves(args, tap), map_leaves(kwargs, tap)
        self.tapped = bool(index)
        return new_args, new_kwargs

    def watch_outputs(self, output: Any, skip_ids=()) -> None:
        self.last = self.sequencer.count        # the calls made inside this one (a module's) end here
        outs = flat_tensors(output, [])
        self.out_grads = [None] * len(outs)
        for i, t in enumerate(outs):
            if t.dtype in FLOATING and id(t) not in skip_ids:
                try:
                    ms_register_hook(t, self._out_hook(i))
                except RuntimeError:      # "requires grad is false": not in the autodiff graph
                    continue
                self.expected += 1
        if self.expected == 0 and not self.tapped:
            self.done = True

    def drop(self) -> None:
        """Record nothing for this call (torch records no backward for it either)."""
        self.done = True

    def complete(self) -> None:
        """Backward has moved past this call: emit with the input gradients that came."""
        self.finish([self.in_grads[i] for i in sorted(self.in_grads)])

    def finish(self, in_grads: list) -> None:
        if not self.done:
            self.done = True
            out_grads, self.out_grads, self.in_grads = self.out_grads, [], {}   # keep no grads
            self.emit(out_grads, in_grads)

    def _out_hook(self, i: int):
        def hook(grad):
            if self.done:
                return None
            with internal():
                # An output gradient shows nothing about the calls made after this one, unless it
                # completes this call (no input tap): then backward is done with every call made
                # after it returned (not with those made inside it, a module's).
                completes = not self.tapped and self.received + 1 == self.expected
                self.sequencer.arrived(self, self.last if completes else None)
                self.output_grad(i, grad)
            return None
        return hook

    def _in_hook(self, i: int):
        def hook(grads):
            if self.done:
                return None
            grad = grads[0] if isinstance(grads, tuple) else grads
            with internal():
                prev = self.in_grads.get(i)
                if prev is not None:
                    with no_grad():
                        grad = ops.add(prev, grad)      # MindSpore's add: grads carry no torch device
                self.in_grads[i] = grad
                self.sequencer.arrived(self, self.seq)   # backward is past every call made after this one
            return None
        return hook
