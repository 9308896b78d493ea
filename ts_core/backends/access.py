"""What a model of one framework looks like and how a hook goes on it: the framework half of
the hook owner (``ts_core/model_hooks.py``), shared by the dump (``base.Backend``), monitor mode
and every other client of a model's hooks.

One subclass per framework (``torch/access.py``, ``mindspore/access.py``,
``mindtorch/access.py``). Nothing here records anything: it answers questions about modules,
parameters and tensors, and registers hooks (returning removable handles).
"""
from __future__ import annotations

import abc
from typing import Any, Callable, Dict, Iterator, Optional, Tuple


class ModelAccess(abc.ABC):
    """A framework's modules, parameters, gradients and hook registration (see the module doc)."""

    framework: str = ""                  # as dump.json names it: pytorch / mindspore / mindtorch
    model_type_name: str = ""            # for errors: "torch.nn.Module"
    keeps_grads: bool = True             # a parameter keeps its accumulated gradient (re-readable)

    # -- the model -------------------------------------------------------------------------------
    @abc.abstractmethod
    def is_model(self, model: Any) -> bool:
        """Is `model` a model of this framework (``nn.Module`` / ``nn.Cell``)?"""

    @abc.abstractmethod
    def submodules(self, model: Any) -> Iterator[Tuple[str, Any]]:
        """(dotted path, submodule) for every submodule of `model`, `model` itself excluded."""

    @abc.abstractmethod
    def own_parameters(self, module: Any) -> Dict[str, Any]:
        """`module`'s own parameters by attribute name (not recursing)."""

    def forward_parameters(self, module: Any) -> Dict[str, Any]:
        """The parameter values a forward record of `module` holds (default: its own parameters;
        torch: FSDP1's flattened ones, as the module's own again)."""
        return self.own_parameters(module)

    def class_name(self, module: Any) -> str:
        """The class a module's records are named after (default: the module's own class)."""
        return type(module).__name__

    @abc.abstractmethod
    def module_is_inplace(self, module: Any) -> bool:
        """Does `module` overwrite its input (its inputs must then stay the caller's tensors)?"""

    # -- tensors and gradients -----------------------------------------------------------------
    @abc.abstractmethod
    def may_get_grad(self, tensor: Any) -> bool:
        """Can `tensor` receive a gradient?"""

    @abc.abstractmethod
    def grad_recording(self) -> bool:
        """Is the framework recording ops for a gradient right now?"""

    def accumulated_grad(self, param: Any) -> Any:
        """`param`'s current accumulated gradient (None when there is none)."""
        return None

    @abc.abstractmethod
    def rank(self) -> Optional[int]:
        """This process's rank in the framework's distributed group; None when not distributed."""

    # -- registering hooks (the hook owner calls these) ----------------------------------------
    @abc.abstractmethod
    def forward_pre_hook(self, module: Any, fn: Callable, *, prepend: bool, compile_mode: Optional[str]) -> Any:
        """Run ``fn(module, args, kwargs)`` before every forward of `module` (a returned pair
        replaces the arguments); returns the removable handle. `compile_mode`: see ``ModelHook``."""

    @abc.abstractmethod
    def forward_hook(self, module: Any, fn: Callable, *, compile_mode: Optional[str]) -> Any:
        """Run ``fn(module, args, kwargs, output)`` after every forward of `module`, also when the
        forward raises, so a failed call never leaves its record open; returns the handle."""

    @abc.abstractmethod
    def param_grad_hook(self, param: Any, fn: Callable[[Any], None]) -> Any:
        """Have ``fn(grad)`` see each gradient of `param` (unchanged); returns the removable
        handle, or None when nothing was hooked."""

    @abc.abstractmethod
    def grad_hook(self, tensor: Any, fn: Callable[[Any], None]) -> bool:
        """Have ``fn(grad)`` see the gradient of `tensor` (`fn` returns None: the gradient is
        unchanged); False when the tensor cannot get one."""

    def backward_end(self, callback: Callable[[], None]) -> Any:
        """An object whose ``watch(output) -> bool`` arranges ``callback()`` once when the
        backward through `output` has finished; None where the framework cannot tell."""
        return None

