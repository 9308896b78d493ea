"""Backward records for one call, without changing a single gradient bit.

Two strategies:
- *tap* (default): the call's grad-requiring tensor inputs pass through an identity autograd
  Function whose backward sees exactly this call's gradients w.r.t. its inputs; tensor hooks
  on the outputs see the gradients w.r.t. the outputs. The identity returns ``detach()``
  aliases, so in-place ops on its results are allowed (torch's own full backward hooks forbid
  them, which breaks ``ReLU(inplace=True)``).
- *node*: for in-place and view-returning calls, whose inputs must stay the user's tensors,
  a hook on the output's autograd node sees both gradients at once.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch

from .._depth import internal
from ..structure import leaves, map_leaves


class _GradTap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sink, *xs):
        ctx.sink = sink
        return tuple(x.detach() for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.sink(grads)
        return (None,) + grads


def flat_tensors(obj: Any, out: List[torch.Tensor]) -> List[torch.Tensor]:
    return leaves(obj, lambda v: isinstance(v, torch.Tensor), out)


def _replace(obj: Any, swap: dict) -> Any:
    return map_leaves(obj, lambda v: swap.get(id(v), v) if isinstance(v, torch.Tensor) else v)


class GradCapture:
    """Collects one call's gradients, then hands them to ``emit(grads_of_outputs, grads_of_inputs)``."""

    __slots__ = ("emit", "n_in", "out_grads", "expected", "received", "done", "tapped", "on_start")

    def __init__(self, emit: Callable[[list, list], None], on_start: Optional[Callable[[], None]] = None):
        """``on_start`` (optional): called when the first output gradient arrives while the
        input gradients are still to come (the call's backward is running)."""
        self.emit = emit
        self.on_start = on_start
        self.out_grads: List[Any] = []
        self.expected = 0
        self.received = 0
        self.done = False
        self.tapped = False

    # -- tap strategy -------------------------------------------------------------------
    def tap_inputs(self, args: tuple, kwargs: dict):
        """Route grad-requiring tensor inputs through the identity tap; returns new (args, kwargs)."""
        tensors = [t for t in flat_tensors((args, kwargs), []) if t.requires_grad]
        if not tensors:
            return args, kwargs
        unique = list({id(t): t for t in tensors}.values())
        self.n_in = len(unique)
        self.tapped = True
        aliases = _GradTap.apply(self._on_input_grads, *unique)
        swap = {id(t): a for t, a in zip(unique, aliases)}
        return _replace(args, swap), _replace(kwargs, swap)

    def watch_outputs(self, output: Any) -> None:
        outs = flat_tensors(output, [])
        self.out_grads = [None] * len(outs)
        for i, t in enumerate(outs):
            if t.requires_grad:
                self.expected += 1
                t.register_hook(self._out_hook(i))
        if self.expected == 0 and not self.tapped:
            self.done = True

    def _out_hook(self, i: int):
        def hook(grad):
            with internal():
                self.out_grads[i] = grad
                self.received += 1
                if self.received == 1 and self.tapped and self.on_start is not None and not self.done:
                    self.on_start()
                if not self.tapped and self.received == self.expected:
                    self._finish([])
        return hook

    def _on_input_grads(self, grads) -> None:
        with internal():
            self._finish(list(grads))

    # -- node strategy ------------------------------------------------------------------
    def watch_node(self, target: Optional[torch.Tensor]) -> None:
        node = getattr(target, "grad_fn", None) if target is not None else None
        if node is None:
            self.done = True
            return

        def hook(grad_inputs, grad_outputs):
            with internal():
                self.out_grads = list(grad_outputs)
                self._finish([g for g in grad_inputs if g is not None])
        node.register_hook(hook)

    def _finish(self, in_grads: list) -> None:
        if not self.done:
            self.done = True
            self.emit(self.out_grads, in_grads)
