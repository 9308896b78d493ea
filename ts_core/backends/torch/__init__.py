"""PyTorch backend: API wrapping (L1), module hooks (L0), both (mix)."""
from __future__ import annotations

import os
from typing import Any, Optional

import torch

from .._depth import internal
from .api_hooks import ApiPatcher, run_api
from .grad_capture import flat_tensors, hook_grad, release_leaf_hooks
from .module_hooks import ModuleHooks
from .tensors import TorchAdapter

__all__ = ["TorchBackend", "TorchAdapter"]


class TorchBackend:
    framework = "pytorch"
    adapter_class = TorchAdapter
    skip_dirs = (os.path.dirname(torch.__file__),)

    def __init__(self, cfg, collector, switch):
        self.cfg = cfg
        self.collector = collector
        self.switch = switch
        want_backward = collector.want["backward", "input"] or collector.want["backward", "output"]
        self.want_backward = want_backward
        self.apis = ApiPatcher(self._run_api, switch)
        self.modules = ModuleHooks(collector, switch, want_backward)
        self._apis_installed = False

    def _run_api(self, orig, base, name, args, kwargs):
        return run_api(self.collector, orig, base, name, args, kwargs, self.want_backward)

    def install(self, model: Any = None) -> None:
        level = self.cfg.level
        if level in ("L1", "mix") and not self._apis_installed:
            self.apis.install()
            self._apis_installed = True
        if model is not None and level in ("L0", "mix"):
            models = model if isinstance(model, (list, tuple)) else [model]
            for i, m in enumerate(models):
                if not isinstance(m, torch.nn.Module):
                    raise TypeError(f"start(model=...) expects torch.nn.Module, got {type(m).__name__}")
                self.modules.install(m, index=i if len(models) > 1 else None)

    def watch_iterations(self, model: torch.nn.Module, on_begin, on_end) -> None:
        """Call on_begin/on_end around every forward of the root model (token ranges)."""
        self.modules.handles.append(model.register_forward_pre_hook(lambda m, a: on_begin()))
        self.modules.handles.append(model.register_forward_hook(lambda m, a, o: on_end(), always_call=True))

    def save_backward(self, key: str, variable: Any) -> None:
        """Debug-level save: record the gradients of `variable`'s tensors when they arrive."""
        tensors = [t for t in flat_tensors(variable, []) if t.requires_grad]
        if not tensors or not torch.is_grad_enabled():
            return
        grads: dict = {}
        col = self.collector

        def make_hook(i):
            def hook(grad):
                with internal():
                    grads[i] = grad
                    if len(grads) == len(tensors):
                        ordered = [grads[j] for j in range(len(tensors))]
                        value = ordered[0] if isinstance(variable, torch.Tensor) else ordered
                        col.save_value(key, value)
            return hook

        for i, t in enumerate(tensors):
            hook_grad(t, make_hook(i))

    def capture_param_grads(self) -> None:
        with internal():
            self.modules.capture_param_grads()

    def end_step(self) -> None:
        with internal():
            self.modules.emit_param_grads()

    def new_step(self) -> None:
        self.modules.reset()
        release_leaf_hooks()

    @staticmethod
    def rank() -> Optional[int]:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return None

    def register_custom_api(self, module: Any, api_name: str, api_prefix: Optional[str] = None) -> None:
        self.apis.register(module, api_name, api_prefix)

    def restore_custom_api(self, module: Any, api_name: str) -> None:
        self.apis.unregister(module, api_name)

    def close(self) -> None:
        self.apis.restore()
        self.modules.remove()
        release_leaf_hooks()
        self._apis_installed = False
