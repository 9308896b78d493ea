"""Synthetic dumps in the tsprobe/msprobe layout, written from numpy (no framework needed)."""
from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np

_DTYPES = {"float32": "torch.float32", "float16": "torch.float16", "float64": "torch.float64",
           "int64": "torch.int64", "int32": "torch.int32", "bool": "torch.bool"}


def summary(arr: np.ndarray, data_name: Optional[str] = None, md5: bool = False) -> dict:
    a = np.asarray(arr)
    f = a.astype(np.float64)
    out = {"type": "torch.Tensor", "dtype": _DTYPES.get(a.dtype.name, a.dtype.name), "shape": list(a.shape),
           "Max": float(f.max()) if f.size else None, "Min": float(f.min()) if f.size else None,
           "Mean": float(f.mean()) if f.size else None,
           "Norm": float(np.sqrt((f * f).sum())) if f.size else None, "requires_grad": True}
    if md5:
        out["md5"] = f"{zlib.crc32(np.ascontiguousarray(a).tobytes()) & 0xFFFFFFFF:08x}"
    if data_name:
        out["data_name"] = data_name
    return out


class DumpWriter:
    """Writes dump_path/step{N}/{rank}/dump.json (+ stack.json, construct.json, npy files)."""

    def __init__(self, root, step: int = 0, rank: str = "rank0", task: str = "tensor",
                 framework: str = "pytorch", level: str = "L1", md5: bool = False):
        self.dir = Path(root) / f"step{step}" / rank
        self.task, self.md5 = task, md5
        self.head = {"task": task, "level": level, "framework": framework,
                     "dump_data_dir": str(self.dir / "dump_tensor_data") if task == "tensor" else None}
        self.data: Dict[str, Any] = {}
        self.stacks: Dict[str, list] = {}
        self.construct: Dict[str, Optional[str]] = {}

    def _value(self, v: Any, name: str) -> Any:
        if v is None:
            return None
        if isinstance(v, np.ndarray):
            data_name = None
            if self.task == "tensor":
                data_name = f"{name}.npy"
                (self.dir / "dump_tensor_data").mkdir(parents=True, exist_ok=True)
                np.save(self.dir / "dump_tensor_data" / data_name, v)
            return summary(v, data_name, self.md5)
        if isinstance(v, (list, tuple)):
            return [self._value(x, f"{name}.{i}") for i, x in enumerate(v)]
        return {"type": type(v).__name__, "value": v}

    def forward(self, key: str, inputs: Sequence = (), outputs: Sequence = (), kwargs: Optional[dict] = None,
                params: Optional[dict] = None, line: Optional[str] = None, parent: Optional[str] = None) -> None:
        rec = {"input_args": [self._value(v, f"{key}.input.{i}") for i, v in enumerate(inputs)],
               "input_kwargs": {k: self._value(v, f"{key}.input.{k}") for k, v in (kwargs or {}).items()},
               "output": [self._value(v, f"{key}.output.{i}") for i, v in enumerate(outputs)]}
        if params is not None:
            rec["parameters"] = {k: self._value(v, f"{key}.parameters.{k}") for k, v in params.items()}
        self.data[key] = rec
        self.stacks[key] = [f"File /site-packages/torch/nn/functional.py, line 10, in lib, \n pass",
                            f"File /home/user/train.py, line {len(self.data)}, in forward, \n {line or key}",
                            "File /home/user/train.py, line 99, in <module>, \n main()"]
        self.construct[key] = parent

    def backward(self, key: str, inputs: Sequence = (), outputs: Sequence = ()) -> None:
        self.data[key] = {"input": [self._value(v, f"{key}.input.{i}") for i, v in enumerate(inputs)],
                          "output": [self._value(v, f"{key}.output.{i}") for i, v in enumerate(outputs)]}

    def params_grad(self, key: str, grads: Dict[str, np.ndarray]) -> None:
        self.data[key] = {k: self._value(v, f"{key}.{k}") for k, v in grads.items()}

    def close(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "dump.json").write_text(json.dumps(dict(self.head, data=self.data)))
        grouped = {str(i): [[k], frames] for i, (k, frames) in enumerate(self.stacks.items())}
        (self.dir / "stack.json").write_text(json.dumps(grouped))
        (self.dir / "construct.json").write_text(json.dumps(self.construct))
        return self.dir


def write_chain(root, *, w_delta: float = 0.0, tanh_approx: bool = False, grad_bug: float = 1.0,
                extra_mul: bool = False, nan_at_tanh: bool = False, task: str = "tensor", md5: bool = False,
                step: int = 0, rank: str = "rank0", seed: int = 0, n: int = 64) -> Path:
    """x -> x*2 -> +w -> tanh -> *3, forward and backward, with optional injected bugs:
    ``w_delta`` perturbs the parameter w; ``tanh_approx`` changes tanh's computation;
    ``grad_bug`` scales tanh's backward; ``extra_mul`` adds a harmless ``*1`` call (shifting
    the ``Tensor.__mul__`` counters); ``nan_at_tanh`` puts a NaN into tanh's output."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, n)).astype(np.float32)
    w = rng.standard_normal((4, n)).astype(np.float32) * np.float32(0.5)
    w = w + np.float32(w_delta)
    d = DumpWriter(root, step=step, rank=rank, task=task, md5=md5)
    mul = iter(range(10))

    a = x * np.float32(2)
    d.forward(f"Tensor.__mul__.{next(mul)}.forward", [x, 2], [a], line="a = x * 2")
    if extra_mul:
        a1 = a * np.float32(1)
        d.forward(f"Tensor.__mul__.{next(mul)}.forward", [a, 1], [a1], line="a = a * 1")
        a = a1
    b = a + w
    d.forward("Tensor.__add__.0.forward", [a, w], [b], line="b = a + w")
    c = np.tanh(b) if not tanh_approx else (np.tanh(b) + np.float32(1e-3) * np.sin(b)).astype(np.float32)
    if nan_at_tanh:
        c = c.copy(); c[1, 2] = np.nan
    d.forward("Torch.tanh.0.forward", [b], [c], line="c = torch.tanh(b)")
    k3 = next(mul)
    out = c * np.float32(3)
    d.forward(f"Tensor.__mul__.{k3}.forward", [c, 3], [out], line="out = c * 3")

    g_out = np.ones_like(out)
    g_c = g_out * np.float32(3)
    d.backward(f"Tensor.__mul__.{k3}.backward", [g_out], [g_c])
    g_b = ((1 - c * c) * g_c * np.float32(grad_bug)).astype(np.float32)
    d.backward("Torch.tanh.0.backward", [g_c], [g_b])
    d.backward("Tensor.__add__.0.backward", [g_b], [g_b.copy(), g_b.copy()])
    if extra_mul:
        d.backward("Tensor.__mul__.1.backward", [g_b], [g_b * np.float32(1)])
    d.backward("Tensor.__mul__.0.backward", [g_b], [g_b * np.float32(2)])
    return d.close()
