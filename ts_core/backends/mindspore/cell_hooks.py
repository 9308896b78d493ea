"""L0: forward, backward and parameter-gradient records of every sub-Cell.

Forward: ``register_forward_pre_hook(with_kwargs=True)`` records the inputs before
``construct`` runs and hands back the inputs routed through the gradient tap (see
grad_capture); ``register_forward_hook(with_kwargs=True, always_call=True)`` records outputs and
the Cell's own parameters. Parameter gradients: ``Parameter.register_hook`` (PyNative), emitted
as ``Cell.{path}.{Class}.parameters_grad.0`` at the end of the step.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Optional

from ..hook_set import HookSet
from .._depth import DEPTH, internal
from ._runtime import grad_recording
from .grad_capture import GradCapture, Pending


def own_parameters(cell) -> Dict[str, Any]:
    """A Cell's own parameters by attribute name (``weight``, ``gamma``), not recursing."""
    params = getattr(cell, "_params", None)
    if isinstance(params, dict):
        return {k: v for k, v in params.items() if v is not None}
    return {k.rsplit(".", 1)[-1]: v for k, v in cell.parameters_dict(recurse=False).items()}


class CellHooks(HookSet):
    def __init__(self, collector, switch, pending: Optional[Pending]):
        super().__init__(collector)
        self.switch = switch
        self.pending = pending           # None: backward records not wanted

    def install(self, model, index: Optional[int] = None) -> int:
        """Hook every sub-Cell of `model` (not `model` itself). Idempotent per model."""
        if id(model) in self.hooked:
            return 0
        self.hooked[id(model)] = model
        count = 0
        for path, cell in model.cells_and_names():
            if not path or cell is model:
                continue
            name = path if index is None else f"{index}.{path}"
            base = f"Cell.{name}.{type(cell).__name__}"
            self.handles.append(cell.register_forward_pre_hook(
                functools.partial(self._pre, base), with_kwargs=True))
            self.handles.append(cell.register_forward_hook(
                functools.partial(self._post, base), with_kwargs=True, always_call=True))
            if self.pending is not None:
                for pname, param in own_parameters(cell).items():
                    if getattr(param, "requires_grad", False):
                        self.handles.append(param.register_hook(
                            functools.partial(self._param_grad, base, pname)))
            count += 1
        return count

    def _pre(self, base: str, cell, args, kwargs):
        if not self.switch.active:
            return None
        stack = self._open.setdefault(id(cell), [])
        if DEPTH.value:
            stack.append(None)
            return None
        col = self.collector
        with internal():
            call = col.begin(base, is_module=True)
            capture = None
            if call.selected:
                run_args, run_kwargs = args, kwargs
                if self.pending is not None and grad_recording():
                    capture = GradCapture(lambda go, gi: col.backward(call, go, gi), self.pending)
                    run_args, run_kwargs = capture.tap_inputs(args, kwargs)    # before the stats ops
                col.forward_inputs(call, args, kwargs)
                args, kwargs = run_args, run_kwargs
            stack.append((call, capture))
        return (args, kwargs) if capture is not None and capture.tapped else None

    def _post(self, base: str, cell, args, kwargs, output):
        stack = self._open.get(id(cell))
        if not stack:
            return None
        entry = stack.pop()
        if entry is None:
            return None
        call, capture = entry
        col = self.collector
        with internal():
            try:
                if call.selected:
                    if capture is not None:
                        capture.watch_outputs(output)
                    params = own_parameters(cell)
                    col.forward_outputs(call, output, params or None)
            finally:
                col.end(call)
        return None

    def _param_grad(self, base: str, pname: str, grad):
        col = self.collector
        if col.dump is None or grad is None:
            return None
        with internal():
            self.store_param_grad(base, pname, grad)
        return None

