"""Summaries of call arguments: tensors become statistics dicts, everything else ``{type, value}``.

Statistics are requested from the backend as small device-side values and resolved in one
batched host transfer per flush (``resolve``), so collecting never syncs per tensor.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, List, Optional, Protocol, Tuple

from ..dumpfmt import STAT_FIELDS, value_name


class TensorAdapter(Protocol):
    """What the core needs from a framework backend to summarise its tensors."""

    framework: str

    def is_tensor(self, value: Any) -> bool: ...

    def meta(self, tensor: Any) -> dict:
        """type, dtype, shape (host-known, no sync)."""

    def requires_grad(self, tensor: Any) -> bool: ...

    def stats(self, tensor: Any) -> Any:
        """A device-side handle for [max, min, mean, norm] or None (empty / no numbers)."""

    def stats_to_host(self, handles: List[Any]) -> List[List[Optional[float]]]:
        """One batched transfer for many ``stats`` handles."""

    def crc32(self, tensor: Any) -> str: ...

    def content_key(self, tensor: Any) -> Any:
        """A hashable key equal for the same unchanged tensor (e.g. (id, version)), or None."""

    def snapshot(self, tensor: Any) -> Any:
        """A copy that later in-place ops cannot change (for tensor files)."""

    def to_numpy(self, snapshot: Any) -> Any: ...

    def describe_other(self, value: Any) -> Optional[dict]:
        """Framework-specific non-tensor values (dtype, device, Size); None if not one."""

    def reset(self) -> None:
        """A new step: forget per-step caches (statistics of tensors seen unchanged)."""


_PLAIN = (bool, int, float, str)


class Summarizer:
    """Turns argument structures into JSON-ready summaries; owns pending statistics."""

    def __init__(self, adapter: TensorAdapter, *, md5: bool = False,
                 save_tensor: Optional[Callable[[str, Any], str]] = None):
        self.adapter = adapter
        self.md5 = md5
        self.save_tensor = save_tensor       # tensor mode: (value name, snapshot) -> file name
        self.pending: List[Tuple[dict, Any, str]] = []
        self.link_tensor: Optional[Callable[[str, str], str]] = None   # (existing file, value name) -> file
        self._seen: dict = {}          # content key -> (weakref, crc, file), one step folder

    def summarize(self, value: Any, name: str) -> Any:
        """Summary of `value`; `name` is the data-name prefix (``KEY.input.0``) for tensor files."""
        ad = self.adapter
        if ad.is_tensor(value):
            return self.tensor(value, name)
        if value is None:
            return None
        if isinstance(value, _PLAIN):
            return {"type": type(value).__name__, "value": value}
        other = ad.describe_other(value)
        if other is not None:
            return other
        if isinstance(value, (list, tuple)):
            return [self.summarize(v, value_name(name, i)) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {str(k): self.summarize(v, value_name(name, k)) for k, v in value.items()}
        if isinstance(value, slice):
            return {"type": "slice", "value": [_plain(value.start), _plain(value.stop), _plain(value.step)]}
        if value is Ellipsis:
            return {"type": "ellipsis", "value": "..."}
        return {"type": type(value).__name__, "value": None}

    def tensor(self, t: Any, name: str) -> dict:
        ad = self.adapter
        out = ad.meta(t)                    # field order as msprobe writes it
        handle = ad.stats(t)
        if type(handle) is list:            # already on the host (native kernel): filled now
            dtype = out["dtype"]
            out["Max"] = _typed(handle[0], dtype, "Max")
            out["Min"] = _typed(handle[1], dtype, "Min")
            out["Mean"] = handle[2]
            out["Norm"] = handle[3]
        else:
            out["Max"] = out["Min"] = out["Mean"] = out["Norm"] = None
            if handle is not None:
                self.pending.append((out, handle, out["dtype"]))   # filled by resolve()
        out["requires_grad"] = ad.requires_grad(t)
        if self.md5 or self.save_tensor is not None:
            self._content(t, name, out)
        return out

    def _content(self, t: Any, name: str, out: dict) -> None:
        """CRC and tensor file. A tensor seen unchanged earlier in this step (one call's output is
        the next call's input; a weight used forward and again by the optimizer) reuses its CRC,
        and its file is linked, not rewritten."""
        ad = self.adapter
        key_of = getattr(ad, "content_key", None)
        key = key_of(t) if key_of is not None else None
        seen = self._seen.get(key) if key is not None else None
        if seen is not None and seen[0]() is not t:
            seen = None                                   # id reused by a new tensor
        if self.md5:
            out["md5"] = seen[1] if seen is not None and seen[1] else ad.crc32(t)
        file_name = None
        if self.save_tensor is not None:
            if seen is not None and seen[2] and self.link_tensor is not None:
                file_name = self.link_tensor(seen[2], name)
            else:
                file_name = self.save_tensor(name, ad.snapshot(t))
            out["data_name"] = file_name
        if key is not None and seen is None:
            self._seen[key] = (weakref.ref(t), out.get("md5"), file_name)

    def reset(self) -> None:
        """A new step folder: nothing seen yet (links never cross folders)."""
        self._seen.clear()
        self.adapter.reset()

    def resolve(self) -> None:
        """Fill every pending statistic with one host transfer."""
        n = len(self.pending)          # entries appended meanwhile (another thread) stay queued
        if not n:
            return
        pending = self.pending[:n]
        values = self.adapter.stats_to_host([h for _, h, _ in pending])
        for (out, _, dtype), row in zip(pending, values):
            for field, v in zip(STAT_FIELDS, row):
                out[field] = _typed(v, dtype, field)
        del self.pending[:n]


def _plain(v: Any) -> Any:
    return v if v is None or isinstance(v, _PLAIN) else str(v)


_KINDS: dict = {}


def _typed(v: Optional[float], dtype: str, field: str) -> Any:
    """Integer/bool tensors keep integer/bool Max and Min, as msprobe writes them."""
    if v is None or v != v or field in ("Mean", "Norm"):
        return v
    kind = _KINDS.get(dtype)
    if kind is None:
        low = dtype.lower()             # torch.int64, MindSpore Int32
        kind = _KINDS[dtype] = "bool" if "bool" in low else "int" if "int" in low else "float"
    if kind == "bool":
        return bool(v)
    if kind == "int" and abs(v) < 2**53:
        return int(v)
    return v
