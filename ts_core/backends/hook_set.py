"""What module (torch) and Cell (MindSpore) hooks have in common: the handles to remove, the
models already hooked, and the parameter gradients of the step awaiting their record."""
from __future__ import annotations

from typing import Any, Dict, List

from ..dumpfmt import params_grad_key, value_name


class HookSet:
    def __init__(self, collector: Any):
        self.collector = collector
        self.handles: List[Any] = []
        self.hooked: Dict[int, Any] = {}
        self._open: Dict[int, list] = {}          # per module: the calls in flight (re-entrancy)
        self.param_grads: Dict[str, Dict[str, Any]] = {}

    def store_param_grad(self, base: str, pname: str, grad: Any) -> None:
        """Summarise a parameter's gradient now; the latest one per parameter is recorded."""
        summary = self.collector.summ.summarize(grad, value_name(params_grad_key(base, 0), pname))
        self.param_grads.setdefault(base, {})[pname] = [summary]     # msprobe: a one-element list

    def emit_param_grads(self) -> None:
        """One ``parameters_grad`` record per module with gradients this step."""
        grads, self.param_grads = self.param_grads, {}
        for base, rec in grads.items():
            self.collector.params_grad(base, rec)

    def reset(self) -> None:
        self._open.clear()
        self.param_grads.clear()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.hooked.clear()
        self.reset()
