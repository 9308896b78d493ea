"""TroubleShooter's ``save(file, data, suffix=None)`` and ``save_grad(file, data, suffix='backward')``.

Files are numbered in call order across the whole process, exactly as TroubleShooter does:
``save('./out/input', x)`` writes ``./out/0_input.npy``; the next call writes ``1_...``; a
gradient saved by ``save_grad('./out/dense', y)`` is numbered when it arrives in backward
(``2_dense_backward.npy``). A ``suffix`` is appended as ``_{suffix}``. Lists/tuples write one
file per tensor (``{n}_{name}_{i}``, all sharing one number); dicts write ``{n}_{name}_{key}``.
bfloat16 (and other dtypes numpy lacks) are stored as float32. Never pickle.
"""
from __future__ import annotations

import os
import warnings
import threading
from typing import Any, Optional

import numpy as np

__all__ = ["save", "save_grad", "reset_save_counter"]

_lock = threading.Lock()
_counter = 0


def reset_save_counter(value: int = 0) -> None:
    """Restart the file numbering (TroubleShooter numbers across the whole process)."""
    global _counter
    with _lock:
        _counter = int(value)


def _next_number() -> int:
    global _counter
    with _lock:
        n = _counter
        _counter += 1
    return n


def _framework_of(data: Any) -> str:
    mod = type(data).__module__ or ""
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("mindspore"):
        return "mindspore"
    return "numpy" if isinstance(data, np.ndarray) else ""


def _to_numpy(t: Any) -> np.ndarray:
    fw = _framework_of(t)
    if fw == "torch":
        import torch
        t = t.detach()
        if t.dtype in (torch.bfloat16,) or str(t.dtype).startswith("torch.float8"):
            t = t.float()
        return t.cpu().numpy()
    if fw == "mindspore":
        import mindspore as ms
        _ms_warm_up()
        if t.dtype == ms.bfloat16:
            t = t.astype(ms.float32)
        return t.asnumpy()
    return np.asarray(t)


def _is_tensor(x: Any) -> bool:
    fw = _framework_of(x)
    if fw == "torch":
        import torch
        return isinstance(x, torch.Tensor)
    if fw == "mindspore":
        from mindspore import Tensor
        return isinstance(x, Tensor)
    return isinstance(x, np.ndarray)


def _split(file: str):
    file = os.fspath(file)
    d, name = os.path.split(file)
    if name.endswith(".npy"):
        name = name[:-4]
    return d, name


def _write(d: str, fname: str, arr: np.ndarray) -> None:
    if d:
        os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, fname + ".npy"), arr, allow_pickle=False)


def _save_now(file: str, data: Any, suffix: Optional[str], number: Optional[int] = None) -> None:
    d, name = _split(file)
    base = name + (f"_{suffix}" if suffix else "")
    if _is_tensor(data):
        n = _next_number() if number is None else number
        _write(d, f"{n}_{base}", _to_numpy(data))
        return
    if isinstance(data, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(data)]
    elif isinstance(data, dict):
        items = [(str(k), v) for k, v in data.items()]
    else:
        raise TypeError(f"save: data must be a torch/MindSpore tensor, numpy array, list, tuple or dict, "
                        f"got {type(data).__name__}")
    dropped = [f"{k} ({type(v).__name__})" for k, v in items if not _is_tensor(v)]
    items = [(k, v) for k, v in items if _is_tensor(v)]
    if dropped:     # TroubleShooter drops them too; say so, once per name, instead of silently
        _warn_dropped(file, dropped, bool(items))
    if not items:
        return
    n = _next_number() if number is None else number
    for k, v in items:
        _write(d, f"{n}_{base}_{k}", _to_numpy(v))


_warned_drops: set = set()


def _warn_dropped(file: str, dropped: list, wrote: bool) -> None:
    key = os.fspath(file)
    if key in _warned_drops:
        return
    _warned_drops.add(key)
    what = "the tensors only" if wrote else "nothing"
    warnings.warn(f"tsprobe save({key!r}): members that are not tensors are not saved: {', '.join(dropped)}; "
                  f"wrote {what}", stacklevel=4)


def save(file: str, data: Any, suffix: Optional[str] = None) -> None:
    """Write ``data`` now as ``{dir}/{n}_{name}[_{suffix}].npy`` (``file`` = ``dir/name``)."""
    _save_now(file, data, suffix)


def save_grad(file: str, data: Any, suffix: str = "backward") -> Any:
    """Return ``data`` unchanged in value, wired so that its gradient is saved as
    ``{dir}/{n}_{name}_{suffix}.npy`` when backward reaches it. Use the returned value as
    the next operation's input (otherwise there is no backward path through it)."""
    fw = _framework_of(data)
    if fw == "torch":
        return _torch_save_grad(file, data, suffix)
    if fw == "mindspore":
        return _ms_save_grad(file, data, suffix)
    raise TypeError(f"save_grad: data must be a torch or MindSpore tensor, got {type(data).__name__}")


# -- torch ---------------------------------------------------------------------------------
_torch_fn = None


def _torch_save_grad(file: str, data: Any, suffix: str) -> Any:
    import torch
    global _torch_fn
    if not isinstance(data, torch.Tensor) or not data.requires_grad or not torch.is_grad_enabled():
        return data
    if _torch_fn is None:
        class _SaveGrad(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, target):
                ctx.target = target
                return x.view_as(x)

            @staticmethod
            def backward(ctx, grad):
                f, sfx = ctx.target
                _save_now(f, grad, sfx)
                return grad, None

        _torch_fn = _SaveGrad
    return _torch_fn.apply(data, (file, suffix))


# -- MindSpore -----------------------------------------------------------------------------
def _ms_warm_up() -> None:
    from ..backends.mindspore._runtime import warm_up
    warm_up()


def _ms_save_grad(file: str, data: Any, suffix: str) -> Any:
    from mindspore import ops
    _ms_warm_up()

    def hook(grad):
        _save_now(file, grad, suffix)
        return grad

    return ops.InsertGradientOf(hook)(data)
