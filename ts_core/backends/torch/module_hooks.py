"""L0: forward, backward and parameter-gradient records of every submodule.

Backward capture uses the same tap as APIs (see grad_capture) instead of torch's full backward
hooks, so ``ReLU(inplace=True)`` and in-place ops on module outputs keep working.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Tuple

import torch

from .._depth import DEPTH, internal
from ..hook_set import HookSet
from .api_hooks import _node_target
from .grad_capture import GradCapture


class ModuleHooks(HookSet):
    def __init__(self, collector, switch, want_backward: bool):
        super().__init__(collector)
        self.switch = switch
        self.want_backward = want_backward
        self.params: List[Tuple[str, str, torch.Tensor]] = []    # (base, name, param) hooked

    def install(self, model: torch.nn.Module, index: Optional[int] = None) -> int:
        """Hook every submodule of `model` (not `model` itself). Idempotent per model."""
        if id(model) in self.hooked:
            return 0
        self.hooked[id(model)] = model
        count = 0
        for path, module in model.named_modules():
            if not path:
                continue
            name = path if index is None else f"{index}.{path}"
            base = f"Module.{name}.{type(module).__name__}"
            self.handles.append(module.register_forward_pre_hook(
                functools.partial(self._pre, base), with_kwargs=True))
            self.handles.append(module.register_forward_hook(
                functools.partial(self._post, base), with_kwargs=True, always_call=True))
            for pname, param in module.named_parameters(recurse=False):
                if param.requires_grad:
                    self.handles.append(param.register_post_accumulate_grad_hook(
                        functools.partial(self._param_grad, base, pname)))
                    self.params.append((base, pname, param))
            count += 1
        return count

    def _pre(self, base: str, module, args, kwargs):
        if not self.switch.active:
            return None
        stack = self._open.setdefault(id(module), [])
        if DEPTH.value:
            stack.append(None)
            return None
        col = self.collector
        with internal():
            call = col.begin(base, is_module=True)
            capture = None
            inplace = getattr(module, "inplace", False) is True
            if call.selected:
                col.forward_inputs(call, args, kwargs)
                if self.want_backward and torch.is_grad_enabled():
                    capture = GradCapture(lambda go, gi: col.backward(call, go, gi),
                                          on_start=lambda: col.backward_begins(call))
                    if not inplace:
                        args, kwargs = capture.tap_inputs(args, kwargs)
            stack.append((call, capture, inplace))
        return (args, kwargs) if capture is not None and capture.tapped else None

    def _post(self, base: str, module, args, kwargs, output):
        stack = self._open.get(id(module))
        if not stack:
            return None
        entry = stack.pop()
        if entry is None:
            return None
        call, capture, inplace = entry
        col = self.collector
        with internal():
            try:
                if call.selected:
                    if capture is not None:
                        if inplace:
                            capture.watch_node(_node_target(output, args, inplace=True))
                        else:
                            capture.watch_outputs(output)
                    params = dict(module.named_parameters(recurse=False))
                    col.forward_outputs(call, output, params or None)
            finally:
                col.end(call)
        return None

    def _param_grad(self, base: str, pname: str, param: torch.Tensor) -> None:
        col = self.collector
        if col.dump is None or param.grad is None:
            return
        with internal():
            self.store_param_grad(base, pname, param.grad)

    def capture_param_grads(self) -> None:
        """Re-read every hooked parameter's current .grad (the latest value wins)."""
        for base, pname, param in self.params:
            self._param_grad(base, pname, param)

    def remove(self) -> None:
        super().remove()
        self.params.clear()
