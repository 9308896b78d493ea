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
from typing import Any, Optional

import torch

from ..base import Backend
from . import compiled
from .access import TorchAccess
from .api_hooks import ApiPatcher, node_target
from .grad_capture import GradCapture, release_leaf_hooks
from .tensors import TorchAdapter
from .uninit import Tracker

__all__ = ["TorchBackend", "TorchAdapter"]


class TorchBackend(Backend):
    """Records ``nn.Module`` models and the torch APIs of api_list.yaml."""

    adapter_class = TorchAdapter
    access_class = TorchAccess
    skip_dirs = (os.path.dirname(torch.__file__),)
    # FSDP2's and DTensor's own tensor calls (callers.py); torch.compile's frame wrappers in between
    internal_dirs = (os.path.join(os.path.dirname(torch.__file__), "distributed"),)
    transparent_dirs = (os.path.join(os.path.dirname(torch.__file__), "_dynamo"),)
    api_patcher_class = ApiPatcher
    module_prefix = "Module"

    def __init__(self, cfg: Any, collector: Any, switch: Any):
        super().__init__(cfg, collector, switch)
        self.uninit = Tracker(switch)      # buffers not yet written: their values are never summarised

    def _check_runtime_impl(self) -> None:
        compiled.watch_compiler()      # API wrappers stand aside while torch.compile compiles
        self.uninit.install()          # before the API wrappers, which then wrap its writers

    def _hook_model(self, model: torch.nn.Module, index: Optional[int]) -> None:
        new = model not in self.hooks.hooked
        super()._hook_model(model, index)
        if new and compiled.mode(self.cfg.compile_mode) == "shadow":     # module records of a compiled model: shadow.py
            from .shadow import EagerShadow

            self.hooks.handles.extend(EagerShadow(model, self.switch).hooks(model))

    def _grad_capture_impl(self, emit) -> GradCapture:
        return GradCapture(emit)

    def _new_step_impl(self) -> None:
        release_leaf_hooks()

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

