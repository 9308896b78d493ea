"""Backward records for one call, without adding a single node to the autograd graph.

Why no node: autograd sums the gradient contributions a tensor receives in its grad_fn's
InputBuffer, one at a time, in the order its consumers run (``((c1 + c2) + c3)``). Any identity
node put between a call's inputs and their uses inside the call (an autograd Function "tap", or
torch's own full backward hooks) pre-sums the call's contributions on its own before they reach
the tensor: a tensor that the call uses twice and the caller uses once more (an RMSNorm input
that is also the residual, q/k/v projections of one hidden state) is then summed as
``c1 + (c2 + c3)``, which differs in the last bits. So nothing is inserted:

- before the call, ``watch_inputs`` notes the gradient edge ``(grad_fn, output_nr)`` of each
  grad-requiring tensor input (the tensor itself for a leaf) and autograd's per-thread sequence
  number: every node the call creates gets a number at least that large;
- after the call, ``watch_outputs`` walks back from the outputs' grad_fns through nodes created
  by the call only, and puts a read-only post hook on each node whose edge points at an input
  (a *consumer*); the hook reads that node's gradient for the input (exactly what autograd adds
  into the input's buffer), and pre-hooks on the outputs' nodes read their gradients (an output
  made by a consumer node, as most API calls' is, is read by that node's post hook from the
  gradients it received: one hook instead of two; not on a custom Function's node, whose Python
  backward may call recorded APIs after the call's backward has begun);
- the record of an input's gradient is the sum of its consumers' contributions in the order
  they ran, the same order (and so the same bits) as autograd's own sum when the call is the
  tensor's only user. Hooks return None: no gradient is replaced, re-laid-out or copied.

A call returning an input unchanged (``nn.Identity``, dropout with p=0) created no node: that
input's gradient is recorded as the gradient of the output it became.

``watch_node`` (in-place and view-returning APIs, in-place modules) hooks the one node an
in-place op installs on its target and reads both sides of it.

A record is written when its last consumer has run; calls whose consumers do not all run (a
backward restricted with ``inputs=``) are completed when the backward pass ends.
"""
from __future__ import annotations

import types
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .._depth import internal

_next_sequence_nr = torch.autograd._get_sequence_nr
_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_ACCUMULATE_GRAD = torch._C._functions.AccumulateGrad     # a leaf's node: its edge may be an input
# A custom autograd.Function's node: its backward is Python and may call recorded APIs, which
# must see the call's backward begun (its outputs' pre-hooks) before it runs.
_PYTHON_NODE = torch._C._FunctionBase
_graph_task = torch._C._current_graph_task_id           # -1 outside a backward pass
_top_saved_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_Tensor = torch.Tensor
_STRIDED = torch.strided
_NESTED = (list, tuple, dict)


def flat_tensors(obj: Any, out: List[torch.Tensor]) -> List[torch.Tensor]:
    """Append the tensors of `obj` (nested lists, tuples, dicts) to `out`, in argument order:
    ``structure.leaves`` for tensors, without a Python call per leaf (twice per recorded call)."""
    if isinstance(obj, _Tensor):
        out.append(obj)
        return out
    if isinstance(obj, dict):
        obj = obj.values()
    elif not isinstance(obj, (list, tuple)):
        return out
    for v in obj:
        if isinstance(v, _Tensor):
            out.append(v)
        elif isinstance(v, _NESTED):
            flat_tensors(v, out)
    return out


_NONE: Dict[Any, int] = types.MappingProxyType({})    # read-only: no input edges noted
_LEAF_HOOKS: Dict[int, Any] = {}          # hooks on leaf tensors, by id of their handle


def hook_grad(t: torch.Tensor, fn: Callable[[torch.Tensor], None]) -> None:
    """``fn(grad)`` when `t`'s gradient arrives. A hook on a non-leaf lives on its graph node and
    goes away with the graph; one on a leaf (a parameter a call returned, or ``save()`` was given,
    as is) would stay on the parameter for good: those are removed by ``release_leaf_hooks``."""
    handle = t.register_hook(fn)
    if t.grad_fn is None:
        _LEAF_HOOKS[id(handle)] = handle


def on_grad(t: torch.Tensor, fn: Callable[[torch.Tensor], None]) -> None:
    """``fn(grad)`` when `t`'s gradient arrives, as ``hook_grad``, at a sixth of its cost for a
    non-leaf: a pre-hook on `t`'s autograd node reads the same gradient (the tensor's total,
    before the node runs) without ``Tensor.register_hook``'s Python bookkeeping. Like a tensor
    hook, `fn` is not called when that gradient is undefined."""
    node = t.grad_fn
    if node is None:
        hook_grad(t, fn)
        return
    nr = t.output_nr
    node.register_prehook(lambda grads: None if grads[nr] is None else fn(grads[nr]))


def recomputing() -> bool:
    """Is activation checkpointing (``torch.utils.checkpoint``, non-reentrant, what
    ``checkpoint_wrapper`` uses) re-running a forward inside backward? Its saved-tensor hooks
    are then on top. Outside a backward pass, one C call."""
    if _graph_task() == -1:
        return False
    hooks = _top_saved_hooks(False)
    return hooks is not None and getattr(hooks[0], "__qualname__", "").startswith("_recomputation_hook")


def release_leaf_hooks() -> None:
    """Remove every hook ``hook_grad`` put on a leaf (at the next step, and at close)."""
    for handle in list(_LEAF_HOOKS.values()):
        handle.remove()
    _LEAF_HOOKS.clear()


class GradCapture:
    """Collects one call's gradients, then hands them to ``emit(grads_of_outputs, grads_of_inputs)``."""

    __slots__ = ("emit", "on_start", "out_grads", "in_grads", "watching", "done", "_wait", "_queued",
                 "_start", "_inputs", "_edges", "_leaves", "_sums")

    def __init__(self, emit: Callable[[list, list], None]):
        self.emit = emit
        self.on_start: Optional[Callable[[], None]] = None   # called when the first output gradient arrives
        # Empty tuples until the call's tensors are known: a capture lives until its backward,
        # and a container allocated per call that outlives a GC collection is promoted towards
        # the interpreter's full collections (see Collector._emit).
        self.out_grads: Sequence[Any] = ()
        self.in_grads: Sequence[Any] = ()
        self.watching = False          # the call has grad-requiring tensor inputs
        self.done = False
        self._wait = 0                 # hook calls still to come before the record is complete
        self._queued = False
        self._start = 0
        self._inputs: Sequence[Tuple[torch.Tensor, int, Any]] = ()   # (input, its version, its grad_fn)
        self._edges: Dict[Tuple[int, int], int] = _NONE          # (id(grad_fn), output_nr) -> input
        self._leaves: Dict[int, int] = _NONE                     # id(leaf tensor) -> input
        self._sums: Optional[Dict[int, Any]] = None    # input -> the gradient sum made here

    replaces_inputs = False            # the call runs with the caller's own tensors

    def before_call(self, args: tuple, kwargs: dict):
        """The backend flow's hook point before the call: note where gradients will arrive;
        the arguments are returned unchanged (nothing is inserted into the graph)."""
        self.watch_inputs(args, kwargs)
        return args, kwargs

    # -- consumer strategy ------------------------------------------------------------------
    def watch_inputs(self, args: tuple, kwargs: dict) -> None:
        """Before the call: note where each grad-requiring input's gradient will arrive."""
        n = 0
        inputs: List[Tuple[torch.Tensor, int, Any]] = []
        edges: Dict[Tuple[int, int], int] = {}
        leaves: Dict[int, int] = {}
        for t in flat_tensors(kwargs, flat_tensors(args, [])):
            if not t.requires_grad:
                continue
            fn = t.grad_fn
            if fn is None:
                if id(t) in leaves:
                    continue
                leaves[id(t)] = n
            else:
                key = (id(fn), t.output_nr)
                if key in edges:
                    continue
                edges[key] = n
            inputs.append((t, t._version, fn))      # holding fn keeps its id unique
            n += 1
        if n:
            self._inputs, self._edges, self._leaves = inputs, edges, leaves
            self.watching = True
            self.in_grads = [None] * n
            self._start = _next_sequence_nr()

    def watch_outputs(self, output: Any) -> None:
        """After the call: hook the outputs and the call's nodes that feed its inputs."""
        outs = flat_tensors(output, [])
        self.out_grads = [None] * len(outs)
        roots: List[Any] = []
        identity: Dict[int, int] = {}
        hooked: List[int] = []
        edges, leaves = self._edges, self._leaves
        for i, t in enumerate(outs):
            if not t.requires_grad:
                continue
            fn = t.grad_fn
            k = edges.get((id(fn), t.output_nr)) if fn is not None else leaves.get(id(t))
            if k is not None:
                identity[i] = k                 # an input returned as is: no node of its own
            elif fn is not None:
                roots.append(fn)
            hooked.append(i)
        consumers = self._consumers(roots + self._mutated()) if self.watching else []
        self._release()
        # Complete when the last consumer (or returned input) has its gradient; a call that
        # feeds no input of its own completes with its outputs' gradients.
        outputs_complete = not (consumers or identity)
        self._wait = len(hooked) if outputs_complete else len(consumers) + len(identity)
        # An output made by a consumer node (most API calls are one node) is read by that
        # node's post hook, from the gradients it received: one hook fewer to register and run.
        reads: Dict[int, List[Tuple[int, int]]] = {}
        at = {id(node) for node, _ in consumers} if consumers else ()
        for i in hooked:
            k = identity.get(i)
            t = outs[i]
            if k is None and at:
                node = t.grad_fn
                if id(node) in at and not isinstance(node, _PYTHON_NODE):
                    reads.setdefault(id(node), []).append((i, t.output_nr))
                    continue
            self._hook_output(t, i, k, outputs_complete or k is not None)
        for node, slots in consumers:
            node.register_hook(self._consumer_hook(slots, reads.get(id(node))))
        if self._wait == 0:
            self.done = True

    def _mutated(self) -> list:
        """grad_fns installed on inputs the call modified in place (their new history)."""
        roots = []
        for t, version, _ in self._inputs:
            if t._version != version:
                src = t._base if t._is_view() else t      # a view's own grad_fn would be rebuilt
                if src.grad_fn is not None:
                    roots.append(src.grad_fn)
        return roots

    def _consumers(self, roots: list) -> List[Tuple[Any, List[Tuple[int, int]]]]:
        """Nodes created by the call with an edge to an input: [(node, [(slot, input)])].
        A depth-first walk from `roots` (consumed) through nodes with a sequence number at
        least ``_start``; edges to inputs and to leaves' nodes are not followed."""
        start = self._start
        edges_get = self._edges.get
        leaves = self._leaves
        found = []
        seen: Dict[int, Any] = {}          # keeps every visited wrapper alive: ids stay unique
        stack = roots
        while stack:
            node = stack.pop()
            i = id(node)
            if i in seen:
                continue
            seen[i] = node
            if node._sequence_nr() < start:
                continue                   # made before the call: not the call's own node
            slots = None
            for slot, (nxt, nr) in enumerate(node.next_functions):
                if nxt is None:
                    continue
                if type(nxt) is _ACCUMULATE_GRAD:      # a leaf: an input, or nothing to walk
                    k = leaves.get(id(nxt.variable)) if leaves else None
                    if k is None:
                        continue
                else:
                    k = edges_get((id(nxt), nr))
                    if k is None:
                        stack.append(nxt)
                        continue
                if slots is None:
                    slots = [(slot, k)]
                    found.append((node, slots))
                else:
                    slots.append((slot, k))
        return found

    def _release(self) -> None:
        self._inputs = ()
        self._edges = self._leaves = _NONE

    def _add(self, k: int, grad: Any) -> None:
        """Add a consumer's contribution to input `k`'s gradient: autograd's InputBuffer does
        old + new, in order. From the third one on, the sum is this capture's own tensor and
        is added to in place (elementwise, so the same bits and, with the same strides, the same
        layout) instead of allocating anew."""
        cur = self.in_grads[k]
        if cur is None:
            self.in_grads[k] = grad
            return
        sums = self._sums
        with torch.no_grad():
            if sums is not None and sums.get(k) is cur and grad.layout is _STRIDED and \
                    cur.layout is _STRIDED and cur.dtype == grad.dtype and \
                    cur.stride() == grad.stride() and cur.shape == grad.shape:
                cur.add_(grad)         # the layout out of place would have too
            else:
                total = self.in_grads[k] = cur + grad
                if sums is None:
                    sums = self._sums = {}
                sums[k] = total

    def _consumer_hook(self, slots: List[Tuple[int, int]], outputs: Optional[List[Tuple[int, int]]]):
        """A post hook on a consumer node: its contributions to the inputs (`slots`: (slot,
        input)) and, for `outputs` ((output, slot)) it made, the gradients it received, as the
        outputs' pre-hooks would read them."""
        def hook(grad_inputs, grad_outputs):
            if self.done:
                return None
            with internal():
                if outputs is not None:
                    for i, nr in outputs:
                        g = grad_outputs[nr]
                        if g is not None:
                            self._got_output(i, g)
                for slot, k in slots:
                    g = grad_inputs[slot]
                    if g is not None:
                        self._add(k, g)
                self._count()
            return None
        return hook

    def _hook_output(self, t: torch.Tensor, i: int, k: Optional[int], counts: bool) -> None:
        """Read output `i`'s gradient when it arrives: as ``on_grad`` does, in one closure."""
        node = t.grad_fn
        if node is None:
            hook_grad(t, self._out_hook(i, k, counts, -1))
        else:
            node.register_prehook(self._out_hook(i, k, counts, t.output_nr))

    def _out_hook(self, i: int, k: Optional[int], counts: bool, nr: int):
        """A tensor hook (`nr` -1) or a pre-hook on the output's node reading its slot `nr`."""
        def hook(grad):
            if nr >= 0:
                grad = grad[nr]
                if grad is None:       # as a tensor hook: not called for an undefined gradient
                    return None
            if self.done:
                return None
            with internal():
                self._got_output(i, grad)
                if k is not None:
                    self.in_grads[k] = grad
                if counts:
                    self._count()
                else:
                    self._finish_at_end()
            return None
        return hook

    def _got_output(self, i: int, grad: Any) -> None:
        if self.on_start is not None:      # this call's backward begins
            start, self.on_start = self.on_start, None
            start()
        self.out_grads[i] = grad

    def _count(self) -> None:
        self._wait -= 1
        if self._wait <= 0:
            self._finish()
        else:
            self._finish_at_end()

    def _finish_at_end(self) -> None:
        """Complete this record when the backward pass ends, should some hook never run."""
        if not self._queued:
            self._queued = True
            try:
                _queue_callback(self._finish)
            except RuntimeError:          # not inside a backward pass (hook called directly)
                pass

    # -- node strategy ------------------------------------------------------------------
    def watch_node(self, target: Optional[torch.Tensor]) -> None:
        node = getattr(target, "grad_fn", None) if target is not None else None
        if node is None:
            self.done = True
            return

        def hook(grad_inputs, grad_outputs):
            with internal():
                self.out_grads = list(grad_outputs)
                self.in_grads = [g for g in grad_inputs if g is not None]
                self._finish()
        node.register_hook(hook)

    def _finish(self) -> None:
        if not self.done:
            self.done = True
            out_grads, in_grads = self.out_grads, self.in_grads
            self.out_grads, self.in_grads = (), ()     # a hook may outlive the step: keep no grads
            self._sums = None
            self.emit(out_grads, in_grads)
