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
import sys
from typing import Any, Dict, Iterator, Optional, Tuple

import torch

from ..base import Backend
from . import compiled
from .api_hooks import ApiPatcher, node_target
from .grad_capture import GradCapture, on_grad, release_leaf_hooks
from .tensors import TorchAdapter

__all__ = ["TorchBackend", "TorchAdapter"]


class TorchBackend(Backend):
    """Records ``nn.Module`` models and the torch APIs of api_list.yaml."""

    adapter_class = TorchAdapter
    skip_dirs = (os.path.dirname(torch.__file__),)
    # FSDP2's and DTensor's own tensor calls (callers.py); torch.compile's frame wrappers in between
    internal_dirs = (os.path.join(os.path.dirname(torch.__file__), "distributed"),)
    transparent_dirs = (os.path.join(os.path.dirname(torch.__file__), "_dynamo"),)
    api_patcher_class = ApiPatcher
    model_type_name = "torch.nn.Module"
    module_prefix = "Module"

    def _check_runtime_impl(self) -> None:
        compiled.watch_compiler()      # API wrappers stand aside while torch.compile compiles

    def _hook_model(self, model: torch.nn.Module, index: Optional[int]) -> None:
        new = model not in self.hooks.hooked
        super()._hook_model(model, index)
        if new and compiled.mode(self.cfg.compile_mode) == "shadow":     # module records of a compiled model: shadow.py
            from .shadow import EagerShadow

            self.hooks.handles.extend(EagerShadow(model, self.switch).hooks(model))

    def _is_model_impl(self, model: Any) -> bool:
        return isinstance(model, torch.nn.Module)

    def _submodules_impl(self, model: torch.nn.Module) -> Iterator[Tuple[str, torch.nn.Module]]:
        return compiled.submodules(model)

    def _class_name_impl(self, module: torch.nn.Module) -> str:
        # a compiled wrapper is named as the module it wraps; fully_shard swaps a module's class
        # for FSDP{Class}(FSDPModule, Class): name the user's
        cls = type(compiled.unwrap(module))
        fsdp = sys.modules.get("torch.distributed.fsdp")
        wrapper = getattr(fsdp, "FSDPModule", None)
        if wrapper is not None and issubclass(cls, wrapper):
            cls = next((c for c in cls.__mro__ if not issubclass(c, wrapper)), cls)
        return cls.__name__

    def _own_parameters_impl(self, module: torch.nn.Module) -> Dict[str, Any]:
        # named_parameters(recurse=False) without its generator chain (every module call at L0
        # and mix): set entries, one name per parameter object, in order
        own: Dict[str, Any] = {}
        seen = set()
        for name, p in compiled.unwrap(module)._parameters.items():
            if p is not None and p not in seen:
                seen.add(p)
                own[name] = p
        return own

    def _forward_pre_hook_impl(self, module: torch.nn.Module, hook, with_kwargs: bool) -> Any:
        breaks = compiled.breaks_at_modules(self.cfg.compile_mode)
        return module.register_forward_pre_hook(compiled.outside_graph(hook, breaks), with_kwargs=with_kwargs)

    def _forward_hook_impl(self, module: torch.nn.Module, hook, with_kwargs: bool) -> Any:
        breaks = compiled.breaks_at_modules(self.cfg.compile_mode)
        return module.register_forward_hook(compiled.outside_graph(hook, breaks), with_kwargs=with_kwargs,
                                            always_call=True)

    def _hook_param_impl(self, base: str, pname: str, param: torch.Tensor) -> Any:
        self.hooks.watch_param(base, pname, param)
        return param.register_post_accumulate_grad_hook(lambda p: self._on_param_grad(base, pname, p.grad))

    def _param_grad_hook_impl(self, param: torch.Tensor, callback) -> Any:
        return param.register_post_accumulate_grad_hook(lambda p: callback(p.grad))

    def _grad_hook_impl(self, tensor: torch.Tensor, callback) -> bool:
        on_grad(tensor, callback)      # a leaf's hook is released at the next step
        return True

    def _accumulated_grad_impl(self, param: torch.Tensor) -> Optional[torch.Tensor]:
        return param.grad

    def _grad_recording_impl(self) -> bool:
        return torch.is_grad_enabled()

    def _grad_capture_impl(self, emit) -> GradCapture:
        return GradCapture(emit)

    def _hook_grad_impl(self, tensor: torch.Tensor, fn) -> None:
        on_grad(tensor, fn)            # a hook on a leaf (a parameter) is released at the next step

    def _new_step_impl(self) -> None:
        release_leaf_hooks()

    def _close_impl(self) -> None:
        release_leaf_hooks()

    def _may_get_grad_impl(self, tensor: torch.Tensor) -> bool:
        return tensor.requires_grad

    def _module_is_inplace_impl(self, module: torch.nn.Module) -> bool:
        # ReLU(inplace=True): its input is overwritten, so its node is hooked instead
        return getattr(module, "inplace", False) is True

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

    def _rank_impl(self) -> Optional[int]:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return None
