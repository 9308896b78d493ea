"""The bookkeeping every backend's gradient capture shares: one call's output gradients as
they arrive, and the one moment the call's backward record is complete.

How gradients are intercepted (an identity tap on the inputs, tensor hooks, autograd-node
hooks) is each framework's own: see ``torch/grad_capture.py`` and ``mindspore/grad_capture.py``.
Whatever intercepts them reports here; ``finish`` hands ``emit(grads_of_outputs,
grads_of_inputs)`` the record exactly once.
"""
from __future__ import annotations

from typing import Any, Callable, List


class GradRecord:
    __slots__ = ("emit", "out_grads", "expected", "received", "done", "tapped")

    def __init__(self, emit: Callable[[list, list], None]):
        self.emit = emit
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
