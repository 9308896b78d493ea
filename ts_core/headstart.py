"""Compare's head start: while ``tsprobe compare`` loads numpy and its own modules (~0.2 s on one
core), a forked child process compares the float tensors the two dumps store under the same
name, with the native kernel, at the tolerance the judge will most likely use (the dtype's
default, or the user's ``--rtol``/``--atol``).

A process, not a thread: the import holds the GIL almost throughout, and a thread that takes it
back after every file open, read and kernel part ran at half the kernel's speed (13.3 against
6.8 ms a 32 MB pair, benchmarks/compare_throughput.py). The child shares nothing with its
parent but a one-byte stop flag; it sends its results through a pipe when it stops.

The judge's read-ahead takes a pair's kernel results from here only when they were computed for
exactly its two files (device, inode, size, modification time, where the .npy bytes start), its
dtypes, element count, tolerance and kernel geometry; anything else it computes itself. So the
guess changes the speed, never a result. The child stops when the judge starts (``stop``), and
before the parent forks again. Nothing here imports numpy: that is what the child runs beside.
"""
from __future__ import annotations

import ctypes
import json
import marshal
import mmap
import os
import re
from typing import Dict, Iterator, List, Optional, Tuple

from . import native

MIN_BYTES = 1 << 20          # smaller tensors are not worth a thread's hand-over
TENSOR_DIR, PACK_TAR, PACK_INDEX = "dump_tensor_data", "dump_tensor_data.tar", "dump_tensor_data.index.json"
# float tolerances when the user gives none: judge/tolerances.py's defaults; a pair of two dtypes
# takes the stricter, as pick_tolerance does (tests/compare/test_headstart.py checks both)
DEFAULT_TOLERANCE = {native.F32: (1e-4, 1e-5), native.F64: (1e-7, 1e-9), native.F16: (1e-3, 1e-3)}
_HEADER = re.compile(r"\{'descr': '<(f2|f4|f8)', 'fortran_order': False, 'shape': \(([0-9, ]*)\), \}\s*")
_FLOATS = {"f2": (native.F16, 2), "f4": (native.F32, 4), "f8": (native.F64, 8)}     # dtype code, item size

FileId = Tuple[int, int, int, int, int]           # st_dev, st_ino, st_size, st_mtime_ns, .npy offset
_results: Dict[Tuple, List] = {}
_child: Optional[Tuple[int, int, mmap.mmap]] = None      # pid, read end of its pipe, the stop flag


def file_id(path: str, offset: int) -> Optional[FileId]:
    try:
        return _identity(os.stat(path), offset)
    except OSError:
        return None


def _identity(st: os.stat_result, offset: int) -> FileId:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, offset)


def default_tolerance(golden_code: int, target_code: int) -> Tuple[float, float]:
    """(rtol, atol) the judge uses for these file dtypes when the user gives none (the stricter)."""
    return min(DEFAULT_TOLERANCE[golden_code], DEFAULT_TOLERANCE[target_code])


def begin(golden: str, target: str, rtol: Optional[float], atol: Optional[float], equal_nan: bool) -> None:
    """Start comparing the two dumps' same-named tensors in a child process (not on a single
    core, without the native kernel, or where there is no fork)."""
    global _child
    if _child is not None or (os.cpu_count() or 1) < 2 or not hasattr(os, "fork") or not native.available():
        return
    flag = mmap.mmap(-1, 1)                # anonymous and shared: the parent writes, the child reads
    read_end, write_end = os.pipe()
    try:
        pid = os.fork()
    except OSError:                        # no process left to start: the judge does it all
        for fd in (read_end, write_end):
            os.close(fd)
        flag.close()
        return
    if pid == 0:
        status = 1
        try:
            os.close(read_end)
            _send(write_end, _compare_all(golden, target, rtol, atol, equal_nan, flag, os.getppid()))
            status = 0
        finally:
            os._exit(status)               # none of the parent's exit handlers or buffered output
    os.close(write_end)
    _child = (pid, read_end, flag)


def stop(finish: bool = False) -> None:
    """Stop the child after its current part (a pair it had not finished is dropped) and take its
    results; ``finish`` lets it compare every pair first."""
    global _child
    if _child is None:
        return
    pid, read_end, flag = _child
    _child = None
    if not finish:
        flag[0] = 1
    try:
        with open(read_end, "rb") as pipe:     # all it sends, until it closes its end
            data = pipe.read()
    finally:
        status = os.waitpid(pid, 0)[1]
        flag.close()
    if status == 0 and data:               # else it died on the way (a signal, a kernel fault): no head start
        _results.update(marshal.loads(data))


def end() -> None:
    """Stop, and forget what the judge did not take (the compare is over)."""
    stop()
    _results.clear()


def pending() -> bool:
    """True while results wait to be taken."""
    return bool(_results)


def take(golden: Optional[FileId], target: Optional[FileId], kernel: Tuple) -> Optional[List]:
    """The kernel's part results for these two .npy files (``file_id``) under `kernel` (dtype
    codes, element count, chunk, segment, rtol, atol, equal_nan); None when the head start did
    not compute exactly that."""
    if not _results or golden is None or target is None:
        return None
    return _results.pop((golden, target, kernel), None)


def _compare_all(golden: str, target: str, rtol: Optional[float], atol: Optional[float], equal_nan: bool,
                 flag: mmap.mmap, parent: int) -> Dict[Tuple, List]:
    """In the child: the results of every pair compared before the stop flag was set (or the
    parent went away)."""
    results: Dict[Tuple, List] = {}
    try:
        for g_file, t_file in _same_named(golden, target):
            if flag[0] or os.getppid() != parent:
                break
            _compare_files(g_file, t_file, rtol, atol, equal_nan, flag, results)
    except Exception:        # a head start only: the judge reads and reports every file itself
        pass
    return results


def _send(fd: int, results: Dict[Tuple, List]) -> None:
    with open(fd, "wb") as pipe:
        pipe.write(marshal.dumps(results))


def _same_named(golden: str, target: str) -> Iterator[Tuple[Tuple[str, int, int], Tuple[str, int, int]]]:
    """(path, offset, length) of the .npy bytes of each tensor both dumps hold under one name, in
    the same rank folder (relative to the two roots), largest first; a pair of files linked
    under several names (one tensor recorded as one call's output and the next one's input)
    once."""
    pairs = {}
    for rel in _rank_folders(golden):
        g_dir, t_dir = os.path.join(golden, rel), os.path.join(target, rel)
        g, t = _tensors(g_dir), _tensors(t_dir)
        for name in g.keys() & t.keys():
            if g[name][2] >= MIN_BYTES:
                pairs.setdefault((rel, g[name][3], t[name][3]), (g[name][:3], t[name][:3]))
    return iter(sorted(pairs.values(), key=lambda p: -p[0][2]))


def _rank_folders(root: str, depth: int = 3) -> Iterator[str]:
    """Folders under `root` (itself included, as "") holding a tensor folder or a pack."""
    if not os.path.isdir(root):
        return
    stack = [("", 0)]
    while stack:
        rel, d = stack.pop()
        here = os.path.join(root, rel)
        names = os.listdir(here)
        if TENSOR_DIR in names or PACK_TAR in names:
            yield rel
        elif d < depth:
            stack += [(os.path.join(rel, n), d + 1) for n in names if os.path.isdir(os.path.join(here, n))]


def _tensors(folder: str) -> Dict[str, Tuple[str, int, int, int]]:
    """name -> (path, offset, length, where: the file's inode or the member's offset) of a rank
    folder's .npy tensors, either layout."""
    if os.path.isfile(os.path.join(folder, PACK_TAR)):
        with open(os.path.join(folder, PACK_INDEX), encoding="utf-8") as f:
            members = json.load(f)["members"]
        tar = os.path.join(folder, PACK_TAR)
        return {n: (tar, int(v[0]), int(v[1]), int(v[0])) for n, v in members.items() if n.endswith(".npy")}
    tensors = os.path.join(folder, TENSOR_DIR)
    out = {}
    with os.scandir(tensors) as it:
        for e in it:
            if e.name.endswith(".npy") and e.is_file():
                out[e.name] = (e.path, 0, e.stat().st_size, e.inode())
    return out


def _header(fd: int, offset: int) -> Optional[Tuple[int, int, int, int]]:
    """(dtype code, element count, header length, data bytes) of a little-endian C-order
    float16/32/64 .npy as numpy writes it; None for anything else. (npy_map.parse_header reads
    every .npy, but needs numpy, which this thread runs beside.)"""
    head = os.pread(fd, 256, offset)
    if head[:6] != b"\x93NUMPY" or head[6] != 1:
        return None
    hlen = int.from_bytes(head[8:10], "little")
    m = _HEADER.fullmatch(head[10:10 + hlen].decode("latin1"))
    if m is None:
        return None
    count = 1
    for d in (x for x in m.group(2).split(",") if x.strip()):
        count *= int(d)
    code, itemsize = _FLOATS[m.group(1)]
    return code, count, 10 + hlen, count * itemsize


def _compare_files(g_file: Tuple[str, int, int], t_file: Tuple[str, int, int], rtol: Optional[float],
                   atol: Optional[float], equal_nan: bool, flag: mmap.mmap, results: Dict[Tuple, List]) -> None:
    ids, maps, addrs, heads = [], [], [], []
    try:
        for path, offset, length in (g_file, t_file):
            fd = os.open(path, os.O_RDONLY)
            try:
                head = _header(fd, offset)
                if head is None or head[2] + head[3] > length:
                    return
                ids.append(_identity(os.fstat(fd), offset))
                start = offset + head[2]
                base = start - start % mmap.ALLOCATIONGRANULARITY
                # a private (copy-on-write) map, so that ctypes may take its address; nothing writes it
                mm = mmap.mmap(fd, start + head[3] - base,
                               access=mmap.ACCESS_COPY, offset=base)
            finally:
                os.close(fd)
            maps.append(mm)
            view = ctypes.c_char.from_buffer(mm)
            addrs.append(ctypes.addressof(view) + start - base)
            del view
            heads.append(head)
        (gc, n, _, _), (tc, tn, _, _) = heads
        if n != tn or n == 0:
            return
        r, a = default_tolerance(gc, tc)
        r, a = (r if rtol is None else rtol), (a if atol is None else atol)
        chunk, segment = native.COMPARE_CHUNK, native.COMPARE_SEGMENT
        parts = []
        for b, e in native.compare_parts(n, chunk, segment):
            if flag[0]:
                return
            got = native.compare_range(addrs[0], gc, addrs[1], tc, b, e, chunk, r, a, equal_nan)
            if got is None:
                return
            parts.append(got)
        results[(ids[0], ids[1], (gc, tc, n, chunk, segment, r, a, bool(equal_nan)))] = parts
    finally:
        for mm in maps:
            mm.close()


os.register_at_fork(before=stop)
