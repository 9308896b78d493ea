"""The ``md5`` field of a tensor summary: which checksum it holds and how it is written.

msprobe writes two checksums into the same field (its name stays ``md5`` for compatibility):

- ``summary_mode: md5``: CRC-32 of the tensor's raw bytes, 8 lowercase hex digits (``"3e1a317a"``).
- ``summary_mode: xor``: the XOR of the raw bytes read as little-endian 64-bit words (the last
  word zero-padded), written ``"0x"`` + 16 hex digits; a 0-dimensional tensor is written as its
  value instead (a float as a JSON number, an int or bool as the same hex form), and an empty
  tensor as null. A summary in xor mode carries no Max/Min/Mean/Norm.

Both compare only as equal / not equal, and only with a checksum of the same kind.
"""
from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np

CRC32, XOR = "crc32", "xor"
_MASK = (1 << 64) - 1
_CRC = re.compile(r"^[0-9a-f]{8}$")
_XOR = re.compile(r"^0x[0-9a-f]{16}$")
_U64LE = np.dtype("<u8")


def xor_field(value: Any) -> Any:
    """A resolved xor checksum as msprobe writes it: ints and bools as ``0x%016x`` (two's
    complement), floats (the value of a 0-d float tensor) as they are, None as null."""
    if value is None or isinstance(value, float):
        return value
    return f"0x{int(value) & _MASK:016x}"


def xor64_of_bytes(raw: np.ndarray) -> int:
    """XOR of a byte buffer read as little-endian uint64 words, the tail word zero-padded."""
    if raw.dtype != np.uint8 or not raw.flags.c_contiguous:
        raw = np.ascontiguousarray(raw).view(np.uint8)
    raw = raw.reshape(-1)
    n = raw.size
    whole = n - n % 8
    acc = int(np.bitwise_xor.reduce(raw[:whole].view(_U64LE))) if whole else 0
    if whole < n:
        tail = np.zeros(8, dtype=np.uint8)
        tail[:n - whole] = raw[whole:]
        acc ^= int(tail.view(_U64LE)[0])
    return acc


def xor_of_array(arr: np.ndarray) -> Any:
    """The xor ``md5`` field of an array's data, as ``xor_field`` writes it."""
    arr = np.asarray(arr)
    if arr.size == 0:
        return None
    if arr.ndim == 0 and not np.iscomplexobj(arr):
        return xor_field(arr.item())
    return xor_field(xor64_of_bytes(arr))


def checksum_kind(value: Any) -> Optional[str]:
    """``crc32`` / ``xor`` for a recorded ``md5`` field, None when it holds neither."""
    if isinstance(value, str):
        if _CRC.match(value):
            return CRC32
        if _XOR.match(value):
            return XOR
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return XOR                  # the value of a 0-d tensor, as msprobe's xor mode writes it
    return None
