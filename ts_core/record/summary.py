"""Summaries of call arguments: tensors become statistics dicts, everything else ``{type, value}``.

Statistics (and xor checksums) are requested from the backend as small device-side values and
resolved in one batched host transfer per flush (``resolve``), so collecting never syncs per
tensor. With ``async_dump`` even CRCs and tensor files wait for ``resolve``.
"""
from __future__ import annotations

import abc
import math
import weakref
from typing import Any, Callable, ClassVar, List, Optional, Tuple

from ..dumpfmt import DTENSOR, STAT_FIELDS, UNINITIALIZED, shard_stats, value_name, xor_field
from ..dumpfmt.dtypes import dtype_name, is_exact


class TensorAdapter(abc.ABC):
    """What the core needs from a framework backend to summarise its tensors: a backend's
    adapter derives from this class and is checked when it is made (a missing method or
    ``framework`` fails there, naming what is missing, not at the first tensor)."""

    framework: ClassVar[str] = ""            # as dump.json names it: pytorch / mindspore / mindtorch
    # Optional (None: not offered). ``content_key(tensor)``: a hashable key equal for the same
    # unchanged tensor (e.g. (id, version)), or None -- statistics of an unchanged tensor are then
    # reused. ``host_summary(tensor, md5, share) -> Optional[dict]``: the whole statistics summary
    # (meta, Max/Min/Mean/Norm, requires_grad, with `md5` the CRC-32) in one call when it can be
    # made on the host now, else None (the general path then runs): the hot path of every recorded
    # call. With `share` the caller only reads the dict: one made for the same tensor unchanged
    # may be returned again.
    # ``crc32_deferred(tensor)``: ``crc32``, or a device-side handle that ``stats_to_host`` turns
    # into those 8 hex digits at the flush (no sync now).
    content_key: ClassVar[Optional[Callable[..., Any]]] = None
    host_summary: ClassVar[Optional[Callable[..., Any]]] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> "TensorAdapter":
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if not isinstance(cls.framework, str) or not cls.framework:
            missing.insert(0, "framework (a class attribute: pytorch, mindspore, ...)")
        if missing:
            raise TypeError(f"{cls.__name__} is not a complete TensorAdapter (ts_core/record/summary.py): "
                            f"it lacks {', '.join(missing)}")
        return super().__new__(cls)

    @abc.abstractmethod
    def reset(self) -> None:
        """A new step: forget per-step caches (statistics of tensors seen unchanged)."""

    @abc.abstractmethod
    def is_tensor(self, value: Any) -> bool: ...

    # Optional: ``tensor_types``, exact types for which ``is_tensor`` is True (a shortcut; any
    # other value still goes through ``is_tensor``).

    @abc.abstractmethod
    def meta(self, tensor: Any) -> dict:
        """type, dtype, shape (host-known, no sync)."""

    @abc.abstractmethod
    def requires_grad(self, tensor: Any) -> bool: ...

    @abc.abstractmethod
    def stats(self, tensor: Any) -> Any:
        """A device-side handle for [max, min, mean, norm] or None (empty / no numbers); for a
        sharded value, [max, min, sum, sum of squares, NaNs, Infs] of its local shard
        (``dumpfmt.shards``)."""

    @abc.abstractmethod
    def stats_to_host(self, handles: List[Any]) -> List[List[Optional[float]]]:
        """One batched transfer for many ``stats`` handles."""

    @abc.abstractmethod
    def crc32(self, tensor: Any) -> str:
        """CRC-32 (8 hex digits) of the raw bytes of a tensor, or of a ``to_host`` copy."""

    @abc.abstractmethod
    def xor_checksum(self, tensor: Any) -> Any:
        """summary_mode xor: a handle for ``checksums_to_host`` (a host value or a device-side
        scalar: no sync), or None for an empty tensor."""

    @abc.abstractmethod
    def checksums_to_host(self, handles: List[Any]) -> List[Any]:
        """Values of ``xor_checksum`` handles: an int (the 64-bit XOR), or for a 0-d tensor its
        value (float, int or bool), as msprobe writes them."""

    @abc.abstractmethod
    def device_copy(self, tensor: Any) -> Any:
        """async_dump: a copy on the tensor's own device that later in-place ops cannot change."""

    @abc.abstractmethod
    def to_host(self, copy: Any) -> Any:
        """A ``device_copy`` brought to the host, as ``snapshot`` would have made it."""

    @abc.abstractmethod
    def nbytes(self, tensor: Any) -> int: ...

    @abc.abstractmethod
    def snapshot(self, tensor: Any) -> Any:
        """A copy that later in-place ops cannot change (for tensor files)."""

    @abc.abstractmethod
    def to_numpy(self, snapshot: Any) -> Any: ...

    @abc.abstractmethod
    def describe_other(self, value: Any) -> Optional[dict]:
        """Framework-specific non-tensor values (dtype, device, Size); None if not one."""



_PLAIN = (bool, int, float, str)
_CRC = "md5"       # a pending entry's "dtype" when its handle is a device-side CRC (8 hex digits at resolve)
# Statistics already on the host, matched by exact type (a backend's pending device handle may be
# a tuple subclass). Rows are tuples of floats where the backend can: the GC untracks those.
HOST_ROW = (list, tuple)


def on_accelerator(handle: Any) -> bool:
    """Does a pending statistics handle live on an accelerator (a CUDA tensor, an arena slot on
    one)? Duck-typed: ``handle.device.type``; the core imports no framework."""
    device = getattr(handle, "device", None)
    return getattr(device, "type", "cpu") not in ("cpu", None)


class _Seen:
    """A tensor met earlier in this step folder (with async_dump: this flush window),
    unchanged: what was already made of it (its CRC is cached by the adapter, by bytes)."""

    __slots__ = ("ref", "file", "copy")

    def __init__(self, ref: Any, file: Optional[str], copy: Any) -> None:
        self.ref, self.file, self.copy = ref, file, copy


class Summarizer:
    """Turns argument structures into JSON-ready summaries; owns what is still pending.

    ``summary_mode``: ``statistics`` (Max/Min/Mean/Norm), ``md5`` (statistics and a CRC-32),
    ``xor`` (a 64-bit XOR checksum instead of the statistics). ``values=False`` (task
    ``structure``): dtype and shape only. ``defer`` (``async_dump``): nothing needs the tensor's
    bytes on the host before ``resolve``: tensor files and CRCs are made from copies left on
    the tensor's device until then (``deferred_bytes`` counts them, so the caller can bound it).
    """

    def __init__(self, adapter: TensorAdapter, *, summary_mode: str = "statistics", values: bool = True,
                 defer: bool = False, save_tensor: Optional[Callable[[str, Any], str]] = None):
        self.adapter = adapter
        self.summary_mode = summary_mode
        self.values = values
        self.defer = defer
        self.save_tensor = save_tensor       # (value name, host snapshot) -> file name
        self.link_tensor: Optional[Callable[[str, str], str]] = None   # (existing file, value name) -> file
        self.pending: List[Tuple[dict, Any, str]] = []     # statistics: (summary, handle, dtype); CRCs: dtype _CRC
        self.pending_xor: List[Tuple[dict, Any]] = []       # xor checksums: (summary, handle)
        self.deferred: List[list] = []       # defer: [summary, device copy, file's value name or None, crc?]
        self.deferred_bytes = 0
        # a pending handle lives on an accelerator: resolving now would sync it (Collector waits)
        self.on_device = False
        self._seen: dict = {}                # content key -> _Seen: one step folder (defer: one flush)
        fast = values and summary_mode in ("statistics", "md5")
        self._host_summary: Optional[Callable[..., Optional[dict]]] = \
            adapter.host_summary if fast else None
        self._host_md5 = summary_mode == "md5" and not defer      # async_dump: CRCs from copies, later
        if self._host_md5 and hasattr(adapter, "reuse_copies"):
            adapter.reuse_copies = True      # the CRC right after the statistics reads their copy
        # Exact types the adapter's tensors have (``tensor_types``, optional): tested with one set
        # lookup before the ``is_tensor`` call, on every recorded value.
        self._tensor_types = frozenset(getattr(adapter, "tensor_types", ()))
        self._crc32 = getattr(adapter, "crc32_deferred", None) or adapter.crc32
        # a host summary still needs ``_content`` (md5 with async_dump: the CRC from a copy)
        self._host_content = summary_mode == "md5" and not self._host_md5

    @property
    def n_pending(self) -> int:
        return len(self.pending) + len(self.pending_xor) + len(self.deferred)

    def summarize(self, value: Any, name: str, files: bool = True, hold: Optional[list] = None) -> Any:
        """Summary of `value`; `name` is the data-name prefix (``KEY.input.0``) for tensor files.
        ``files=False``: no tensor file for this value even when tensor files are being saved
        (and, with no `hold`, `name` is not used: the caller may pass ""). `hold`: gets
        ``(summary, name, tensor)`` of each tensor (the diff-only dump decides later)."""
        if type(value) in self._tensor_types:
            host = self._host_summary
            if host is not None and hold is None and not self._host_content and \
                    not (files and self.save_tensor is not None):
                out = host(value, self._host_md5)      # ``tensor``'s first branch, one call less
                if out is not None:
                    return out
            return self.tensor(value, name, files, hold)
        ad = self.adapter
        if ad.is_tensor(value):
            return self.tensor(value, name, files, hold)
        if value is None:
            return None
        if isinstance(value, _PLAIN):
            return {"type": type(value).__name__, "value": value}
        other = ad.describe_other(value)
        if other is not None:
            return other
        named = files or hold is not None          # nested values get names only when used
        if isinstance(value, (list, tuple)):
            return [self.summarize(v, value_name(name, i) if named else "", files, hold) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {str(k): self.summarize(v, value_name(name, k) if named else "", files, hold)
                    for k, v in value.items()}
        if isinstance(value, slice):
            return {"type": "slice", "value": [_plain(value.start), _plain(value.stop), _plain(value.step)]}
        if value is Ellipsis:
            return {"type": "ellipsis", "value": "..."}
        return {"type": type(value).__name__, "value": None}

    def plain(self, values: Any) -> list:
        """``[summarize(v, "", False) for v in values]``: the summaries of a record's values when
        no tensor file or held value needs a name (every statistics task), with the host
        shortcut taken here, one call per tensor less (~2,000 summaries a GPT-2 L1 step)."""
        host, tensor_types, s = self._host_summary, self._tensor_types, self.summarize
        if host is None or self._host_content:
            return [s(v, "", False) for v in values]
        md5 = self._host_md5
        out = []
        for v in values:
            if type(v) in tensor_types:
                row = host(v, md5, True)     # shared: a record's summaries are only read
                if row is not None:
                    out.append(row)
                    continue
            out.append(s(v, "", False))
        return out

    def tensor(self, t: Any, name: str, files: bool = True, hold: Optional[list] = None) -> dict:
        ad = self.adapter
        out = self._host_summary(t, self._host_md5) if self._host_summary is not None else None
        if out is not None:                 # statistics already on the host: the whole summary
            if hold is not None:
                hold.append((out, name, t))
            save = files and self.save_tensor is not None
            if save or self._host_content:
                self._content(t, name, out, save)
            return out
        out = ad.meta(t)                    # field order as msprobe writes it
        if hold is not None:
            hold.append((out, name, t))
        if not self.values or out.get(UNINITIALIZED):    # unwritten memory: no statistics, no file
            out["requires_grad"] = ad.requires_grad(t)
            return out
        if self.summary_mode == "xor":      # msprobe: the checksum replaces the statistics
            out["md5"] = None
            handle = ad.xor_checksum(t)
            if handle is not None:
                self.pending_xor.append((out, handle))
        else:
            handle = ad.stats(t)
            if type(handle) in HOST_ROW and len(handle) > 4:
                self._fill_shard(out, handle)
            elif type(handle) in HOST_ROW:        # already on the host (native kernel): filled now
                dtype = out["dtype"]
                out["Max"] = _typed(handle[0], dtype, "Max")
                out["Min"] = _typed(handle[1], dtype, "Min")
                out["Mean"] = handle[2]
                out["Norm"] = handle[3]
            else:
                out["Max"] = out["Min"] = out["Mean"] = out["Norm"] = None
                if handle is not None:
                    self.pending.append((out, handle, out["dtype"]))   # filled by resolve()
                    if not self.on_device:
                        self.on_device = on_accelerator(handle)
        out["requires_grad"] = ad.requires_grad(t)
        save = files and self.save_tensor is not None
        if self.summary_mode == "md5" or save:
            self._content(t, name, out, save)
        return out

    def _fill_shard(self, out: dict, row: Any) -> None:
        """A shard row (a DTensor's local shard, ``dumpfmt.shards``): msprobe's statistics of the
        shard, and the mergeable ones in the summary's ``dtensor`` block."""
        values, local = shard_stats(row, math.prod(out["shape"]))
        dtype = out["dtype"]
        for field, v in zip(STAT_FIELDS, values):
            out[field] = _typed(v, dtype, field)
        out.setdefault(DTENSOR, {})["local"] = local

    def _content(self, t: Any, name: str, out: dict, save: bool) -> None:
        """CRC and tensor file. A tensor seen unchanged earlier in this step (one call's output is
        the next call's input; a weight used forward and again by the optimizer) reuses its CRC,
        and its file is linked, not rewritten. With async_dump the device copy is shared instead,
        within one flush window (the copies are released at ``resolve``)."""
        ad = self.adapter
        key_of = ad.content_key
        key = key_of(t) if key_of is not None else None
        seen = self._seen.get(key) if key is not None else None
        if seen is not None and seen.ref() is not t:
            seen = None                                   # id reused by a new tensor
        if self.defer:
            copy = self._defer(t, name, out, save, seen)
            if key is not None and seen is None:
                self._seen[key] = _Seen(weakref.ref(t), None, copy)
            return
        if self.summary_mode == "md5":
            crc = self._crc32(t)           # the adapter keeps the CRCs of unchanged bytes (torch)
            if crc is None or type(crc) is str:
                out["md5"] = crc
            else:                          # computed on the device: resolved with the statistics
                out["md5"] = None
                self.pending.append((out, crc, _CRC))
                if not self.on_device:
                    self.on_device = on_accelerator(crc)
        file_name = None
        if save:
            if seen is not None and seen.file and self.link_tensor is not None:
                file_name = self.link_tensor(seen.file, name)
            else:
                snapshot = ad.snapshot(t)       # None: no values to write (a traced or freed tensor)
                file_name = self.save_tensor(name, snapshot) if snapshot is not None else None
            if file_name is not None:
                out["data_name"] = file_name
        if key is None:
            return
        if seen is None:
            self._seen[key] = _Seen(weakref.ref(t), file_name, None)
        else:
            seen.file = seen.file or file_name

    def _defer(self, t: Any, name: str, out: dict, save: bool, seen: Optional[_Seen]) -> Any:
        """async_dump: one copy on the tensor's device, CRC and file made from it in resolve()."""
        copy = seen.copy if seen is not None else None
        if copy is None:
            copy = self.adapter.device_copy(t)
            if copy is None:                    # no values to copy (a traced or freed tensor)
                if self.summary_mode == "md5":
                    out["md5"] = None
                return None
            self.deferred_bytes += self.adapter.nbytes(t)
        self.deferred.append([out, copy, name if save else None, self.summary_mode == "md5"])
        return copy

    def reset(self) -> None:
        """A new step folder: nothing seen yet (links never cross folders)."""
        self._seen.clear()
        self.adapter.reset()

    def resolve(self) -> None:
        """Fill every pending value: statistics and checksums in one host transfer each, then the
        deferred CRCs and tensor files (one host copy per device copy)."""
        if self.defer:
            self._seen.clear()         # its entries hold device copies: bounded by one flush window
        n = len(self.pending)          # entries appended meanwhile (another thread) stay queued
        if n:
            pending = self.pending[:n]
            values = self.adapter.stats_to_host([h for _, h, _ in pending])
            for (out, _, dtype), row in zip(pending, values):
                if dtype is _CRC:
                    out["md5"] = row
                    continue
                if len(row) > 4:
                    self._fill_shard(out, row)
                    continue
                for field, v in zip(STAT_FIELDS, row):
                    out[field] = _typed(v, dtype, field)
            del self.pending[:n]
            if not self.pending:
                self.on_device = False
        n = len(self.pending_xor)
        if n:
            pending_xor = self.pending_xor[:n]
            for (out, _), v in zip(pending_xor, self.adapter.checksums_to_host([h for _, h in pending_xor])):
                out["md5"] = xor_field(v)
            del self.pending_xor[:n]
        if self.deferred:
            self._resolve_deferred()

    def _resolve_deferred(self) -> None:
        ad = self.adapter
        n = len(self.deferred)
        hosts: dict = {}             # id(device copy) -> (host copy, crc, first file)
        for entry in self.deferred[:n]:
            out, copy, name, want_crc = entry
            got = hosts.get(id(copy))
            if got is None:
                got = hosts[id(copy)] = [ad.to_host(copy), None, None]
            if want_crc:
                got[1] = got[1] or ad.crc32(got[0])
                out["md5"] = got[1]
            if name is not None and self.save_tensor is not None:
                if got[2] and self.link_tensor is not None:
                    out["data_name"] = self.link_tensor(got[2], name)
                else:
                    out["data_name"] = got[2] = self.save_tensor(name, got[0])
        del self.deferred[:n]
        self.deferred_bytes = 0


def _plain(v: Any) -> Any:
    return v if v is None or isinstance(v, _PLAIN) else str(v)


_KINDS: dict = {}


def _typed(v: Optional[float], dtype: str, field: str) -> Any:
    """Integer/bool tensors keep integer/bool Max and Min, as msprobe writes them."""
    if v is None or v != v or field in ("Mean", "Norm"):
        return v
    kind = _KINDS.get(dtype)
    if kind is None:
        name = dtype_name(dtype)        # torch.int64, MindSpore Int32 -> int64, int32
        kind = _KINDS[dtype] = "bool" if name.startswith("bool") else "int" if is_exact(name) else "float"
    if kind == "bool":
        return bool(v)
    if kind == "int" and abs(v) < 2**53:
        return int(v)
    return v
