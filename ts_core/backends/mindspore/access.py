"""MindSpore's ``ModelAccess``: ``nn.Cell`` models in PyNative, Parameter hooks (a Parameter
keeps no accumulated gradient), and the post hook of Cells that define ``bprop``."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from mindspore import nn

from ..access import ModelAccess
from ._runtime import grad_recording
from .bprop_cells import has_bprop, register_post_hook
from .tensors import FLOATING


def own_parameters(cell: nn.Cell) -> Dict[str, Any]:
    """A Cell's own parameters by attribute name (``weight``, ``gamma``), not recursing."""
    params = getattr(cell, "_params", None)
    if isinstance(params, dict):
        return {k: v for k, v in params.items() if v is not None}
    return {k.rsplit(".", 1)[-1]: v for k, v in cell.parameters_dict(recurse=False).items()}


class MindSporeAccess(ModelAccess):
    framework = "mindspore"
    model_type_name = "mindspore.nn.Cell"
    keeps_grads = False              # gradients are returned, not stored: what the hooks saw stands

    def is_model(self, model: Any) -> bool:
        return isinstance(model, nn.Cell)

    def submodules(self, model: nn.Cell) -> Iterator[Tuple[str, nn.Cell]]:
        return ((path, cell) for path, cell in model.cells_and_names() if path and cell is not model)

    def own_parameters(self, module: nn.Cell) -> Dict[str, Any]:
        return own_parameters(module)

    def module_is_inplace(self, module: nn.Cell) -> bool:
        return False

    def may_get_grad(self, tensor: Any) -> bool:
        return tensor.dtype in FLOATING

    def grad_recording(self) -> bool:
        return grad_recording()

    def rank(self) -> Optional[int]:
        try:
            from mindspore.communication import GlobalComm, get_rank
        except ImportError:     # pragma: no cover
            return None
        if GlobalComm.INITED:
            return get_rank()
        return None

    def forward_pre_hook(self, module: nn.Cell, fn: Callable, *, prepend: bool, compile_mode: Optional[str]) -> Any:
        if prepend:
            raise ValueError("MindSpore Cells take no prepended forward pre-hook")
        return module.register_forward_pre_hook(fn, with_kwargs=True)

    def forward_hook(self, module: nn.Cell, fn: Callable, *, compile_mode: Optional[str]) -> Any:
        if has_bprop(module):       # MindSpore ignores register_forward_hook on such a Cell
            return register_post_hook(module, fn)
        return module.register_forward_hook(fn, with_kwargs=True, always_call=True)

    def param_grad_hook(self, param: Any, fn: Callable[[Any], None]) -> Any:
        def hook(grad: Any) -> None:
            fn(grad)
            return None             # a Parameter hook's return value would replace the gradient
        return param.register_hook(hook)

    def grad_hook(self, tensor: Any, fn: Callable[[Any], None]) -> bool:
        try:
            tensor.register_hook(fn)
        except RuntimeError:      # "requires grad is false": not in the autodiff graph
            return False
        return True
