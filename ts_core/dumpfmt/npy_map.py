""".npy bytes (a file of ``dump_tensor_data/``, or a member of the packed tar) as a read-only
array, with one open and one header read: small arrays are read, larger ones memory-mapped in
place. Never unpickles.

Why not ``np.load(mmap_mode="r")``: it opens the file three times, resolves its real path and
parses the header through ``ast``, ~0.5 ms a file here, which is more than comparing a 1 MB
pair. A dump of 8,000 small tensors spent two thirds of its compare there.
"""
from __future__ import annotations

import ast
import mmap
import os
import re
from typing import Callable, Dict, Tuple

import numpy as np

from .errors import TensorFileError

MAGIC = b"\x93NUMPY"
SMALL = 1 << 16          # data bytes below which an array is read (one pread), not mapped
# the header as numpy writes it (keys sorted, a tuple shape); any other header takes ``ast``
_NUMPY_HEADER = re.compile(r"\{'descr': '([^']+)', 'fortran_order': (True|False), 'shape': \(([0-9, ]*)\), \}\s*")
_DTYPES: Dict[str, np.dtype] = {}

Header = Tuple[Tuple[int, ...], bool, np.dtype, int]


def parse_header(head: bytes, read: Callable[[int], bytes], name: str) -> Header:
    """(shape, fortran_order, dtype, header length) of the .npy bytes that start with `head`;
    ``read(n)`` gives their first n bytes when the header is longer than `head`."""
    if head[:6] != MAGIC or len(head) < 10:
        raise TensorFileError(f"{name}: not a .npy file")
    major = head[6]
    prefix = 10 if major == 1 else 12
    hlen = int.from_bytes(head[8:prefix], "little")
    if prefix + hlen > len(head):
        head = read(prefix + hlen)
        if len(head) < prefix + hlen:
            raise TensorFileError(f"{name}: its .npy header is cut short")
    text = head[prefix:prefix + hlen].decode("utf-8" if major >= 3 else "latin1")
    fast = _NUMPY_HEADER.fullmatch(text)
    try:
        if fast:
            descr, fortran = fast.group(1), fast.group(2) == "True"
            shape = tuple(int(x) for x in fast.group(3).split(",") if x.strip())
            dtype = _DTYPES.get(descr)
            if dtype is None:
                dtype = _DTYPES[descr] = np.dtype(descr)
        else:
            d = ast.literal_eval(text)
            dtype = np.lib.format.descr_to_dtype(d["descr"])
            shape, fortran = tuple(int(x) for x in d["shape"]), bool(d["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError) as e:
        raise TensorFileError(f"{name}: bad .npy header ({e})") from None
    if dtype.hasobject:
        raise TensorFileError(f"{name}: holds Python objects; refusing to unpickle")
    if any(d < 0 for d in shape):
        raise TensorFileError(f"{name}: bad .npy header (shape {shape})")
    return shape, fortran, dtype, prefix + hlen


def read_npy(fd: int, offset: int, length: int, name: str) -> np.ndarray:
    """The array whose .npy bytes are ``[offset, offset + length)`` of the open file `fd`."""
    head = os.pread(fd, min(length, 4096), offset)
    shape, fortran, dtype, skip = parse_header(head, lambda n: os.pread(fd, n, offset), name)
    count = 1
    for d in shape:
        count *= d
    nbytes = count * dtype.itemsize
    if skip + nbytes > length:
        raise TensorFileError(f"{name}: holds {max(length - skip, 0)} data bytes, its header says {nbytes}")
    order = "F" if fortran else "C"
    if nbytes < SMALL:
        raw = head[skip:skip + nbytes] if skip + nbytes <= len(head) else os.pread(fd, nbytes, offset + skip)
        return np.frombuffer(raw, dtype, count=count).reshape(shape, order=order)
    start = offset + skip
    base = start - start % mmap.ALLOCATIONGRANULARITY
    mapped = mmap.mmap(fd, start + nbytes - base, access=mmap.ACCESS_READ, offset=base)
    return np.frombuffer(mapped, dtype, count=count, offset=start - base).reshape(shape, order=order)


def is_mapped(array: np.ndarray) -> bool:
    """True when `array` views a memory-mapped file (``read_npy`` or ``np.memmap``)."""
    a = array
    while isinstance(a, np.ndarray):
        if isinstance(a, np.memmap):
            return True
        a = a.base
    return isinstance(a, memoryview) and isinstance(a.obj, mmap.mmap) or isinstance(a, mmap.mmap)
