"""How the core summarises torch tensors: statistics stay on the device as one small float64
tensor per input tensor and reach the host in one ``torch.stack(...).tolist()`` per flush."""
from __future__ import annotations

import zlib
from typing import Any, List, Optional

import numpy as np
import torch

from ._depth import internal

_FLOATS = {torch.float16, torch.bfloat16, torch.float32}


class TorchAdapter:
    framework = "pytorch"

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    def meta(self, t: torch.Tensor) -> dict:
        return {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape)}

    def requires_grad(self, t: torch.Tensor) -> bool:
        return t.requires_grad

    def stats(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        if t.numel() == 0 or t.is_meta:
            return None
        with torch.no_grad():
            t = t.detach()
            if t.is_complex():
                t = t.abs()
            if t.dtype == torch.bool:
                f = t.to(torch.float32)
                return torch.stack((f.max(), f.min(), f.mean(), f.norm())).to(torch.float64)
            if t.dtype in _FLOATS:
                f = t.float()
                mn, mx = torch.aminmax(f)
                return torch.stack((mx, mn, f.mean(), torch.linalg.vector_norm(f))).to(torch.float64)
            if t.is_floating_point():   # float64 and exotic floats
                f = t.double()
                mn, mx = torch.aminmax(f)
                return torch.stack((mx, mn, f.mean(), torch.linalg.vector_norm(f)))
            mn, mx = torch.aminmax(t)            # integers: exact Max/Min
            f = t.double()
            return torch.stack((mx.double(), mn.double(), f.mean(), torch.linalg.vector_norm(f)))

    def stats_to_host(self, handles: List[torch.Tensor]) -> List[List[Optional[float]]]:
        with internal():     # may run on the idle-flush thread, where wrapped APIs would record
            return self._stats_to_host(handles)

    def _stats_to_host(self, handles: List[torch.Tensor]) -> List[List[Optional[float]]]:
        by_device: dict = {}
        for i, h in enumerate(handles):
            by_device.setdefault(h.device, []).append(i)
        out: List[Any] = [None] * len(handles)
        for idx in by_device.values():
            rows = torch.stack([handles[i] for i in idx]).cpu().tolist()
            for i, row in zip(idx, rows):
                out[i] = row
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
