"""How the core summarises MindSpore tensors.

Statistics are computed on the device, with ops that have kernels on CPU, GPU and Ascend, as
one small float64 tensor per input tensor ([Max, Min, Mean, Norm]); a flush brings them to the
host after one sync per flush. float16/bfloat16/float32 are summarised in float32,
float64 and integers in float64 (integer Max/Min stay exact below 2**53), bool as 0/1, complex
by magnitude. Every op here runs inside ``internal()`` (not recorded) and ``no_grad`` (not
taped for autodiff, so it cannot touch a gradient).
"""
from __future__ import annotations

import threading
import zlib
from typing import Any, List, NamedTuple, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor, mint

from ...dumpfmt import xor64_of_bytes
from ...record.summary import TensorAdapter
from .._depth import internal
from ._runtime import no_grad, warm_up

# The originals, taken before any L1 patch (this module is imported before patching).
_max, _min, _mean, _sum, _mul, _sqrt, _abs = mint.max, mint.min, mint.mean, mint.sum, mint.mul, mint.sqrt, mint.abs
_F32 = (ms.float16, ms.bfloat16, ms.float32)
_COMPLEX = (ms.complex64, ms.complex128)
_IDLE_FLUSH_THREAD = "tsprobe-idle-flush"     # ts_core.record.collector._IdleFlusher
FLOATING = frozenset((ms.float16, ms.bfloat16, ms.float32, ms.float64))


def host_array(t: Tensor) -> np.ndarray:
    """A host copy (bfloat16 as float32: numpy has no bfloat16). On CPU ``asnumpy()`` shares
    the tensor's memory, so it is copied: a later in-place op must not reach the snapshot."""
    with internal(), no_grad():
        if t.dtype == ms.bfloat16:
            t = t.astype(ms.float32)
        return np.array(t.asnumpy(), copy=True)


class DeviceStats(NamedTuple):
    """A pending statistics handle: not a plain tuple, which the summarizer takes for a host row."""
    values: tuple
    kind: Any


class NotOnMainThread(RuntimeError):
    pass


class MindSporeAdapter(TensorAdapter):
    framework = "mindspore"

    def __init__(self) -> None:
        warm_up()

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, Tensor)

    def meta(self, t: Tensor) -> dict:
        return {"type": "mindspore.Tensor", "dtype": str(t.dtype), "shape": list(t.shape)}

    def requires_grad(self, t: Tensor) -> bool:
        # Only Parameters carry a requires_grad flag in MindSpore; other tensors get gradients
        # when a grad function asks for them.
        return bool(getattr(t, "requires_grad", False))

    def stats(self, t: Tensor) -> Optional[DeviceStats]:
        """((Max, Min, Mean, Norm) as 0-d device tensors, host type of Max/Min) or None.

        Cheap pyboost reductions only (~5 us each to launch on CPU); the four values are not
        stacked here (``ops.stack`` is a slow legacy op): ``stats_to_host`` reads them all
        after one sync."""
        if t.size == 0:
            return None
        with internal(), no_grad():
            dt = t.dtype
            kind = float
            if dt in _COMPLEX:
                t = _abs(t)
                dt = t.dtype
            if dt == ms.bool_:
                kind = bool
            elif dt not in FLOATING:
                kind = int
            if dt == ms.bool_ or dt in _F32:
                f = t if dt == ms.float32 else t.astype(ms.float32)
            else:                               # float64 and integers
                f = t if dt == ms.float64 else t.astype(ms.float64)
            return DeviceStats((_max(f), _min(f), _mean(f), _sqrt(_sum(_mul(f, f)))), kind)

    def stats_to_host(self, handles: List[DeviceStats]) -> List[List[Any]]:
        if threading.current_thread().name == _IDLE_FLUSH_THREAD:
            # The collector's idle-flush thread: a MindSpore sync from a second thread waits
            # until the main thread stops launching ops (it starves for as long as training
            # runs, holding the flush lock). Refuse; the records stay queued for the next
            # main-thread flush (<= 0.5 s while a step runs, and at stop()/step()).
            raise NotOnMainThread("MindSpore statistics are not fetched from the idle-flush thread")
        rows = []
        with internal():
            for values, kind in handles:        # the first read syncs, the others are copies
                row = [v.asnumpy().item() for v in values]
                if kind is not float:            # integer/bool Max and Min as msprobe writes them
                    row[0], row[1] = kind(row[0]), kind(row[1])
                rows.append(row)
        return rows

    def crc32(self, t: Any) -> str:
        """Of a tensor, or of the host copy ``to_host`` made (async_dump)."""
        arr = t if isinstance(t, np.ndarray) else host_array(t)
        raw = np.ascontiguousarray(arr).view(np.uint8)
        return f"{zlib.crc32(raw.tobytes()) & 0xFFFFFFFF:08x}"

    def xor_checksum(self, t: Tensor) -> Any:
        """msprobe's xor (which msprobe computes for torch only): a 0-d tensor's value, else the
        XOR of the raw bytes as little-endian 64-bit words. Read through a host copy; bfloat16
        comes back as float32 and is narrowed to its exact bfloat16 bits."""
        if t.size == 0:
            return None
        arr = host_array(t)
        if arr.ndim == 0 and not np.iscomplexobj(arr):
            return arr.item()
        if t.dtype == ms.bfloat16:
            arr = (np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return xor64_of_bytes(arr)

    def checksums_to_host(self, handles: List[Any]) -> List[Any]:
        return list(handles)            # computed on the host already

    def device_copy(self, t: Tensor) -> Tensor:
        with internal(), no_grad():
            return t.copy()

    def to_host(self, copy: Tensor) -> np.ndarray:
        return host_array(copy)

    def nbytes(self, t: Tensor) -> int:
        return int(t.nbytes)

    def snapshot(self, t: Tensor) -> np.ndarray:
        # A host copy now: later in-place ops cannot change it, and the writer thread never
        # calls into MindSpore.
        return host_array(t)

    def to_numpy(self, snapshot: np.ndarray) -> np.ndarray:
        return snapshot

    def reset(self) -> None:
        """No per-step cache: MindSpore tensors have no version counter to tell reuse apart."""

    def describe_other(self, value: Any) -> Optional[dict]:
        if isinstance(value, ms.dtype.Type):
            return {"type": "mindspore.dtype", "value": str(value)}
        if isinstance(value, np.generic):
            return {"type": f"numpy.{type(value).__name__}", "value": value.item()}
        return None
