"""How the core summarises torch tensors.

Statistics of a CPU tensor come from the native one-pass kernel (ts_core.native: max, min, sum
and sum of squares in one read, accumulated in float32 blocks, a block that overflows again in
double, and float64 across blocks) straight into a host row; one holding NaN/Inf takes the
framework path. Device tensors (CUDA; any tensor with ``TSPROBE_DEVICE_PATH=1``, the switch tests
and benchmarks use) take the device path: one Triton launch per tensor for the statistics and one
for a CRC (device_kernels), or where Triton is missing or fails, torch ops (4 launches for the
statistics, one more to cast a non-float64 tensor), both writing into a per-device arena of result
slots (device_arena) that a flush brings to the host in one transfer per device: collecting never
syncs per tensor. ``TSPROBE_DEVICE_KERNELS=0`` keeps the device path on torch ops."""
from __future__ import annotations

import ctypes
import math
import os
import sys
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ... import native
from ...dumpfmt import UNINITIALIZED, dtensor_block, xor64_of_bytes
from ...record.summary import HOST_ROW, TensorAdapter
from .._depth import internal
from . import uninit
from .device_arena import STATS_SLOTS, Arenas, Slot

# The only tensor types whose bytes tsprobe reads through their address. Subclasses are wrappers
# with no bytes of their own (DTensor: a local shard inside; FakeTensor, FunctionalTensor: none at
# all, data_ptr() raises or is 0): a raw read of one crashes the process.
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
SHARED_SUMMARIES = 8         # host_summary(share=True): how many recent summaries may be handed out again

_NATIVE_CODES = {torch.float32: native.F32, torch.float64: native.F64, torch.float16: native.F16,
                 torch.bfloat16: native.BF16, torch.int8: native.I8, torch.uint8: native.U8,
                 torch.int16: native.I16, torch.int32: native.I32, torch.int64: native.I64,
                 torch.bool: native.BOOL}


def _int_or_float(v: float) -> Any:
    return int(v) if abs(v) < 2**53 else v


# Max/Min as msprobe writes them per dtype (summary._typed's rule for finite values)
_TYPED = {**{dt: float for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16)},
          **{dt: _int_or_float for dt in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)},
          torch.bool: bool}


class _DtypeNames(dict):
    """``str(dtype)``, made once per dtype (a dict lookup on the hot path)."""

    def __missing__(self, dtype: torch.dtype) -> str:
        name = self[dtype] = str(dtype)
        return name


def _cached(cache: dict, key: Any, t: torch.Tensor, version: int, same_bytes: bool = True) -> Any:
    """What `cache` holds under `key` for `t`, if still true: the entry's tensor (a weak
    reference) is alive, unchanged since (the version counter, shared by views) and still over
    the same address, and is `t` itself or, with `same_bytes` (an address key), any tensor over
    the same bytes. The address check matters: FSDP frees a live parameter's storage with
    ``resize_(0)``, and the next block's parameter is allocated at the same address while the
    first one lives on, with the same version."""
    hit = cache.get(key)
    if hit is not None and hit[1] == version:
        owner = hit[0]()
        if owner is None or owner.data_ptr() != hit[3]:
            return None
        if owner is t or (same_bytes and owner._version == version):
            return hit[2]
    return None


def _bytes_key(t: torch.Tensor, n: int) -> tuple:
    """The cache key of a contiguous tensor's bytes (``_reuse``): any tensor over the same bytes
    finds what was computed for them."""
    return (t.data_ptr(), n, t.dtype, t.is_cpu)


def _allocated(t: torch.Tensor) -> bool:
    """Are the bytes of a plain tensor `t` there to read? FSDP frees an unsharded parameter's
    storage with ``resize_(0)`` between uses, leaving a tensor of full shape over no memory; a
    functionalization wrapper (tracing) is a plain-typed tensor whose address is 0. (0.2 us:
    cheap enough for every read.)"""
    if not t.data_ptr():
        return t.numel() == 0         # an empty tensor has nothing to read: its address may be 0
    return _allocated_contiguous(t, t.numel()) if t.is_contiguous() else t.untyped_storage().nbytes() > 0


def _allocated_contiguous(t: torch.Tensor, n: int) -> bool:
    """``_allocated`` for a contiguous tensor of `n` elements at a non-zero address."""
    return t.untyped_storage().nbytes() >= (t.storage_offset() + n) * t.element_size()


def _dtensor_type() -> Any:
    """DTensor, when torch.distributed.tensor was imported (no DTensor can exist before that)."""
    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None)


def readable(t: torch.Tensor) -> Optional[torch.Tensor]:
    """The plain tensor holding `t`'s values here, or None when there is none to read: `t`
    itself for a plain tensor with its storage allocated, the local shard of a DTensor, `t` for
    another subclass whose ops compute real values (the framework path, never a raw read);
    None for a fake or functional tensor (tracing), a meta tensor, or freed storage."""
    if type(t) in _PLAIN_TYPES:
        return t if not t.is_meta and t.layout is torch.strided and _allocated(t) else None
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(t, dtensor):
        return readable(t._local_tensor)
    collectives = sys.modules.get("torch.distributed._functional_collectives")
    if collectives is not None and isinstance(t, collectives.AsyncCollectiveTensor):
        return readable(t.trigger_wait())      # a collective's result: its values once it completed
    if t.is_meta or _is_traced(t):
        return None
    return t


def _is_traced(t: torch.Tensor) -> bool:
    """A tensor of a trace (dynamo's FakeTensor, functionalization's wrapper): no values."""
    fake = sys.modules.get("torch._subclasses.fake_tensor")
    functional = sys.modules.get("torch._subclasses.functional_tensor")
    return (fake is not None and isinstance(t, fake.FakeTensor)) or \
        (functional is not None and isinstance(t, functional.FunctionalTensor)) or \
        torch._is_functional_tensor(t)


def _mesh_ranks(mesh: Any) -> Optional[List[int]]:
    """The global ranks of a device mesh, row-major (which ranks form a sub-mesh's groups)."""
    ranks = getattr(mesh, "mesh", None)
    if not isinstance(ranks, torch.Tensor):
        return None
    with internal():
        return [int(r) for r in ranks.reshape(-1).tolist()]


def _placement(p: Any) -> str:
    """A placement as dumpfmt.shards names it."""
    split = getattr(p, "split_factor", None)       # _StridedShard (FSDP2 over TP): interleaved chunks
    if split is not None:
        return f"StridedShard({p.dim}, sf={split})"
    if p.is_shard():
        return f"Shard({p.dim})"
    if p.is_replicate():
        return "Replicate()"
    if p.is_partial():
        # _MaskPartial (a vocabulary-parallel embedding's output): the local rows of tokens outside
        # this rank's range are masked only when the pending sum is reduced: not a plain partial sum
        kind = "MaskPartial" if "Mask" in type(p).__name__ else "Partial"
        return f"{kind}({getattr(p, 'reduce_op', 'sum')})"
    return repr(p)


class TorchAdapter(TensorAdapter):
    framework = "pytorch"
    tensor_types = _PLAIN_TYPES        # is_tensor without a call for these (summary.Summarizer)

    def __init__(self) -> None:
        # Statistics computed once per step for the same elements: keyed by (address, numel,
        # dtype, device) for contiguous tensors -- so a view or reshape of a summarised tensor
        # (same elements, other shape) reuses its statistics -- else by id. Each entry holds a
        # weak reference to the tensor it was computed for and the version it had: while that
        # tensor lives, the memory is its storage, and the shared version counter tells any
        # in-place change (views share it).
        self._recent: Dict[Any, Tuple[Any, int, Any, int]] = {}    # (tensor ref, version, stats, address)
        self._crcs: Dict[Any, Tuple[Any, int, Any, int]] = {}      # the same for CRC-32s
        # id(tensor) -> (tensor ref, version, shape, md5?, summary): host_summary's last shared dicts
        self._shared: Dict[int, Tuple[Any, int, Any, bool, dict]] = {}
        # TSPROBE_DEVICE_PATH=1: host tensors too take the device path (tests, benchmarks)
        self._device_path = os.environ.get("TSPROBE_DEVICE_PATH") == "1"
        self._native = native.Stats() if native.available() and not self._device_path else None
        self._arenas = Arenas()
        self._kernels: Any = None            # device_kernels.DeviceKernels, False when unusable
        self._dtype_names = _DtypeNames()
        # summary_mode md5 (set by the Summarizer): the contiguous copy the statistics made of a
        # non-contiguous tensor is kept for the CRC asked next of the same tensor, one copy, not two
        self.reuse_copies = False
        self._copy: Optional[Tuple[Any, int, torch.Tensor]] = None    # (tensor ref, version, copy)

    def is_tensor(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    def meta(self, t: torch.Tensor) -> dict:
        if type(t) in _PLAIN_TYPES:
            if uninit.TRACKED and uninit.unwritten(t):
                return {"type": "torch.Tensor", "dtype": self._dtype_names[t.dtype], "shape": list(t.shape),
                        UNINITIALIZED: True}
            return {"type": "torch.Tensor", "dtype": self._dtype_names[t.dtype], "shape": list(t.shape)}
        dtensor = _dtensor_type()
        if dtensor is None or not isinstance(t, dtensor):
            return {"type": "torch.Tensor", "dtype": self._dtype_names[t.dtype], "shape": list(t.shape)}
        # A DTensor: the summary is its local shard's (as msprobe's fields expect), with where the
        # shard sits in the global value (dumpfmt.shards).
        mesh = t.device_mesh
        local = t._local_tensor
        return {"type": "torch.Tensor", "dtype": self._dtype_names[local.dtype], "shape": list(local.shape),
                "dtensor": dtensor_block(list(t.shape), [_placement(p) for p in t.placements], list(mesh.shape),
                                         mesh.mesh_dim_names, mesh.get_coordinate(), _mesh_ranks(mesh))}

    def requires_grad(self, t: torch.Tensor) -> bool:
        return t.requires_grad

    def content_key(self, t: torch.Tensor) -> Optional[Tuple[int, int]]:
        return None if t.is_inference() else (id(t), t._version)

    def stats(self, t: torch.Tensor) -> Any:
        """[max, min, mean, norm]: a host row (native kernel) or one small tensor on t's device
        (float32, or float64 for float64/integer input so integer extremes stay exact). No
        host sync for device tensors."""
        if type(t) not in _PLAIN_TYPES:
            return self._wrapper_stats(t)
        n = t.numel()
        if n == 0 or t.is_meta:
            return None
        if t.layout is not torch.strided:       # sparse (an Embedding(sparse=True) gradient)
            return _sparse_row(t)
        if not _allocated(t):
            return None
        return self._reuse(self._recent, t, n, self._compute)

    def _wrapper_stats(self, t: torch.Tensor) -> Any:
        """Statistics of a tensor subclass, computed on the plain tensor holding its values (never
        with the subclass's own ops: a DTensor's would run collectives, and mixing their results
        with plain tensors fails). A DTensor gets the mergeable row of its local shard."""
        data = readable(t)
        if data is None or data.numel() == 0:
            return None
        dtensor = _dtensor_type()
        shard = dtensor is not None and isinstance(t, dtensor)
        if type(data) in _PLAIN_TYPES:
            return self._shard_row(data) if shard else self._reuse(self._recent, data, data.numel(), self._compute)
        with torch.no_grad(), internal():                # another subclass: its ops, on the host now
            try:
                row = self._shard_row(data) if shard else _stats(data)
                return tuple(float(v) for v in row.tolist())
            except Exception:        # a subclass without these ops: no statistics, never a crash
                return None

    def _shard_row(self, local: torch.Tensor) -> Any:
        """(max, min, sum, sum of squares, NaN count, Inf count) of a shard: what merges exactly
        across shards (dumpfmt.shards). The native kernel's sums for a clean host shard (no NaN/Inf
        by its contract), else one float64 tensor on the shard's device (no sync)."""
        code = _NATIVE_CODES.get(local.dtype)
        if self._native is not None and local.is_cpu and code is not None and type(local) in _PLAIN_TYPES:
            contiguous = local if local.is_contiguous() else local.contiguous()
            sums = self._native(contiguous.data_ptr(), contiguous.numel(), code)
            if sums is not None:
                return (*sums, 0.0, 0.0)
        with torch.no_grad(), internal():
            f = (local.abs() if local.is_complex() else local).double()
            return torch.stack((f.max(), f.min(), f.sum(), (f * f).sum(),
                                f.isnan().sum().double(), f.isinf().sum().double()))

    @staticmethod
    def _reuse(cache: dict, t: torch.Tensor, n: int, compute: Any) -> Any:
        """compute(t, n, contiguous), or its result for a tensor over the same bytes seen
        unchanged earlier in this step (a view of a recorded tensor, the tensor itself): same
        address, size and dtype, and the version counter (shared by views) not moved since."""
        if t.is_inference():    # no version counter (torch.inference_mode, vLLM): no reuse
            return compute(t, n, t.is_contiguous())
        contiguous = t.is_contiguous()
        address = t.data_ptr()
        key = _bytes_key(t, n) if contiguous else id(t)
        version = t._version
        value = _cached(cache, key, t, version, same_bytes=contiguous)
        if value is not None:
            return value
        value = compute(t, n, contiguous)
        cache[key] = (weakref.ref(t), version, value, address)
        return value

    def _compute(self, t: torch.Tensor, n: int, contiguous: bool) -> Any:
        if self._native is not None and t.is_cpu:
            code = _NATIVE_CODES.get(t.dtype)
            if code is not None:
                if not contiguous:               # one copy, then one pass: cheaper than 3 passes
                    with torch.no_grad():
                        copy = t.contiguous()
                    if self.reuse_copies:
                        self._copy = (weakref.ref(t), t._version, copy)
                    t = copy
                row = self._native.row(t.data_ptr(), n, code)
                if row is not None:          # NaN/Inf: the framework path propagates them exactly
                    return row
        with torch.no_grad(), internal():
            return self._device_stats(t)

    def _device_kernels(self, t: torch.Tensor) -> Any:
        """The Triton kernels for `t`, or None: only for CUDA tensors (every tensor with the
        device path forced), where triton imports, unless ``TSPROBE_DEVICE_KERNELS=0``."""
        if self._kernels is False or not (t.is_cuda or self._device_path):
            return None
        if self._kernels is None:
            self._kernels = False
            if os.environ.get("TSPROBE_DEVICE_KERNELS", "1") != "0":
                try:
                    from . import device_kernels
                except ImportError:
                    return None
                self._kernels = device_kernels.DeviceKernels(self._arenas)
        return self._kernels or None

    def _kernel_failed(self, exc: Exception) -> None:
        """A Triton launch failed: warn once, torch ops from now on (never a crash)."""
        self._kernels = False
        warnings.warn(f"tsprobe: the Triton statistics/CRC kernels failed ({type(exc).__name__}: {exc}); "
                      "statistics take torch ops from now on (about 5 launches per tensor), CRCs the host",
                      RuntimeWarning, stacklevel=2)

    def _device_stats(self, t: torch.Tensor) -> Slot:
        """[max, min, mean, norm] of `t` into an arena slot on its device, no sync: one Triton
        launch, else torch ops in float64."""
        if t.is_complex():
            t = t.abs()
        kernels = self._device_kernels(t)
        if kernels is not None:
            try:
                slot = self._stats_with_crc(kernels, t) if self.reuse_copies else kernels.stats(t)
            except Exception as exc:        # a compiler or driver that cannot run it
                self._kernel_failed(exc)
            else:
                if slot is not None:
                    return slot
        chunk, off, _ = self._arenas[t.device].take(STATS_SLOTS)
        f = t if t.dtype == torch.float64 else t.double()     # wide enough for any finite non-float64 tensor
        mn, mx = torch.aminmax(f)
        torch.stack((mx, mn, f.mean(), torch.linalg.vector_norm(f)), out=chunk.floats[off:off + 4])
        return Slot(chunk, off, 0)

    def _stats_with_crc(self, kernels: Any, t: torch.Tensor) -> Optional[Slot]:
        """md5 mode: the statistics and the CRC the Summarizer asks for next, from one launch;
        the CRC waits in ``_crcs`` under the key ``crc32`` looks it up by (``_reuse``)."""
        both = None if t.is_complex() or t.is_inference() else kernels.stats_and_crc32(t)
        if both is None:
            return kernels.stats(t)
        stats, crc = both
        self._crcs[_bytes_key(t, t.numel())] = (weakref.ref(t), t._version, crc, t.data_ptr())
        return stats

    def host_summary(self, t: torch.Tensor, md5: bool = False, share: bool = False) -> Optional[dict]:
        """The summary of a contiguous CPU tensor in one call: meta, the native kernel's
        statistics (or those of the same bytes seen unchanged earlier in the step, as
        ``stats``), requires_grad, and with `md5` the CRC-32 (reused as ``crc32`` does). None
        for anything else (the general path). The same dict as the general path, key order
        included (tests/core/test_shortcuts.py); `_cached` and `_allocated` inlined (~2,000
        summaries a GPT-2 step, half of them hits).

        `share`: the caller only reads the dict (``Summarizer.plain``), so one of the last
        ``SHARED_SUMMARIES`` made is returned again for the same tensor object at the same
        version, shape and requires_grad (an output that is the next call's input, an argument
        given twice). Every in-place change of a tensor's values or metadata moves its version
        counter; ``requires_grad_()`` does not, hence that check; the shape guards
        ``t.data = ...``. Only a few are kept: a dict alive for long is promoted towards the
        interpreter's full collections (Collector._emit)."""
        if uninit.TRACKED and uninit.unwritten(t):
            return None                      # meta() says so; no statistics (uninit.py)
        if share:
            kept = self._shared.get(id(t))
            if kept is not None and kept[0]() is t and kept[1] == t._version and kept[2] == t.shape and \
                    kept[3] == md5 and kept[4]["requires_grad"] is t.requires_grad:
                return kept[4]
        native_stats = self._native
        if native_stats is None or type(t) not in _PLAIN_TYPES or not t.is_cpu:
            return None
        dtype = t.dtype
        typed = _TYPED.get(dtype)
        if typed is None or not t.is_contiguous() or t.is_inference():
            return None
        address = t.data_ptr()
        n = t.numel()
        if not address or not n:
            return None                      # empty, freed (FSDP's resize_(0)) or traced: the general path
        key = (address, n, dtype, True)
        version = t._version
        hit = self._recent.get(key)
        row = None
        allocated = False
        ref = None                           # a weak reference to `t`
        if hit is not None and hit[1] == version:      # _cached(self._recent, key, t, version)
            owner = hit[0]()
            if owner is not None and owner.data_ptr() == address and (owner is t or owner._version == version):
                if owner is t:
                    ref = hit[0]
                row = hit[2]
                if type(row) not in HOST_ROW:
                    return None              # a framework handle from the general path
        if row is None:
            # _allocated(t) for a contiguous tensor at a non-zero address. Only before a read: a
            # hit above is for the same bytes of a live owner still at this address.
            if not _allocated_contiguous(t, n):
                return None
            allocated = True
            row = native_stats.row(address, n, _NATIVE_CODES[dtype])
            if row is None:
                return None                  # NaN/Inf: the framework path
            ref = weakref.ref(t)
            self._recent[key] = (ref, version, row, address)
        out = {"type": "torch.Tensor", "dtype": self._dtype_names[dtype], "shape": list(t.shape), "Max": typed(row[0]),
               "Min": typed(row[1]), "Mean": row[2], "Norm": row[3], "requires_grad": t.requires_grad}
        if md5:
            crc = _cached(self._crcs, key, t, version)
            if crc is None:
                if not (allocated or _allocated_contiguous(t, n)):
                    return None
                crc = self._crc32(t, n, True)
                self._crcs[key] = (weakref.ref(t), version, crc, address)
            out["md5"] = crc
        if share:
            shared = self._shared
            shared[id(t)] = (ref if ref is not None else weakref.ref(t), version, t.shape, md5, out)
            if len(shared) > SHARED_SUMMARIES:
                del shared[next(iter(shared))]       # the oldest
        return out

    def stats_to_host(self, handles: List[Any]) -> List[List[Optional[float]]]:
        with internal():     # may run on the idle-flush thread, where wrapped APIs would record
            return self._stats_to_host(handles)

    def reset(self) -> None:
        self._shared.clear()
        self._recent.clear()
        self._crcs.clear()
        self._copy = None

    @staticmethod
    def _stats_to_host(handles: List[Any]) -> List[List[Optional[float]]]:
        groups: dict = {}
        out: List[Any] = [None] * len(handles)
        for i, h in enumerate(handles):
            if type(h) in HOST_ROW:
                out[i] = h                   # already on the host
            elif type(h) is Slot:
                out[i] = h.value()           # an arena slot: one transfer per arena chunk
            else:
                groups.setdefault((h.device, h.dtype, h.numel()), []).append(i)    # shard rows have 6
        for idx in groups.values():
            unique = {id(handles[i]): handles[i] for i in idx}
            rows = dict(zip(unique, torch.stack(list(unique.values())).cpu().tolist()))
            for i in idx:
                out[i] = rows[id(handles[i])]
        return out

    def crc32(self, t: torch.Tensor) -> Optional[str]:
        """CRC-32 of the bytes of `t` (a DTensor: of its local shard); None when there are none
        to read (a traced or freed tensor). A device tensor's is brought to the host now."""
        crc = self.crc32_deferred(t)
        return crc if crc is None or type(crc) is str else crc.value()

    def crc32_deferred(self, t: torch.Tensor) -> Any:
        """``crc32``, except that a device tensor's CRC stays on the device (an arena ``Slot``,
        which ``stats_to_host`` resolves at the flush): no sync while recording."""
        data = readable(t)
        if data is None:
            return None
        n = data.numel()
        if n == 0:
            return native.crc32_hex(b"")
        return self._reuse(self._crcs, data, n, self._crc32) if type(data) in _PLAIN_TYPES \
            else self._crc32(data, n, False)

    def _crc32(self, t: torch.Tensor, n: int, contiguous: bool) -> Any:
        """The CRC as 8 hex digits, or for a device tensor an arena ``Slot`` filled on the device
        (resolved at the flush: 4 bytes cross the bus)."""
        kernels = self._device_kernels(t) if type(t) in _PLAIN_TYPES else None
        if kernels is not None:
            try:
                with torch.no_grad(), internal():
                    return kernels.crc32(t.detach())
            except Exception as exc:
                self._kernel_failed(exc)
        if contiguous and t.is_cpu:          # the tensor's own bytes, no torch call
            return native.crc32_hex((ctypes.c_ubyte * (n * t.element_size())).from_address(t.data_ptr()))
        kept, self._copy = self._copy, None
        if kept is not None and kept[0]() is t and kept[1] == t._version:     # the statistics' copy
            return self._crc32(kept[2], n, True)
        with torch.no_grad():
            raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        return native.crc32_hex(raw)

    def xor_checksum(self, t: torch.Tensor) -> Any:
        """msprobe's xor: a 0-d tensor's own value; else the XOR of its bytes as little-endian
        int64 words, in numpy for host tensors, on the device (no sync) for the others. Only
        views and a copy of a non-contiguous tensor: nothing here is recorded or taped."""
        t = readable(t)
        if t is None or t.numel() == 0:
            return None
        t = t.detach()
        if t.dim() == 0 and not t.is_complex():
            return t.item() if t.device.type == "cpu" else t.clone()
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        raw = t.contiguous().reshape(-1).view(torch.uint8)
        if t.device.type == "cpu":
            return xor64_of_bytes(raw.numpy())
        with internal():
            return _xor_on_device(raw)

    def checksums_to_host(self, handles: List[Any]) -> List[Any]:
        with internal():
            out = list(handles)
            groups: dict = {}
            for i, h in enumerate(handles):
                if isinstance(h, torch.Tensor):
                    groups.setdefault((h.device, h.dtype), []).append(i)
            for idx in groups.values():      # one transfer per device and dtype
                for i, v in zip(idx, torch.stack([handles[i] for i in idx]).cpu().tolist()):
                    out[i] = v
            return out

    def device_copy(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        data = readable(t)
        if data is None:
            return None
        with internal(), torch.no_grad():
            return data.detach().clone()

    def to_host(self, copy: torch.Tensor) -> torch.Tensor:
        with internal():
            return copy if copy.device.type == "cpu" else copy.to("cpu")

    def nbytes(self, t: torch.Tensor) -> int:
        data = readable(t)
        return 0 if data is None else data.numel() * data.element_size()

    def snapshot(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        """A host copy of `t`'s values (a DTensor: its local shard); None when there are none."""
        data = readable(t)
        return None if data is None else data.detach().to("cpu", copy=True)

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


def _xor_on_device(raw: torch.Tensor) -> torch.Tensor:
    """XOR of a flat uint8 tensor's little-endian 64-bit words (tail zero-padded), as a 0-d
    int64 tensor on the same device: log2(n) halvings, no host sync."""
    n = raw.numel()
    whole = n - n % 8
    acc = torch.zeros((), dtype=torch.int64, device=raw.device)
    if whole:
        body = raw[:whole]
        if body.storage_offset() % 8:
            body = body.clone()          # an int64 view needs 8-byte alignment
        words = body.view(torch.int64)
        while words.numel() > 1:
            if words.numel() % 2:
                words = torch.cat((words, words.new_zeros(1)))
            half = words.numel() // 2
            words = torch.bitwise_xor(words[:half], words[half:])
        acc = words[0]
    if whole < n:
        tail = torch.zeros(8, dtype=torch.uint8, device=raw.device)
        tail[:n - whole] = raw[whole:]
        acc = torch.bitwise_xor(acc, tail.view(torch.int64)[0])
    return acc


def _sparse_row(t: torch.Tensor) -> Optional[Tuple[float, float, float, float]]:
    """(max, min, mean, norm) of a sparse tensor's dense value, from its stored values (the
    implicit zeros count in Max/Min and Mean), never densified; None when its layout has no
    values to read here (never an error: a sparse gradient reaches the tool inside backward)."""
    with torch.no_grad(), internal():
        try:
            v = (t.coalesce() if t.layout is torch.sparse_coo else t).values()
            if v.is_complex():
                v = v.abs()
            f = v.double()
            nnz, n = f.numel(), t.numel()
            mx = f.max().item() if nnz else 0.0
            mn = f.min().item() if nnz else 0.0
            if nnz < n:                     # some elements are implicit zeros
                mx, mn = max(mx, 0.0), min(mn, 0.0)
            return (mx, mn, f.sum().item() / n, math.sqrt((f * f).sum().item()))
        except Exception:
            return None


def _stats(t: torch.Tensor) -> torch.Tensor:
    """[max, min, mean, norm] of a tensor subclass's values with its own ops, in float64: wide
    enough that a finite non-float64 tensor never gets an infinite Mean or Norm."""
    if t.is_complex():
        t = t.abs()
    f = t if t.dtype == torch.float64 else t.double()
    mn, mx = torch.aminmax(f)
    return torch.stack((mx, mn, f.mean(), torch.linalg.vector_norm(f)))
