"""acc-check's MindSpore side: keys to callables, CPU tensors in a chosen precision, calls (the
flow is ``acccheck/replay.py``).

``Functional.x`` -> ``mindspore.ops.x``, ``Mint.x`` -> ``mindspore.mint.x``,
``MintFunctional.x`` -> ``mindspore.mint.nn.functional.x``, ``Tensor.x`` -> ``mindspore.Tensor.x``
(``input.0`` is ``self``). Not replayed: ``Primitive.*`` calls (a Primitive instance's
attributes are not recorded), collectives, and the backward (MindSpore records gradients of
Parameters only, so the inputs that received one are not known); the report says so per call.
Runs on the CPU device in PyNative mode.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor

from ...acccheck.outcome import ReplayError, Resolved, describe, import_dotted
from ...acccheck.plan import CallPlan, OtherArg
from ...acccheck.replay import flatten_outputs
from ...dumpfmt.dtypes import dtype_name
from ._runtime import warm_up

FRAMEWORK = "mindspore"
_NAMESPACES = {"Functional": "mindspore.ops", "Mint": "mindspore.mint",
               "MintFunctional": "mindspore.mint.nn.functional"}
_COLLECTIVES = ("Distributed", "MintDistributed")
_DTYPES = {"float16": ms.float16, "bfloat16": ms.bfloat16, "float32": ms.float32, "float64": ms.float64,
           "int8": ms.int8, "int16": ms.int16, "int32": ms.int32, "int64": ms.int64, "uint8": ms.uint8,
           "bool": ms.bool_, "bool_": ms.bool_, "complex64": ms.complex64, "complex128": ms.complex128}
_FLOATS = (ms.float16, ms.bfloat16, ms.float32, ms.float64)


def ms_dtype(name: str):
    d = _DTYPES.get(dtype_name(name))
    if d is None:
        raise ReplayError(f"unknown MindSpore dtype {name!r}")
    return d


class MindSporeAdapter:
    framework = FRAMEWORK
    no_backward = ("backward not replayed: MindSpore records gradients of Parameters only, so which inputs "
                   "received one is unknown")

    def __init__(self) -> None:
        self._ready = False

    def _setup(self) -> None:
        if not self._ready:
            ms.set_device("CPU")
            warm_up()
            self._ready = True

    def resolve(self, plan: CallPlan, references: dict) -> Resolved:
        self._setup()
        ref = references.get(plan.name)
        if ref is not None:
            fn = ref if callable(ref) else import_dotted(str(ref))
            return Resolved(fn, True, f"graded against the reference {describe(fn)}")
        if plan.prefix in _COLLECTIVES:
            raise ReplayError("collective: its result depends on the other ranks' data (compare the ranks' "
                              "dumps with tsprobe compare instead)")
        if plan.prefix == "Primitive":
            raise ReplayError("a Primitive call: the Primitive instance's attributes are not recorded")
        if plan.prefix == "Tensor":
            obj: Any = Tensor
        elif plan.prefix in _NAMESPACES:
            obj = import_dotted(_NAMESPACES[plan.prefix])
        else:
            try:
                fn = import_dotted(plan.name)
            except ReplayError as e:
                raise ReplayError(f"custom API {plan.name}: {e}; give a reference implementation "
                                  f"(--reference {plan.name}=module.function)") from None
            return Resolved(getattr(fn, "__tsprobe_orig__", fn), False, "replayed through its own code (no "
                            "--reference): its precision is checked, not its formula")
        try:
            for part in plan.api.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            raise ReplayError(f"MindSpore {ms.__version__} has no {plan.name}") from None
        return Resolved(getattr(obj, "__tsprobe_orig__", obj), True)

    def tensor(self, arr: np.ndarray, dtype: str, shape: List[int], float_dtype: Optional[str]) -> Tensor:
        d = ms_dtype(dtype)
        if float_dtype is not None and d in _FLOATS:
            d = ms_dtype(float_dtype)
        if arr.size == int(np.prod(shape)):
            arr = arr.reshape(shape)
        if d == ms.bfloat16:
            return Tensor(arr.astype(np.float32)).astype(ms.bfloat16)
        return Tensor(arr).astype(d)

    def other(self, o: OtherArg, float_dtype: Optional[str]) -> Any:
        if o.type == "mindspore.dtype":
            d = ms_dtype(o.value)
            return ms_dtype(float_dtype) if float_dtype is not None and d in _FLOATS else d
        if o.type.startswith("numpy."):
            return o.value
        raise ReplayError(f"an argument of type {o.type} cannot be rebuilt from its recorded value {o.value!r}")

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, Tensor)

    def dtype(self, x: Any) -> str:
        return str(x.dtype)

    def shape(self, x: Any) -> List[int]:
        return list(x.shape)

    def to_numpy(self, x: Any) -> Any:
        if isinstance(x, Tensor):
            if x.dtype in _FLOATS:
                return x.astype(ms.float32 if x.dtype == ms.bfloat16 else x.dtype).asnumpy().astype(np.float64)
            return x.asnumpy()
        if isinstance(x, ms.dtype.Type):
            return str(x)
        return x

    def call(self, fn: Callable, args: list, kwargs: dict, autocast: Optional[str], grad: bool = False) -> Any:
        if autocast:
            raise ReplayError(f"no CPU autocast({autocast}) in MindSpore")
        out = fn(*args, **kwargs)
        for x in flatten_outputs(out):
            if isinstance(x, Tensor):
                x.asnumpy()          # a kernel error surfaces at the next sync: make it this call's
        return out

    def vjp(self, run: Callable[[list], list], leaves: list, cotangents: Callable[[list], list]
            ) -> Tuple[list, list]:
        raise ReplayError(self.no_backward)


ADAPTER = MindSporeAdapter()

