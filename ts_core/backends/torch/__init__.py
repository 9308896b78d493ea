"""PyTorch backend: API wrapping (L1), module hooks (L0), both (mix).

What is torch's own (the flow is ``backends/base.py``): modules are ``nn.Module``; parameter
gradients come from ``register_post_accumulate_grad_hook`` and can be re-read from ``.grad``;
backward is captured without adding a node to the autograd graph: read-only hooks on the nodes
a call created that feed its inputs, or, for in-place and view-returning calls, a hook on the
output's autograd node (grad_capture).

Under torch.compile (compiled.py) module hooks run outside the graph, at graph breaks, and API
wrappers are transparent inside compiled regions; a compiled model is named as the model it wraps.
"""
from __future__ import annotations

import os
import weakref
from typing import Any, Optional

import torch

from ...model_hooks import hooks_of
from ..base import Backend, _ModuleRecords
from . import compiled
from .access import TorchAccess
from .api_hooks import ApiPatcher, node_target
from .grad_capture import GradCapture, recomputing, release_leaf_hooks
from .tensors import TorchAdapter
from .uninit import Tracker

__all__ = ["TorchBackend", "TorchAdapter"]


class TorchBackend(Backend):
    """Records ``nn.Module`` models and the torch APIs of api_list.yaml."""

    adapter_class = TorchAdapter
    access_class = TorchAccess
    skip_dirs = (os.path.dirname(torch.__file__),)
    # FSDP2's and DTensor's own tensor calls, the optimizers' and gradient clipping's (whose
    # calls torch picks per device: callers.py); torch.compile's frame wrappers in between
    internal_dirs = tuple(os.path.join(os.path.dirname(torch.__file__), *p) for p in
                          (("distributed",), ("optim",), ("nn", "utils", "clip_grad.py")))
    transparent_dirs = (os.path.join(os.path.dirname(torch.__file__), "_dynamo"),)
    api_patcher_class = ApiPatcher
    module_prefix = "Module"
    recomputing = staticmethod(recomputing)

    def __init__(self, cfg: Any, collector: Any, switch: Any):
        super().__init__(cfg, collector, switch)
        self.uninit = Tracker(switch)      # buffers not yet written: their values are never summarised
        self._models: list = []            # weak references to the models given to start()
        self._regions: Any = weakref.WeakKeyDictionary()   # model -> its boundary's client (_record_region)

    def install(self, model: Any = None) -> None:
        super().install(model)
        models = model if isinstance(model, (list, tuple)) else [model] if model is not None else []
        for i, m in enumerate(models):
            if not any(ref() is m for ref in self._models):
                self._models.append(weakref.ref(m))
            if not self.hooks_modules:       # L1: the region's boundary all the same (L0/mix: _hook_model)
                self._record_region(m, i if len(models) > 1 else None)

    def _record_region(self, model: torch.nn.Module, index: Optional[int]) -> None:
        """``torch.compile(model)`` handed over in compile_mode ``boundaries``: nothing inside is
        recorded, so the region is recorded at its boundary, as its root module (``Module.Net``:
        inputs, outputs, own parameters, output and input gradients; parameter gradients stay with
        the submodules' records). The hooks sit on the OptimizedModule, whose own call runs
        outside dynamo: the compiled program is untouched. Once per model."""
        if compiled.unwrap(model) is model or compiled.mode(self.cfg.compile_mode) != "boundaries":
            return
        owner = hooks_of(model, self.access)
        if self._regions.get(model) in owner:       # still hooked (the handles go at close)
            return
        root = "" if index is None else str(index)
        region = _ModuleRecords(self, self.switch, self.hooks, submodules=False, name=lambda path, m: root,
                                param_grads=False)
        self._regions[model] = region
        self.hooks.handles.append(owner.add(region))

    def _step_notes_impl(self) -> list:
        mode = compiled.mode(self.cfg.compile_mode)
        if mode != "boundaries":
            return []
        whole = [m for m in (ref() for ref in self._models) if m is not None and compiled.compiled_whole(m)]
        if not whole:
            return []
        name = type(compiled.unwrap(whole[0])).__name__
        boundary = "" if compiled.unwrap(whole[0]) is whole[0] else \
            f"its boundary (the region's inputs, outputs and their gradients, as Module.{name}), "
        return [f"the model {name} ran compiled as a whole by torch.compile, and in compile_mode 'boundaries' (the "
                f"default) no call inside a compiled region is recorded: this dump holds only {boundary}the calls "
                f"made outside it and the parameter gradients, so a divergence inside {name} is not localised. Set "
                f"compile_mode 'shadow' (TSPROBE_COMPILE=shadow: its modules recorded by an eager re-run, the "
                f"compiled training unchanged) to localise it"]

    def _check_runtime_impl(self) -> None:
        compiled.watch_compiler()      # API wrappers stand aside while torch.compile compiles
        self.uninit.install()          # before the API wrappers, which then wrap its writers

    def _hook_model(self, model: torch.nn.Module, index: Optional[int]) -> None:
        new = model not in self.hooks.hooked
        super()._hook_model(model, index)
        self._record_region(model, index)
        if new and compiled.mode(self.cfg.compile_mode) == "shadow":     # module records of a compiled model: shadow.py
            from .shadow import EagerShadow

            self.hooks.handles.append(hooks_of(model, self.access).add(EagerShadow(model, self.switch)))

    def _grad_capture_impl(self, emit) -> GradCapture:
        return GradCapture(emit)

    def _new_step_impl(self) -> None:
        release_leaf_hooks()

    def _end_step_impl(self) -> None:
        # FSDP1 with use_orig_params=True gives its original parameters their gradients (views of
        # the flat one) at the end of backward, without accumulating into them: no gradient hook
        # of theirs runs. Read them here, where the hooks left nothing.
        got = self.hooks.param_grads
        for base, pname, param in self.hooks.watched_params():
            if getattr(param, "_fsdp_flattened", False) and param.grad is not None and \
                    pname not in got.get(base, ()):
                self._on_param_grad(base, pname, param.grad)

    def _close_impl(self) -> None:
        release_leaf_hooks()
        self.uninit.restore()          # after the API wrappers came off (base.close)

    def _watch_module_outputs_impl(self, capture: GradCapture, output: Any, args: tuple, inplace: bool) -> None:
        if inplace:
            capture.watch_node(node_target(output, args, inplace=True))
        else:
            capture.watch_outputs(output)

    def _watch_api_outputs_impl(self, capture: GradCapture, out: Any, args: tuple, kwargs: dict,
                                inplace: bool) -> None:
        if capture.watching:
            capture.watch_outputs(out)
        else:
            capture.watch_node(node_target(out, args, inplace))

