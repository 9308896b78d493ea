"""MindSpore PyNative backend: API wrapping (L1), Cell hooks (L0), both (mix), Primitive calls
made through the model's Cells (L1/mix with ``start(model)``)."""
from __future__ import annotations

import os
import warnings
from typing import Any, Optional

import mindspore as ms
from mindspore import Tensor, nn

from .._depth import internal
from ._runtime import grad_recording, is_pynative, warm_up
from .api_hooks import ApiPatcher, run_api
from .cell_hooks import CellHooks
from .grad_capture import Pending, flat_tensors
from .primitive_hooks import PrimitivePatcher
from .tensors import FLOATING, MindSporeAdapter

__all__ = ["MindSporeBackend", "MindSporeAdapter"]


class MindSporeBackend:
    framework = "mindspore"
    adapter_class = MindSporeAdapter
    skip_dirs = (os.path.dirname(ms.__file__),)

    def __init__(self, cfg, collector, switch):
        warm_up()
        self.cfg = cfg
        self.collector = collector
        self.switch = switch
        want_backward = collector.want["backward", "input"] or collector.want["backward", "output"]
        self.want_backward = want_backward
        self.pending: Optional[Pending] = Pending() if want_backward else None
        self.apis = ApiPatcher(self._run_api, switch)
        self.primitives = PrimitivePatcher(self._run_api, switch)
        self.modules = CellHooks(collector, switch, self.pending)
        self._apis_installed = False
        self._extra_handles: list = []
        self._warned_graph = False

    def _run_api(self, orig, base, name, args, kwargs, inplace=None):
        return run_api(self.collector, orig, base, name, args, kwargs, self.pending, inplace)

    def install(self, model: Any = None) -> None:
        if not is_pynative() and not self._warned_graph:
            self._warned_graph = True
            warnings.warn("tsprobe: MindSpore is in GRAPH_MODE; Python hooks do not run inside compiled "
                          "graphs, so nothing is recorded there. Use PYNATIVE_MODE.", stacklevel=3)
        level = self.cfg.level
        if level in ("L1", "mix") and not self._apis_installed:
            self.apis.install()
            self._apis_installed = True
        if model is None:
            return
        models = model if isinstance(model, (list, tuple)) else [model]
        for i, m in enumerate(models):
            if not isinstance(m, nn.Cell):
                raise TypeError(f"start(model=...) expects mindspore.nn.Cell, got {type(m).__name__}")
            if level in ("L0", "mix"):
                self.modules.install(m, index=i if len(models) > 1 else None)
            if level in ("L1", "mix"):
                self.primitives.install(m)

    def watch_iterations(self, model, on_begin, on_end) -> None:
        """Call on_begin/on_end around every forward of the root Cell (token ranges)."""
        self._extra_handles.append(model.register_forward_pre_hook(lambda c, a: on_begin()))
        self._extra_handles.append(model.register_forward_hook(lambda c, a, o: on_end(), always_call=True))

    def save_backward(self, key: str, variable: Any) -> None:
        """Debug-level save: record the gradients of `variable`'s tensors when they arrive."""
        tensors = [t for t in flat_tensors(variable, []) if t.dtype in FLOATING]
        if not tensors or not grad_recording():
            return
        grads: dict = {}
        col = self.collector

        def make_hook(i):
            def hook(grad):
                with internal():
                    if i in grads:
                        return None
                    grads[i] = grad
                    if len(grads) == len(tensors):
                        ordered = [grads[j] for j in range(len(tensors))]
                        value = ordered[0] if isinstance(variable, Tensor) else ordered
                        col.save_value(key, value)
                return None
            return hook

        for i, t in enumerate(tensors):
            t.register_hook(make_hook(i))

    def end_step(self) -> None:
        with internal():
            if self.pending is not None:
                self.pending.flush()
            self.modules.emit_param_grads()

    def new_step(self) -> None:
        self.modules.reset()
        if self.pending is not None:
            self.pending.clear()

    @staticmethod
    def rank() -> Optional[int]:
        try:
            from mindspore.communication import GlobalComm, get_rank
        except ImportError:     # pragma: no cover
            return None
        if GlobalComm.INITED:
            return get_rank()
        return None

    def register_custom_api(self, module: Any, api_name: str, api_prefix: Optional[str] = None) -> None:
        self.apis.register(module, api_name, api_prefix)

    def restore_custom_api(self, module: Any, api_name: str) -> None:
        self.apis.unregister(module, api_name)

    def close(self) -> None:
        self.apis.restore()
        self.primitives.restore()
        self.modules.remove()
        for h in self._extra_handles:
            h.remove()
        self._extra_handles.clear()
        if self.pending is not None:
            self.pending.clear()
        self._apis_installed = False
