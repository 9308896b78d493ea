"""torch's ``ModelAccess``: ``nn.Module`` models, hooks that torch.compile never traces
(compiled.py), parameter gradients after accumulation, and the end of a backward."""
from __future__ import annotations

import sys
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from ..access import ModelAccess
from . import compiled
from .flat_params import FLAT_PARAM, FlatSlice, slices_of
from .grad_capture import on_grad


_MODULE_GETATTR = torch.nn.Module.__getattr__
# Wrappers that hold the user's module as a child of this name: FSDP1's FullyShardedDataParallel
# and activation checkpointing's CheckpointWrapper (torch.compile's ``_orig_mod``: compiled.py).
# The child is recorded for the wrapper, under the wrapper's path and its own class: the names
# of the plain model, so a plain run and a wrapped one compare module for module.
WRAPPED_CHILDREN = frozenset(("_fsdp_wrapped_module", "_checkpoint_wrapped_module"))
_PLAIN_MODULES: set = set()      # module classes seen not to be torch.compile's wrapper
# FSDP1 flat parameters (flat_params.py): id(module) -> (the module, weakly; {name: its slice}),
# for the modules of every hooked model whose parameters FSDP1 flattened
_SLICES: Dict[int, Tuple[Any, Dict[str, FlatSlice]]] = {}


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """``compiled.unwrap``, remembering the classes that are no wrapper (a class made before
    dynamo was loaded can never become a subclass of its wrapper)."""
    inner = compiled.unwrap(module)
    if inner is module:
        _PLAIN_MODULES.add(type(module))
    return inner


class TorchAccess(ModelAccess):
    framework = "pytorch"
    model_type_name = "torch.nn.Module"

    def is_model(self, model: Any) -> bool:
        return isinstance(model, torch.nn.Module)

    def submodules(self, model: torch.nn.Module) -> Iterator[Tuple[str, torch.nn.Module]]:
        modules = dict((id(m), m) for m in compiled.unwrap(model).modules())
        for key, slices in slices_of(compiled.unwrap(model)).items():
            _SLICES[key] = (weakref.ref(modules[key]), slices)
        for path, m in compiled.submodules(model):
            if not WRAPPED_CHILDREN.intersection(m._modules):
                if WRAPPED_CHILDREN.intersection(path.split(".")):
                    path = ".".join(p for p in path.split(".") if p not in WRAPPED_CHILDREN)
                if path:                   # "": the root's own module (the root is not recorded)
                    yield path, m

    def class_name(self, module: torch.nn.Module) -> str:
        # a compiled wrapper is named as the module it wraps; fully_shard swaps a module's class
        # for FSDP{Class}(FSDPModule, Class): name the user's
        cls = type(compiled.unwrap(module))
        fsdp = sys.modules.get("torch.distributed.fsdp")
        wrapper = getattr(fsdp, "FSDPModule", None)
        if wrapper is not None and issubclass(cls, wrapper):
            cls = next((c for c in cls.__mro__ if not issubclass(c, wrapper)), cls)
        return cls.__name__

    def own_parameters(self, module: torch.nn.Module) -> Dict[str, Any]:
        # named_parameters(recurse=False) without its generator chain (every module call at L0
        # and mix): one name per parameter object, in order
        if _SLICES:
            flat = _flat_slices(module)
            if flat is not None:
                return flat
        params = (module if type(module) in _PLAIN_MODULES else _unwrap(module))._parameters
        if not params:
            return {}
        own: Dict[str, Any] = {}
        seen = set()
        for name, p in params.items():
            if p is not None and p not in seen:
                seen.add(p)
                own[name] = p
        return own

    def forward_parameters(self, module: torch.nn.Module) -> Dict[str, Any]:
        params = self.own_parameters(module)
        if not _SLICES or not any(type(p) is FlatSlice for p in params.values()):
            return params
        values = {name: p.value(module, name) if type(p) is FlatSlice else p for name, p in params.items()}
        return {name: v for name, v in values.items() if v is not None}

    def module_is_inplace(self, module: torch.nn.Module) -> bool:
        # ReLU(inplace=True): its input is overwritten. Read from the instance's own attributes
        # where that is what getattr would find: nn.Module.__getattr__ raises (and getattr
        # catches) for every module without the attribute, on every module call.
        cls = type(module)
        if cls.__getattr__ is _MODULE_GETATTR and not hasattr(cls, "inplace"):
            return module.__dict__.get("inplace", False) is True
        return getattr(module, "inplace", False) is True

    def may_get_grad(self, tensor: torch.Tensor) -> bool:
        return tensor.requires_grad

    def grad_recording(self) -> bool:
        return torch.is_grad_enabled()

    def accumulated_grad(self, param: Any) -> Optional[torch.Tensor]:
        return param.grad() if type(param) is FlatSlice else param.grad

    def rank(self) -> Optional[int]:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return None

    # A hook body never runs on FakeTensors (compiled.outside_graph): with compile_mode None (a
    # hook at the model's edge) it runs at a graph break there, otherwise as the mode says.
    @staticmethod
    def _breaks(compile_mode: Optional[str]) -> bool:
        return True if compile_mode is None else compiled.breaks_at_modules(compile_mode)

    def forward_pre_hook(self, module: torch.nn.Module, fn: Callable, *, prepend: bool,
                         compile_mode: Optional[str]) -> Any:
        return module.register_forward_pre_hook(compiled.outside_graph(fn, self._breaks(compile_mode)),
                                                with_kwargs=True, prepend=prepend)

    def forward_hook(self, module: torch.nn.Module, fn: Callable, *, compile_mode: Optional[str]) -> Any:
        return module.register_forward_hook(compiled.outside_graph(fn, self._breaks(compile_mode)),
                                            with_kwargs=True, always_call=True)

    def param_grad_hook(self, param: Any, fn: Callable[[Any], None]) -> Any:
        if type(param) is FlatSlice:
            return param.hook(fn)
        return param.register_post_accumulate_grad_hook(lambda p: fn(p.grad))

    def grad_hook(self, tensor: torch.Tensor, fn: Callable[[Any], None]) -> bool:
        on_grad(tensor, fn)            # a hook on a leaf (a parameter) is released at the next step
        return True

    def backward_end(self, callback: Callable[[], None]) -> Optional["BackwardEnd"]:
        queue = _queue_callback()
        return None if queue is None else BackwardEnd(queue, callback)


def _flat_slices(module: torch.nn.Module) -> Optional[Dict[str, Any]]:
    """`module`'s own parameters where FSDP1 flattened some (its real ones but the flat
    parameter itself, then the slices of those it took), else None."""
    entry = _SLICES.get(id(module))
    if entry is None or entry[0]() is not module:
        return None
    own = {name: p for name, p in module._parameters.items() if p is not None and name != FLAT_PARAM}
    own.update(entry[1])
    return own


def _queue_callback() -> Optional[Callable[[Callable[[], None]], None]]:
    """torch's "run this when the current backward finishes", or None where torch lacks it."""
    try:
        from torch.autograd import Variable

        return Variable._execution_engine.queue_callback
    except (ImportError, AttributeError):        # pragma: no cover - every supported torch has it
        return None


class BackwardEnd:
    """``callback()`` once per backward that reaches a watched output: the first gradient of a
    watched tensor queues it at the end of that backward, queued once more so that it comes
    after the callbacks queued meanwhile (DDP copies its all-reduced gradients there)."""

    def __init__(self, queue: Callable[[Callable[[], None]], None], callback: Callable[[], None]):
        self._queue = queue
        self._callback = callback
        self.queued = False

    def watch(self, output: Any) -> bool:
        """Watch the tensors of `output` that require grad; False when none does."""
        tensors = _grad_tensors(output, [])
        for t in tensors:
            t.register_hook(self._on_grad)
        return bool(tensors)

    def reset(self) -> None:
        self.queued = False

    def _on_grad(self, grad: Any) -> None:
        if not self.queued:
            self.queued = True
            self._queue(self._finishing)
        return None

    def _finishing(self) -> None:
        self._queue(self._done)

    def _done(self) -> None:
        self.queued = False
        self._callback()


def _grad_tensors(output: Any, out: List[torch.Tensor], depth: int = 0) -> List[torch.Tensor]:
    """The tensors of a model output (nested up to 4 levels of dicts/lists) that require grad."""
    if isinstance(output, torch.Tensor):
        if output.requires_grad:
            out.append(output)
    elif depth < 4 and isinstance(output, dict):
        for v in output.values():
            _grad_tensors(v, out, depth + 1)
    elif depth < 4 and isinstance(output, (list, tuple)):
        for v in output:
            _grad_tensors(v, out, depth + 1)
    return out
