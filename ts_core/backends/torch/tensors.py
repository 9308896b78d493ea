"""How the core summarises torch tensors: statistics stay on the device as one small tensor
per input tensor and reach the host in one ``torch.stack(...).tolist()`` per dtype per flush."""
from __future__ import annotations

import weakref
import zlib
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from .._depth import internal

_FLOATS = {torch.float16, torch.bfloat16, torch.float32}


class TorchAdapter:
    framework = "pytorch"

    def __init__(self) -> None:
        # (id, version) -> (weakref, handle): a tensor that is one call's output and the next
        # call's input has its statistics computed once per flush window.
        self._recent: Dict[int, Tuple[Any, int, torch.Tensor]] = {}

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    def meta(self, t: torch.Tensor) -> dict:
        return {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape)}

    def requires_grad(self, t: torch.Tensor) -> bool:
        return t.requires_grad

    def content_key(self, t: torch.Tensor) -> Optional[Tuple[int, int]]:
        return None if t.is_inference() else (id(t), t._version)

    def stats(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        """[max, min, mean, norm] as one small tensor on t's device (float32, or float64 for
        float64/integer input so integer extremes stay exact). No host sync."""
        if t.numel() == 0 or t.is_meta:
            return None
        if t.is_inference():    # no version counter (torch.inference_mode, vLLM): no reuse
            with torch.no_grad():
                return _stats(t)
        hit = self._recent.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            return hit[2]
        with torch.no_grad():
            handle = _stats(t)
        self._recent[id(t)] = (weakref.ref(t), t._version, handle)
        return handle

    def stats_to_host(self, handles: List[torch.Tensor]) -> List[List[Optional[float]]]:
        with internal():     # may run on the idle-flush thread, where wrapped APIs would record
            self._recent.clear()
            return self._stats_to_host(handles)

    @staticmethod
    def _stats_to_host(handles: List[torch.Tensor]) -> List[List[Optional[float]]]:
        groups: dict = {}
        for i, h in enumerate(handles):
            groups.setdefault((h.device, h.dtype), []).append(i)
        out: List[Any] = [None] * len(handles)
        for idx in groups.values():
            unique = {id(handles[i]): handles[i] for i in idx}
            rows = dict(zip(unique, torch.stack(list(unique.values())).cpu().tolist()))
            for i in idx:
                out[i] = rows[id(handles[i])]
        return out

    def crc32(self, t: torch.Tensor) -> str:
        raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        return f"{zlib.crc32(raw) & 0xFFFFFFFF:08x}"

    def snapshot(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", copy=True)

    def to_numpy(self, t: torch.Tensor) -> np.ndarray:
        with internal():     # runs on the tensor-writer thread
            if t.dtype == torch.bfloat16:
                t = t.float()    # numpy has no bfloat16; dump.json keeps the true dtype
            if t.is_conj():
                t = t.resolve_conj()
            return t.numpy()

    def describe_other(self, value: Any) -> Optional[dict]:
        if isinstance(value, torch.dtype):
            return {"type": "torch.dtype", "value": str(value)}
        if isinstance(value, torch.Size):
            return {"type": "torch.Size", "value": list(value)}
        if isinstance(value, torch.device):
            return {"type": "torch.device", "value": str(value)}
        return None


def _stats(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        t = t.abs()
    dtype = t.dtype
    if dtype in _FLOATS:
        f = t.float()
    elif dtype == torch.bool:
        f = t.to(torch.float32)
    elif t.is_floating_point():
        f = t.double()
    else:                                   # integers: exact Max/Min in float64
        mn, mx = torch.aminmax(t)
        f = t.double()
        return torch.stack((mx.double(), mn.double(), f.mean(), torch.linalg.vector_norm(f)))
    mn, mx = torch.aminmax(f)
    return torch.stack((mx, mn, f.mean(), torch.linalg.vector_norm(f)))
