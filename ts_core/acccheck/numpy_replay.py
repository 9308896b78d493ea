"""A float64 reference replay of common PyTorch calls in numpy, for compare's diagnosis.

The diagnosis replays the first divergent call on golden's and on target's inputs
(``compare/explain/replaycheck.py``). Through torch that costs its import first: 2-3 s and
~200 MB here, several times the rest of a 2 GB compare. The calls a first divergence lands on
are mostly a handful (linear, matmul, embedding, layer norm, softmax, an activation, an
elementwise op), whose float64 result numpy computes as well. This adapter (acccheck/replay.py's
``Adapter``) replays exactly those; anything else (another op, an argument it does not model,
a random op, a backward) raises ReplayError, and the caller replays through the framework.

It gives the float64 reference only: ``Resolved.independent`` is False, so no same-precision
peer is run, and the caller keeps calls with a float16/bfloat16 tensor (whose precision the
peer grades) for torch. ``tests/compare/test_numpy_replay.py`` checks every op against torch's
own float64 replay of calls a real model recorded.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..dumpfmt.dtypes import dtype_name
from .outcome import ReplayError, Resolved
from .plan import CallPlan, OtherArg

FRAMEWORK = "pytorch"
_erf = np.frompyfunc(math.erf, 1, 1)


def _axes(dim: Any, ndim: int) -> Optional[Tuple[int, ...]]:
    if dim is None:
        return None
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return tuple(int(d) % ndim for d in dims)


def _linear(input, weight, bias=None):
    out = np.matmul(input, np.swapaxes(weight, -1, -2))
    return out if bias is None else out + bias


def _embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
               sparse=False):
    if max_norm is not None:
        raise ReplayError("embedding with max_norm renormalises its weight in place")
    return weight[input]


def _normalized_axes(input, normalized_shape) -> Tuple[int, ...]:
    """The trailing axes a layer or RMS norm normalises over."""
    return tuple(range(input.ndim - len(list(normalized_shape)), input.ndim))


def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    axes = _normalized_axes(input, normalized_shape)
    mean = input.mean(axis=axes, keepdims=True)
    var = ((input - mean) ** 2).mean(axis=axes, keepdims=True)
    out = (input - mean) / np.sqrt(var + eps)
    out = out * weight if weight is not None else out
    return out + bias if bias is not None else out


def _rms_norm(input, normalized_shape, weight=None, eps=None):
    axes = _normalized_axes(input, normalized_shape)
    eps = np.finfo(input.dtype).eps if eps is None else eps
    out = input / np.sqrt((input * input).mean(axis=axes, keepdims=True) + eps)
    return out * weight if weight is not None else out


def _softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        raise ReplayError("softmax without dim (the implicit dimension is deprecated)")
    z = np.exp(input - input.max(axis=dim, keepdims=True))
    return z / z.sum(axis=dim, keepdims=True)


def _log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    if dim is None:
        raise ReplayError("log_softmax without dim")
    shifted = input - input.max(axis=dim, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=dim, keepdims=True))


def _gelu(input, approximate="none"):
    if approximate == "tanh":
        return 0.5 * input * (1 + np.tanh(math.sqrt(2 / math.pi) * (input + 0.044715 * input ** 3)))
    return 0.5 * input * (1 + _erf(input / math.sqrt(2)).astype(input.dtype))


def _sigmoid(input):
    return 1 / (1 + np.exp(-input))


def _silu(input, inplace=False):
    return input * _sigmoid(input)


def _relu(input, inplace=False):
    return np.maximum(input, 0)


def _dropout(input, p=0.5, training=True, inplace=False):
    if training and p > 0:
        raise ReplayError("dropout while training draws random numbers")
    return input


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise ReplayError("attention dropout draws random numbers")
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key, value = np.repeat(key, rep, axis=-3), np.repeat(value, rep, axis=-3)
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = np.matmul(query, np.swapaxes(key, -1, -2)) * scale
    L, S = query.shape[-2], key.shape[-2]
    if is_causal:
        scores = np.where(np.tril(np.ones((L, S), dtype=bool)), scores, -np.inf)
    if attn_mask is not None:
        scores = np.where(attn_mask, scores, -np.inf) if attn_mask.dtype == bool else scores + attn_mask
    return np.matmul(_softmax(scores, -1), value)


def _addmm(input, mat1, mat2, *, beta=1, alpha=1):
    return beta * input + alpha * np.matmul(mat1, mat2)


def _add(input, other, *, alpha=1):
    return input + alpha * other


def _sub(input, other, *, alpha=1):
    return input - alpha * other


def _div(input, other, *, rounding_mode=None):
    if rounding_mode is not None:
        raise ReplayError(f"div with rounding_mode={rounding_mode!r}")
    return np.true_divide(input, other)


def _reduce(fn: Callable) -> Callable:
    def reduce(input, dim=None, keepdim=False, *, dtype=None):
        if dtype is not None:
            raise ReplayError("a reduction that casts (dtype=)")
        return fn(input, axis=_axes(dim, input.ndim), keepdims=keepdim)
    return reduce


def _shape_args(shape: tuple) -> Tuple[int, ...]:
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else tuple(shape)


_UNARY: Dict[str, Callable] = {"tanh": np.tanh, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "abs": np.abs,
                               "neg": np.negative, "sigmoid": _sigmoid, "rsqrt": lambda x: 1 / np.sqrt(x),
                               "sin": np.sin, "cos": np.cos}
_BINARY: Dict[str, Callable] = {"mul": np.multiply, "matmul": np.matmul, "mm": np.matmul, "bmm": np.matmul,
                                "pow": np.power, "add": _add, "sub": _sub, "div": _div, "true_divide": _div}

FUNCTIONAL: Dict[str, Callable] = {
    "linear": _linear, "embedding": _embedding, "layer_norm": _layer_norm, "rms_norm": _rms_norm,
    "softmax": _softmax, "log_softmax": _log_softmax, "gelu": _gelu, "silu": _silu, "relu": _relu,
    "dropout": _dropout, "scaled_dot_product_attention": _sdpa, "tanh": _UNARY["tanh"], "sigmoid": _UNARY["sigmoid"],
}
TORCH: Dict[str, Callable] = {
    **_UNARY, **_BINARY, "addmm": _addmm, "softmax": _softmax, "log_softmax": _log_softmax,
    "mean": _reduce(np.mean), "sum": _reduce(np.sum),
    "cat": lambda tensors, dim=0: np.concatenate([t for t in tensors if t.shape != (0,)], axis=dim),   # torch skips 1-D empties
    "transpose": lambda input, dim0, dim1: np.swapaxes(input, dim0, dim1),
}
TENSOR: Dict[str, Callable] = {
    **_UNARY, **_BINARY,
    "__add__": _add, "__radd__": lambda s, o: o + s, "__sub__": _sub, "__rsub__": lambda s, o: o - s,
    "__mul__": np.multiply, "__rmul__": lambda s, o: o * s, "__truediv__": _div,
    "__rtruediv__": lambda s, o: np.true_divide(o, s), "__matmul__": np.matmul, "__neg__": np.negative,
    "__pow__": np.power, "mean": _reduce(np.mean), "sum": _reduce(np.sum),
    "softmax": _softmax, "log_softmax": _log_softmax, "contiguous": lambda s, memory_format=None: s,
    "view": lambda s, *shape: s.reshape(_shape_args(shape)), "reshape": lambda s, *shape: s.reshape(_shape_args(shape)),
    "permute": lambda s, *dims: np.transpose(s, _shape_args(dims)),
    "transpose": lambda s, dim0, dim1: np.swapaxes(s, dim0, dim1),
    "unsqueeze": lambda s, dim: np.expand_dims(s, dim % (s.ndim + 1)),
    "float": lambda s, memory_format=None: s.astype(np.float32),        # as torch's reference run casts
    "masked_fill": lambda s, mask, value: np.where(mask, value, s),
}
_TABLES = {"Functional": FUNCTIONAL, "Torch": TORCH, "Tensor": TENSOR}


def _function(plan: CallPlan) -> Optional[Callable]:
    return _TABLES.get(plan.prefix, {}).get(plan.api)


def _as_arrays(out: Any) -> Any:
    """numpy's scalars (a ufunc or reduction of 0-d arrays) as 0-d arrays, as torch's 0-d tensors."""
    if isinstance(out, np.generic):
        return np.asarray(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_as_arrays(o) for o in out)
    return out


class NumpyAdapter:
    """acccheck/replay.py's Adapter over numpy arrays, float64 reference only (no peer, no backward)."""

    framework = FRAMEWORK
    no_backward = "backward not replayed in numpy"

    def covers(self, plan: CallPlan) -> bool:
        """The call is one this adapter replays, and no tensor of it is 16-bit (its precision is
        graded by a same-precision peer, which only the framework runs)."""
        return _function(plan) is not None and not any(str(t.dtype).endswith("float16") for t in plan.tensors())

    def resolve(self, plan: CallPlan, references: dict) -> Resolved:
        fn = _function(plan)
        if fn is None or references.get(plan.name) is not None:
            raise ReplayError(f"{plan.name} is not replayed in numpy")
        return Resolved(fn, False, "float64 reference replayed in numpy")

    def tensor(self, arr: np.ndarray, dtype: str, shape: List[int], float_dtype: Optional[str]) -> np.ndarray:
        """As the torch adapter: the array in its recorded dtype (golden's values may come as
        float64), then floats raised to `float_dtype`."""
        if float_dtype is None:
            raise ReplayError("numpy replays the float64 reference only")
        try:
            recorded = np.dtype(dtype_name(dtype))
        except TypeError:
            raise ReplayError(f"dtype {dtype} is not replayed in numpy") from None
        x = np.asarray(arr).astype(recorded, copy=False)
        if x.size == int(np.prod(shape)) and list(x.shape) != list(shape):
            x = x.reshape(shape)
        return x.astype(float_dtype) if x.dtype.kind == "f" else x

    def other(self, o: OtherArg, float_dtype: Optional[str]) -> Any:
        if o.type == "torch.Size":
            return tuple(o.value)
        if o.type == "torch.device":
            return "cpu"
        raise ReplayError(f"an argument of type {o.type} is not replayed in numpy")

    def is_tensor(self, x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def dtype(self, x: Any) -> str:
        return f"torch.{x.dtype.name}"

    def to_numpy(self, x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return x.astype(np.float64) if x.dtype.kind == "f" else x
        return x

    def call(self, fn: Callable, args: list, kwargs: dict, autocast: Optional[str], grad: bool = False) -> Any:
        if autocast or grad:
            raise ReplayError("numpy replays the float64 forward only")
        try:
            with np.errstate(all="ignore"):
                return _as_arrays(fn(*args, **kwargs))
        except TypeError as e:            # an argument this table does not model
            raise ReplayError(f"not replayed in numpy: {e}") from None

    def vjp(self, run, leaves, cotangents):
        raise ReplayError(self.no_backward)

    def shape(self, x: Any) -> List[int]:
        return list(x.shape)


ADAPTER = NumpyAdapter()
