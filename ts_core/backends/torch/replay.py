"""acc-check's PyTorch side: the callable a key names, CPU tensors in a chosen precision, calls
and gradients (the flow is ``acccheck/replay.py``).

``Functional.linear`` -> ``torch.nn.functional.linear``, ``Torch.matmul`` -> ``torch.matmul``
(``Torch.linalg.norm`` -> ``torch.linalg.norm``), ``Tensor.__add__`` -> ``torch.Tensor.__add__``
(the recorded ``input.0`` is ``self``). A custom API (``register_custom_api``) is imported from
the module its key names, or taken from the user's references. Collectives are not replayed.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import torch

from ...acccheck.outcome import ReplayError, Resolved, describe, import_dotted
from ...acccheck.plan import CallPlan, OtherArg
from ...dumpfmt.dtypes import dtype_name

FRAMEWORK = "pytorch"
_OWNERS = {"Functional": torch.nn.functional, "Torch": torch, "Tensor": torch.Tensor}
_COLLECTIVES = ("Distributed",)


def _orig(fn: Any) -> Any:
    """A function tsprobe wrapped (acc-check run in the training process): the original."""
    return getattr(fn, "__tsprobe_orig__", fn)


def torch_dtype(name: str) -> torch.dtype:
    d = getattr(torch, dtype_name(name), None)
    if not isinstance(d, torch.dtype):
        raise ReplayError(f"unknown torch dtype {name!r}")
    return d


class TorchAdapter:
    framework = FRAMEWORK

    def resolve(self, plan: CallPlan, references: dict) -> Resolved:
        ref = references.get(plan.name)
        if ref is not None:
            fn = ref if callable(ref) else import_dotted(str(ref))
            return Resolved(_orig(fn), True, f"graded against the reference {describe(fn)}")
        if plan.prefix in _COLLECTIVES:
            raise ReplayError("collective: its result depends on the other ranks' data (compare the ranks' "
                              "dumps with tsprobe compare instead)")
        owner = _OWNERS.get(plan.prefix)
        if owner is not None:
            obj: Any = owner
            try:
                for part in plan.api.split("."):
                    obj = getattr(obj, part)
            except AttributeError:
                raise ReplayError(f"{owner.__name__} has no {plan.api} in torch {torch.__version__}") from None
            return Resolved(_orig(obj), True)
        try:
            fn = import_dotted(plan.name)
        except ReplayError as e:
            raise ReplayError(f"custom API {plan.name}: {e}; give a reference implementation "
                              f"(--reference {plan.name}=module.function)") from None
        return Resolved(_orig(fn), False, "replayed through its own code (no --reference): its precision "
                                          "is checked, not its formula")

    def tensor(self, arr: np.ndarray, dtype: str, shape: List[int], float_dtype: Optional[str]) -> torch.Tensor:
        x = torch.from_numpy(arr).to(torch_dtype(dtype))
        if x.numel() == int(np.prod(shape)) and list(x.shape) != list(shape):
            x = x.reshape(shape)
        if float_dtype is not None:
            if x.is_floating_point():
                x = x.to(torch_dtype(float_dtype))
            elif x.is_complex():
                x = x.to(torch.complex128 if float_dtype == "float64" else torch.complex64)
        return x

    def other(self, o: OtherArg, float_dtype: Optional[str]) -> Any:
        if o.type == "torch.dtype":
            d = torch_dtype(o.value)
            return torch_dtype(float_dtype) if float_dtype is not None and d.is_floating_point else d
        if o.type == "torch.Size":
            return torch.Size(o.value)
        if o.type == "torch.device":
            return torch.device("cpu")
        raise ReplayError(f"an argument of type {o.type} cannot be rebuilt from its recorded value {o.value!r}")

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, torch.Tensor)

    def dtype(self, x: Any) -> str:
        return str(x.dtype)

    def to_numpy(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            x = x.detach()
            if x.is_complex():
                x = torch.view_as_real(x.resolve_conj())
            return x.to(torch.float64).numpy() if x.is_floating_point() else x.numpy()
        if isinstance(x, torch.Size):
            return list(x)
        if isinstance(x, (torch.dtype, torch.device)):
            return str(x)
        return x

    def call(self, fn: Callable, args: list, kwargs: dict, autocast: Optional[str], grad: bool = False) -> Any:
        ctx = torch.autocast("cpu", dtype=torch_dtype(autocast)) if autocast else contextlib.nullcontext()
        with torch.set_grad_enabled(grad), ctx:
            return fn(*args, **kwargs)

    def vjp(self, run: Callable[[list], list], leaves: list, cotangents: Callable[[list], list]
            ) -> Tuple[list, list]:
        ls = [x.detach().requires_grad_(True) for x in leaves]
        outs = run([x.clone() for x in ls])              # a clone: in-place calls may write into it
        cot = cotangents(outs)
        pairs = [(o, c.to(o.dtype).reshape(o.shape)) for o, c in zip(outs, cot)
                 if c is not None and isinstance(o, torch.Tensor) and o.requires_grad]
        if not pairs:
            raise ReplayError("no output of the replay requires grad")
        grads = torch.autograd.grad([o for o, _ in pairs], ls, [c for _, c in pairs], allow_unused=True)
        return outs, list(grads)

    def shape(self, x: Any) -> List[int]:
        return list(x.shape)


ADAPTER = TorchAdapter()

