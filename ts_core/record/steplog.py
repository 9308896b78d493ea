"""One training step's module records, held in memory (monitor mode's ring buffer entry).

Monitor mode records every step at module level but writes a step to disk only when an anomaly
is caught. A StepLog keeps exactly what an L0 ``dump.json`` of that step holds: per module call
the summaries of its inputs and outputs (forward) and of the gradients of its outputs and inputs
(backward), per module the gradients of its own parameters, the call stacks and the module
hierarchy. Summaries are the dump's own dicts, filled by one batched statistics transfer at the
end of the step (``Summarizer.resolve``).

Once the step is over and its signals are read, ``compact`` packs the calls, as recorded, into
one bytes object (``marshal``: ~10x faster than JSON-encoding them, and the bytes never leave
the process): a buffered step is then nothing for the garbage collector to walk (thousands of
live dicts per buffered step made Python's full collections several times more frequent). The
dump's records are built from them by ``unpack``, only for a step that gets written. Memory of
the ring buffer: keep_steps x (tensors per step) x ~0.2 KB; ``limit`` caps the calls of one
step (later calls of that step are not recorded and the log says ``truncated``).
"""
from __future__ import annotations

import marshal
import math
from typing import Any, Dict, List, Optional, Tuple

from ..dumpfmt import BACKWARD, FORWARD, is_tensor_summary, module_key, params_grad_key

Frames = List[str]


class CallLog:
    """One module call: forward summaries, then gradient summaries as backward delivers them."""

    __slots__ = ("log", "base", "index", "parent", "parent_index", "seq", "inputs", "kwargs", "outputs",
                 "out_grads", "in_grads", "bwd_seq", "frames")

    def __init__(self, log: "StepLog", base: str, index: int, parent: Optional[str], parent_index: int):
        self.log, self.base, self.index = log, base, index
        self.parent, self.parent_index = parent, parent_index     # the containing module's call
        self.seq = 0                           # when the forward finished (record order)
        self.inputs: List[Any] = []
        self.kwargs: Dict[str, Any] = {}
        self.outputs: Optional[List[Any]] = None
        self.out_grads: Optional[List[Any]] = None     # one slot per output tensor needing a gradient
        self.in_grads: Optional[List[Any]] = None      # one slot per input tensor needing a gradient
        self.bwd_seq = 0                       # when the latest of its gradients arrived
        self.frames: Optional[Frames] = None   # its stack (stack.json), when recorded

    def key(self, direction: str) -> str:
        return module_key(self.base, self.index, direction)

    def grad(self, slots: List[Any], i: int, summary: Any) -> None:
        slots[i] = summary
        self.bwd_seq = self.log.tick()


class StepLog:
    def __init__(self, step: int, rank: Optional[int], limit: int):
        self.step, self.rank = step, rank
        self.limit = limit
        self.calls: List[CallLog] = []
        self.truncated = False
        self.closed = False
        self.persisted = False
        self.losses: List[Any] = []                            # summaries (or floats) of observed losses
        self.param_grads: Dict[str, Dict[str, Any]] = {}       # module base -> {param name: summary}
        self.param_by_id: Dict[int, Any] = {}                  # id(param) -> summary: tied weights once
        self.packed: Optional[bytes] = None                    # after compact(): the records
        self._counts: Dict[str, int] = {}
        self._seq = 0

    def tick(self) -> int:
        self._seq += 1
        return self._seq

    # -- recording ----------------------------------------------------------------------------
    def begin(self, base: str, parent: Optional[str]) -> Optional[CallLog]:
        """A call of the module named `base` inside (a running call of) the module `parent`
        has returned; None once the step holds `limit` calls."""
        if len(self.calls) >= self.limit:
            self.truncated = True
            return None
        counts = self._counts
        n = counts.get(base, 0)
        counts[base] = n + 1
        call = CallLog(self, base, n, parent, counts.get(parent, 0) if parent is not None else 0)
        self.calls.append(call)
        return call

    def forward_done(self, call: CallLog, outputs: List[Any]) -> None:
        call.outputs = outputs
        call.seq = self.tick()

    def param_grad(self, base: str, pname: str, param_id: int, summary: Any) -> None:
        """A parameter's gradient (the latest one of the step wins)."""
        self.param_grads.setdefault(base, {})[pname] = summary
        self.param_by_id[param_id] = summary

    # -- reading (after the statistics were resolved) ------------------------------------------
    def records(self) -> Tuple[Dict[str, Any], Dict[str, Optional[str]], List[Tuple[List[str], Frames]]]:
        """(dump.json data, construct.json, stack groups) as an L0 dump of this step writes them:
        records in the order they completed (a forward when the call returned, a backward when
        its last gradient arrived), ``parameters_grad`` last."""
        order: List[Tuple[int, str, dict, Optional[str]]] = []
        for c in self.calls:
            if c.outputs is None:
                continue
            parent = c.parent
            order.append((c.seq, c.key(FORWARD), {"input_args": c.inputs, "input_kwargs": c.kwargs,
                                                  "output": c.outputs},
                          module_key(parent, c.parent_index, FORWARD) if parent is not None else None))
            if c.bwd_seq:
                order.append((c.bwd_seq, c.key(BACKWARD), {"input": c.out_grads or [], "output": c.in_grads or []},
                              module_key(parent, c.parent_index, BACKWARD) if parent is not None else None))
        order.sort(key=lambda item: item[0])
        data = {key: rec for _, key, rec, _ in order}
        construct = {key: parent for _, key, _, parent in order}
        for base, grads in self.param_grads.items():
            data[params_grad_key(base, 0)] = {name: [summary] for name, summary in grads.items()}
        groups: Dict[int, Tuple[List[str], Frames]] = {}      # one group per distinct frames list
        for c in self.calls:
            if c.frames is not None and c.outputs is not None:
                groups.setdefault(id(c.frames), ([], c.frames))[0].append(c.key(FORWARD))
        return data, construct, list(groups.values())

    def compact(self) -> None:
        """Pack the calls (see the module docstring); the signals (loss, norms, counts) must
        have been read before. marshal keeps shared objects shared (a summary used as one
        call's output and the next one's input, a frames list), so ``records`` reads the
        unpacked calls as it read these."""
        calls = [(c.base, c.index, c.parent, c.parent_index, c.seq, c.inputs, c.kwargs, c.outputs,
                  c.out_grads, c.in_grads, c.bwd_seq, c.frames) for c in self.calls]
        self.packed = marshal.dumps((calls, self.param_grads))
        self.calls, self.param_grads, self.param_by_id, self.losses = [], {}, {}, []

    def unpack(self) -> Tuple[Dict[str, Any], Dict[str, Optional[str]], List[Tuple[List[str], Frames]]]:
        """The records of this step (compacted or not), as ``records`` gives them."""
        if self.packed is None:
            return self.records()
        calls, param_grads = marshal.loads(self.packed)
        view = StepLog(self.step, self.rank, self.limit)
        view.param_grads = param_grads
        for (base, index, parent, parent_index, seq, inputs, kwargs, outputs, out_grads, in_grads, bwd_seq,
             frames) in calls:
            c = CallLog(view, base, index, parent, parent_index)
            c.seq, c.inputs, c.kwargs, c.outputs, c.out_grads, c.in_grads, c.bwd_seq, c.frames = (
                seq, inputs, kwargs, outputs, out_grads, in_grads, bwd_seq, frames)
            view.calls.append(c)
        return view.records()

    def loss(self) -> Optional[float]:
        """Mean of the losses observed this step (each one's mean over its elements)."""
        values = [_mean(v) for v in self.losses]
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    def grad_norm(self) -> Optional[float]:
        """Global gradient norm over the recorded parameters (each parameter counted once)."""
        norms = [s.get("Norm") for s in self.param_by_id.values() if is_tensor_summary(s)]
        norms = [n for n in norms if n is not None]
        return math.sqrt(sum(n * n for n in norms)) if norms else None

    def module_grad_norms(self) -> Dict[str, float]:
        """Per module with parameters: the norm of its own parameters' gradients."""
        out = {}
        for base, grads in self.param_grads.items():
            norms = [s.get("Norm") for s in grads.values() if is_tensor_summary(s) and s.get("Norm") is not None]
            if norms:
                out[base] = math.sqrt(sum(n * n for n in norms))
        return out

    def nonfinite_counts(self) -> Dict[str, int]:
        """Tensors holding NaN/Inf: module outputs (forward), gradients of module outputs and
        inputs (backward), parameter gradients."""
        calls = self.calls
        fwd = _count_bad([c.outputs for c in calls])
        bwd = _count_bad([c.out_grads for c in calls]) + _count_bad([c.in_grads for c in calls])
        par = _count_bad([list(grads.values()) for grads in self.param_grads.values()])
        return {"forward": fwd, "backward": bwd, "parameters_grad": par}


def _count_bad(values: List[Any]) -> int:
    """Tensor summaries holding NaN/Inf inside `values` (nested lists and dicts of summaries),
    walked with a stack: this runs on every step over every recorded tensor."""
    n = 0
    stack = list(values)
    pop, push = stack.pop, stack.extend
    while stack:
        v = pop()
        t = type(v)
        if t is list:
            push(v)
        elif t is dict:
            if is_tensor_summary(v):
                norm = v.get("Norm")          # NaN/Inf in a tensor makes its norm NaN/Inf too
                if isinstance(norm, float) and norm - norm != 0.0:      # (v - v: NaN for NaN and +-Inf)
                    n += 1
            else:
                push(v.values())
    return n


def _mean(value: Any) -> Optional[float]:
    if isinstance(value, dict):
        v = value.get("Mean")
        return float(v) if isinstance(v, (int, float)) else None
    return float(value) if isinstance(value, (int, float)) else None
