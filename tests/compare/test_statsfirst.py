"""Statistics first: which tensor values are decided from their summaries (no file read), on
summaries made here from numpy arrays (reference_stats, crc32_hex, xor64_of_bytes)."""
from __future__ import annotations

import zlib

import numpy as np

from ts_core.compare.judge.statsfirst import unchanged
from ts_core.dumpfmt.checksum import xor64_of_bytes
from ts_core.dumpfmt.refstats import reference_stats


def crc32_hex(a) -> str:
    """The summary's ``md5`` field computed independently: zlib's CRC-32 of the raw bytes."""
    return f"{zlib.crc32(np.ascontiguousarray(a).view(np.uint8)) & 0xFFFFFFFF:08x}"


def _summary(a: np.ndarray, checksum: str = "crc32") -> dict:
    s = {"type": "torch.Tensor", "dtype": f"torch.{a.dtype}", "shape": list(a.shape), **reference_stats(a)}
    if checksum == "crc32":
        s["md5"] = crc32_hex(a)
    elif checksum == "xor":
        s["md5"] = f"0x{xor64_of_bytes(np.ascontiguousarray(a).view(np.uint8)):016x}"
    return s


def test_equal_checksums_skip_the_read_and_different_ones_do_not():
    a = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    b = a.copy()
    b[3, 3] = np.nextafter(b[3, 3], np.float32(np.inf))           # one ulp apart
    assert unchanged(_summary(a), _summary(a.copy())) == "statistics first: crc32 equal, tensor files not read"
    assert unchanged(_summary(a), _summary(b)) == ""
    assert "xor equal" in unchanged(_summary(a, "xor"), _summary(a.copy(), "xor"))
    assert unchanged(_summary(a, "xor"), _summary(b, "xor")) == ""


def test_without_one_checksum_kind_the_statistics_decide():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert "Max/Min/Mean/Norm bit-equal" in unchanged(_summary(a, "crc32"), _summary(a, "xor"))
    assert "bit-equal" in unchanged(_summary(a, ""), _summary(a, ""))
    # the documented blind spot: a permutation of the same values has the same statistics ...
    assert unchanged(_summary(a, ""), _summary(a[::-1].copy(), "")) != ""
    # ... which a checksum catches
    assert unchanged(_summary(a), _summary(a[::-1].copy())) == ""


def test_other_dtype_shape_or_missing_statistics_are_read():
    a = np.ones((2, 3), dtype=np.float32)
    assert unchanged(_summary(a), _summary(a.astype(np.float16))) == ""
    assert unchanged(_summary(a), _summary(a.reshape(3, 2))) == ""
    bare = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3]}
    assert unchanged(bare, dict(bare)) == ""
