"""Backward records for one call in PyNative, without changing a single gradient bit.

MindSpore shows Python no autograd graph, so a call's share of its inputs' gradients can only be
seen through an identity node, ``ops.HookBackward``, placed between the input and its use; its
hook receives the gradient of what passed through it and returns None (gradients pass
untouched). MindSpore sums the contributions a tensor receives one at a time, in the order its
consumers' backward runs. An identity with several consumers sums those consumers first, on its
own: exact only when it has ONE consumer. Hence:

- API and Primitive calls: each occurrence of a floating tensor argument gets its own alias
  (``x * x`` gets two), so every alias has exactly one consumer (``InputTap``). A call that
  returns an alias as is (``ops.cast`` to the same dtype, ``contiguous``) hands the caller its
  own tensor back, so the caller's later uses never pass the tap.
- Cells (``CellCapture``): a Cell uses its input any number of times, so the Cell itself is not
  tapped. While it runs, its floating inputs are open in a ``CellWatch``; every tapped call made
  inside it that uses one of them directly (a recorded call's tap, or at L0 a tap placed only
  for this) reports that use's gradient to the Cell too; the Cell's input gradient is the sum
  of its uses'. A Primitive with side effects (BatchNorm) gets no tap of its own, but its uses
  of the Cells' inputs are tapped for the Cells (the backend's ``_run_primitive``). Uses of
  plain data pass a tap of their own (see ``InputTap``), so a Cell fed by the dataset gets no
  input gradient unless the caller asks for one, as in torch. Uses through calls tsprobe does
  not wrap (a Primitive created inside ``construct``, an API removed from api_list.yaml),
  in-place API calls and collectives are not in the sum.
- Cells defining ``bprop`` run as one custom op (their ``construct`` runs under no_grad): they
  are tapped like an API call.
- Outputs: ``Tensor.register_hook`` on each floating output sees the gradient w.r.t. it (again
  returning None). Output objects are not replaced.

Autodiff runs output grads first, then the input taps, which complete the record. MindSpore
prunes backward branches that lead to no requested input or weight: a call whose inputs are
all plain data (a first layer fed by the dataset) never gets its input taps called. Such calls
are completed by ``Pending.flush`` at the end of the step, with the gradients of their outputs
and an empty list for their inputs (the same record the torch backend writes when no input
requires grad).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from mindspore import Parameter, Tensor, ops
from mindspore._c_expression import TensorPy

from .._depth import internal
from ..structure import leaves, map_leaves
from ._runtime import no_grad
from .tensors import FLOATING


def flat_tensors(obj: Any, out: List[Tensor]) -> List[Tensor]:
    return leaves(obj, lambda v: isinstance(v, Tensor), out)


def _floating(v: Any) -> bool:
    return isinstance(v, Tensor) and v.dtype in FLOATING


_has_auto_grad = getattr(TensorPy, "_has_auto_grad", None)


def _plain_data(t: Tensor) -> bool:
    """Is `t` a tensor no op recorded for autodiff made, and no Parameter (data handed to
    ``value_and_grad``)? Its gradient exists only when the caller asks for it by position."""
    if _has_auto_grad is None or getattr(t, "requires_grad", False) is True:
        return False
    return not _has_auto_grad(t)


def _hook_backward(fn: Callable, tensors: List[Tensor]) -> tuple:
    with internal():
        hooked = ops.HookBackward(fn)(*tensors)
    return hooked if isinstance(hooked, tuple) else (hooked,)


class _Slot:
    """Placeholder for a tapped tensor argument, filled with its alias."""

    __slots__ = ()


_SLOT = _Slot()


def _collect(obj: Any, slots: List[Tensor], pick: Callable[[Any], bool]) -> Any:
    """`obj` with each tensor `pick` accepts replaced by a placeholder (appended to `slots`)."""
    def slot(v: Any) -> Any:
        if pick(v):
            slots.append(v)
            return _SLOT
        return v
    return map_leaves(obj, slot)


def _fill(obj: Any, it) -> Any:
    return map_leaves(obj, lambda v: next(it) if v is _SLOT else v)


class Pending:
    """Captures of the current step that have not completed yet."""

    def __init__(self) -> None:
        self.captures: Dict[int, "GradRecord"] = {}

    def flush(self) -> None:
        """Complete every capture that saw some output gradient but will get no more."""
        for cap in list(self.captures.values()):
            if cap.received and not cap.done:
                cap.finish_pending()

    def clear(self) -> None:
        self.captures.clear()


class CellWatch:
    """The Cells whose forward is running now and whose input gradients come from their uses:
    which tensors are whose input (by identity; the Cell holds them until its end)."""

    __slots__ = ("stack", "by_id")

    def __init__(self) -> None:
        self.stack: List["CellCapture"] = []
        self.by_id: Dict[int, List[Tuple["CellCapture", int]]] = {}

    def __bool__(self) -> bool:
        return bool(self.by_id)

    def open(self, cell: "CellCapture") -> None:
        for k, t in enumerate(cell.inputs):
            self.by_id.setdefault(id(t), []).append((cell, k))
        self.stack.append(cell)

    def close(self, cell: "CellCapture") -> None:
        """`cell` ended; so did every Cell opened after it (whose end never came)."""
        if not any(c is cell for c in self.stack):
            return
        while self.stack:
            top = self.stack.pop()
            for t in top.inputs:
                users = self.by_id.get(id(t))
                if users is not None:
                    users[:] = [u for u in users if u[0] is not top]
                    if not users:
                        del self.by_id[id(t)]
            if top is cell:
                return

    def recipients(self, t: Any) -> List[Tuple["CellCapture", int]]:
        return self.by_id.get(id(t), [])

    def clear(self) -> None:
        self.stack.clear()
        self.by_id.clear()


class InputTap:
    """One ``ops.HookBackward`` over some floating tensor arguments of one call, every
    occurrence its own alias. Each alias's gradient goes to the open Cells that have the tensor
    as input, and all of them to ``on_grads`` (the call's own record), if given.

    A use of plain data (``_plain_data``) by an open Cell first passes a HookBackward of its
    own, which reports to the Cells only. MindSpore prunes that node unless the caller asked for
    the data's gradient, so a Cell fed by the dataset gets no input gradient, as in torch (where
    data does not require grad); the shared node would report one as soon as any other argument
    (a weight) needs a gradient."""

    __slots__ = ("watch", "on_grads", "uses", "aliases", "restored", "dead_slots", "own")

    def __init__(self, watch: CellWatch, on_grads: Optional[Callable[[list], None]] = None):
        self.watch = watch
        self.on_grads = on_grads
        self.uses: List[List[Tuple["CellCapture", int]]] = []
        self.aliases: Dict[int, Tuple[Tensor, Tensor, int]] = {}    # id(alias) -> (alias, tensor, slot)
        self.restored: set = set()          # ids of tensors handed back in place of their alias
        self.dead_slots: set = set()        # slots no gradient will pass (see ``restore``)
        self.own: set = set()               # slots whose Cells are fed by a tap of their own

    def apply(self, args: tuple, kwargs: dict, every: bool, parameters: bool = True) -> Tuple[tuple, dict]:
        """Tap every floating argument (`every`), or only inputs of open Cells (Parameters only
        with `parameters`); new (args, kwargs)."""
        watch = self.watch

        def pick(v: Any) -> bool:
            if not _floating(v):
                return False
            if every:
                return True
            return bool(watch.recipients(v)) and (parameters or not isinstance(v, Parameter))
        slots: List[Tensor] = []
        args = _collect(args, slots, pick)
        kwargs = _collect(kwargs, slots, pick)
        if not slots:
            return args, kwargs
        self.uses = [list(watch.recipients(t)) for t in slots]
        for users in self.uses:
            for cell, _ in users:
                cell.uses += 1
        hooked = list(slots)
        for i, t in enumerate(slots):
            if self.uses[i] and _plain_data(t):
                self.own.add(i)
                hooked[i] = _hook_backward(self._own_hook(i), [t])[0]
        shared = [i for i in range(len(slots)) if every or i not in self.own]
        if shared:
            for i, a in zip(shared, _hook_backward(self._shared_hook(shared), [hooked[i] for i in shared])):
                hooked[i] = a
        self.aliases = {id(a): (a, t, i) for i, (a, t) in enumerate(zip(hooked, slots))}
        it = iter(hooked)
        return _fill(args, it), _fill(kwargs, it)

    @property
    def active(self) -> bool:
        return bool(self.aliases)

    # HookBackward wants a plain function (it reads its __code__): closures, not partials.
    def _shared_hook(self, slots: List[int]) -> Callable:
        def hook(grads):
            grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
            with internal():
                if self.on_grads is not None:      # the call's own record first, then its Cells'
                    self.on_grads(grads)
                for i, g in zip(slots, grads):
                    if i not in self.own:
                        self._to_cells(i, g)
            return None
        return hook

    def _own_hook(self, i: int) -> Callable:
        def hook(grads):
            with internal():
                self._to_cells(i, grads[0] if isinstance(grads, (tuple, list)) else grads)
            return None
        return hook

    def _to_cells(self, i: int, grad: Any) -> None:
        for cell, k in reversed(self.uses[i]):     # innermost Cell first: its record before its parents'
            cell.use_grad(k, grad)

    def restore(self, out: Any) -> Any:
        """After the call: `out` with any alias returned as is replaced by the caller's own
        tensor (the caller's later uses must not pass the tap: it would sum them). Such a use,
        and every use of a call with no floating output (``Shape``), gives no gradient: the
        Cells stop waiting for it."""
        if not self.aliases:
            return out
        outs = flat_tensors(out, [])
        if not any(t.dtype in FLOATING for t in outs):
            for i in range(len(self.uses)):
                self._no_gradient(i)
            return out
        if not any(id(t) in self.aliases for t in outs):
            return out

        def back(v: Any) -> Any:
            hit = self.aliases.get(id(v)) if isinstance(v, Tensor) else None
            if hit is None or hit[0] is not v:
                return v
            _, tensor, i = hit
            self._no_gradient(i)
            self.restored.add(id(tensor))
            return tensor
        return back(out) if isinstance(out, Tensor) else map_leaves(out, back)

    def _no_gradient(self, i: int) -> None:
        if i not in self.dead_slots:
            self.dead_slots.add(i)
            users, self.uses[i] = self.uses[i], []
            for cell, _ in users:
                cell.cancel_use()

    @property
    def dead(self) -> bool:
        """No gradient will pass this tap."""
        return len(self.dead_slots) == len(self.aliases)


class GradRecord:
    """One call's output gradients as they arrive, and the one moment its record is complete:
    ``finish`` hands ``emit(grads_of_outputs, grads_of_inputs)`` the record exactly once."""

    __slots__ = ("emit", "on_start", "out_grads", "expected", "received", "done", "tapped", "pending",
                 "__weakref__")

    def __init__(self, emit: Callable[[list, list], None], pending: Optional[Pending] = None):
        self.emit = emit
        self.on_start: Optional[Callable[[], None]] = None   # unused: MindSpore records no call inside a backward
        self.out_grads: List[Any] = []     # one slot per output tensor
        self.expected = 0                  # output hooks placed
        self.received = 0                  # output gradients arrived
        self.done = False
        self.tapped = False                # input gradients are awaited before the record is complete
        self.pending = pending
        if pending is not None:
            pending.captures[id(self)] = self

    @property
    def replaces_inputs(self) -> bool:
        """The call runs with tapped aliases of its inputs (see ``before_call``)."""
        return self.tapped

    def before_call(self, args: tuple, kwargs: dict):
        """The backend flow's hook point before the call: the subclass taps the inputs."""
        return self.tap_inputs(args, kwargs)

    def tap_inputs(self, args: tuple, kwargs: dict):
        raise NotImplementedError

    def _hook_outputs(self, output: Any, skip_ids=()) -> None:
        outs = flat_tensors(output, [])
        self.out_grads = [None] * len(outs)
        for i, t in enumerate(outs):
            if t.dtype in FLOATING and id(t) not in skip_ids:
                try:
                    t.register_hook(self._out_hook(i))
                except RuntimeError:      # "requires grad is false": not in the autodiff graph
                    continue
                self.expected += 1

    def _out_hook(self, i: int):
        def hook(grad):
            if self.done:
                return None
            with internal():
                self.output_grad(i, grad)
            return None
        return hook

    def output_grad(self, i: int, grad: Any) -> None:
        """Output `i`'s gradient arrived; without awaited input gradients the last one completes."""
        self.out_grads[i] = grad
        self.received += 1
        if not self.tapped and self.received == self.expected:
            self.finish([])

    def finish(self, in_grads: list) -> None:
        """Emit the record with the gradients of the inputs (once; later calls do nothing)."""
        if not self.done:
            self._drop()
            out_grads, self.out_grads = self.out_grads, []    # a hook may outlive the step: keep no grads
            self.emit(out_grads, in_grads)

    def finish_pending(self) -> None:
        """End of step: complete with what arrived (MindSpore pruned the rest)."""
        self.finish([])

    def _drop(self) -> None:
        self.done = True
        if self.pending is not None:
            self.pending.captures.pop(id(self), None)


class GradCapture(GradRecord):
    """An API or Primitive call (or a Cell defining ``bprop``): its inputs pass one InputTap."""

    __slots__ = ("tap",)

    def __init__(self, emit: Callable[[list, list], None], pending: Pending, watch: CellWatch):
        super().__init__(emit, pending)
        self.tap = InputTap(watch)

    @property
    def replaces_inputs(self) -> bool:      # type: ignore[override]
        """The call runs with tapped aliases of its inputs (see ``before_call``)."""
        return self.tap.active

    def before_call(self, args: tuple, kwargs: dict):
        """The backend flow's hook point before the call: every floating argument is tapped."""
        self.tap.on_grads = self._on_input_grads
        args, kwargs = self.tap.apply(args, kwargs, every=True)
        self.tapped = self.tap.active
        return args, kwargs

    def before_aliasing_call(self, args: tuple, kwargs: dict):
        """A call whose result may alias an input keeps the caller's tensors, except the inputs
        of open Cells, which are tapped for the Cells' records only (this call's record keeps
        its output gradients only, as before)."""
        return self.tap.apply(args, kwargs, every=False)

    def returned(self, out: Any) -> Any:
        """What the caller gets: an alias returned as is becomes the caller's tensor again. When
        no gradient will pass the tap, the record ends with its outputs' gradients."""
        out = self.tap.restore(out)
        if self.tapped and self.tap.dead:
            self.tapped = False
        return out

    def watch_outputs(self, output: Any, skip_ids=()) -> None:
        if self.tap.restored:
            skip_ids = set(skip_ids) | self.tap.restored
        self._hook_outputs(output, skip_ids)
        if self.expected == 0 and not self.tapped:
            self._drop()

    def _on_input_grads(self, grads: list) -> None:
        self.finish(grads)


class CellCapture(GradRecord):
    """A Cell's gradients: its outputs' from hooks, its inputs' summed from the uses tapped
    inside it (see the module doc). Complete when every output gradient and every use's
    gradient has arrived."""

    __slots__ = ("watch", "inputs", "data", "in_grads", "uses", "arrived", "closed", "passthrough")

    def __init__(self, emit: Callable[[list, list], None], pending: Pending, watch: CellWatch):
        super().__init__(emit, pending)
        self.watch = watch
        self.inputs: List[Tensor] = []
        self.data: List[bool] = []         # per input: plain data (see ``_plain_data``)
        self.in_grads: List[Any] = []
        self.uses = 0                      # taps inside the Cell that feed an input
        self.arrived = 0
        self.closed = False                # the Cell's forward ended: no more uses
        self.passthrough: List[Tuple[int, int]] = []    # (input, output) returned as is

    def before_call(self, args: tuple, kwargs: dict):
        """The Cell starts: its floating inputs (each tensor once) are open in the watch."""
        seen: Dict[int, Tensor] = {}
        for t in flat_tensors((args, kwargs), []):
            if t.dtype in FLOATING:
                seen.setdefault(id(t), t)
        self.inputs = list(seen.values())
        self.data = [_plain_data(t) for t in self.inputs]
        self.in_grads = [None] * len(self.inputs)
        self.watch.open(self)
        return args, kwargs

    def watch_outputs(self, output: Any, skip_ids=()) -> None:
        """An input returned as is (``nn.Dropout`` in eval, an identity) has no use inside the
        Cell: its gradient is that output's, i.e. the tensor's whole gradient (as in torch)."""
        position = {id(t): k for k, t in enumerate(self.inputs)}
        self.passthrough = [(position[id(t)], i) for i, t in enumerate(flat_tensors(output, []))
                            if id(t) in position]
        self.close()
        self._hook_outputs(output, skip_ids)
        if self.expected == 0 and self.uses == 0:
            self._drop()
        else:
            self._maybe_finish()

    def close(self) -> None:
        self.watch.close(self)
        self.inputs = []
        self.closed = True

    def use_grad(self, k: int, grad: Any) -> None:
        if self.done:
            return
        cur = self.in_grads[k]
        if cur is None or grad is None:
            self.in_grads[k] = grad if cur is None else cur
        else:
            with no_grad():
                self.in_grads[k] = cur + grad      # in the order the uses' gradients arrive
        self.arrived += 1
        self._maybe_finish()

    def cancel_use(self) -> None:
        self.uses -= 1
        self._maybe_finish()

    def output_grad(self, i: int, grad: Any) -> None:
        self.out_grads[i] = grad
        self.received += 1
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self.closed and not self.done and self.received >= self.expected and self.arrived >= self.uses \
                and (self.received or self.arrived):
            self.finish_pending()

    def finish_pending(self) -> None:
        grads, got = list(self.in_grads), self.arrived > 0
        for k, i in self.passthrough:
            g = self.out_grads[i] if i < len(self.out_grads) else None
            if g is not None:
                got = True
                if grads[k] is None:
                    grads[k] = g
                else:
                    with no_grad():
                        grads[k] = grads[k] + g
        # Data whose gradient nobody asked for has none, and no place in the list (as in torch,
        # which lists the inputs that require grad).
        grads = [g for g, data in zip(grads, self.data) if g is not None or not data]
        self.finish(grads if got else [])

    def abandon(self) -> None:
        """The Cell's end never came: release its inputs, record nothing."""
        if not self.closed:
            self.close()
        self._drop()
