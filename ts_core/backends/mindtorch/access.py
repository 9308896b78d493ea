"""mindtorch's ``ModelAccess``: torch-style modules (``mindtorch.nn.Module``) on MindSpore
PyNative; hooks through MindSpore's own ``Tensor.register_hook`` (mindtorch overrides the
method), parameters that keep ``.grad`` (set by ``value_and_grad``)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import mindtorch  # before mindspore: whoever runs mindtorch code has loaded it already

from ..mindspore.access import MindSporeAccess
from .grad_capture import ms_register_hook


class MindtorchAccess(MindSporeAccess):
    framework = "mindtorch"
    model_type_name = "torch.nn.Module (mindtorch)"
    keeps_grads = True

    def is_model(self, model: Any) -> bool:
        return isinstance(model, mindtorch.nn.Module)

    def submodules(self, model: Any) -> Iterator[Tuple[str, Any]]:
        return ((path, m) for path, m in model.named_modules() if path)

    def own_parameters(self, module: Any) -> Dict[str, Any]:
        return dict(module.named_parameters(recurse=False))

    def module_is_inplace(self, module: Any) -> bool:
        return getattr(module, "inplace", False) is True

    def accumulated_grad(self, param: Any) -> Optional[Any]:
        return param.grad

    def forward_pre_hook(self, module: Any, fn: Callable, *, prepend: bool, compile_mode: Optional[str]) -> Any:
        return module.register_forward_pre_hook(fn, with_kwargs=True, prepend=prepend)

    def forward_hook(self, module: Any, fn: Callable, *, compile_mode: Optional[str]) -> Any:
        # mindtorch's register_forward_hook has no always_call argument, but its Module.__call__
        # honours the _forward_hooks_always_called table torch keeps for it: fill that in.
        handle = module.register_forward_hook(fn, with_kwargs=True)
        module._forward_hooks_always_called[handle.id] = True
        return handle

    def param_grad_hook(self, param: Any, fn: Callable[[Any], None]) -> Any:
        def hook(grad: Any) -> None:
            fn(grad)
            return None
        return ms_register_hook(param, hook)

    def grad_hook(self, tensor: Any, fn: Callable[[Any], None]) -> bool:
        try:
            ms_register_hook(tensor, fn)
        except RuntimeError:      # outside the autodiff graph
            return False
        return True
