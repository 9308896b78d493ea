"""Memory-mapped tensor files are dropped by a background thread after their compare (so that the
unmapping overlaps the next one): they are dropped, the values are not touched, and an array too
large to keep mapped beside the next pair is left to its caller."""
import gc
import mmap
import queue
import threading
import weakref

import numpy as np
import pytest

from ts_core.dumpfmt import tensor_store as TS


def _mapped(tmp_path, name, n, how="tool"):
    """A memory-mapped array: the tool's own loader (large enough to be mapped) or np.memmap."""
    path = tmp_path / name
    np.save(path, np.arange(n, dtype=np.float32))
    return TS.load_tensor_file(path) if how == "tool" else np.load(path, mmap_mode="r")


def _mapping(arr):
    """The mmap object behind `arr`."""
    while isinstance(arr, np.ndarray):
        arr = arr.base
    return arr.obj if isinstance(arr, memoryview) else arr


@pytest.mark.parametrize("how", ["tool", "np.memmap"])
def test_mapped_arrays_are_unmapped_by_the_background_thread(tmp_path, monkeypatch, how):
    q = queue.SimpleQueue()
    monkeypatch.setattr(TS, "_unmap_queue", q)               # no thread drains it yet
    a, b = _mapped(tmp_path, "a.npy", 100_000, how), _mapped(tmp_path, "b.npy", 100_000, how)
    assert isinstance(_mapping(a), mmap.mmap)
    where = []
    for arr in (a, b):                                      # the mmap objects behind them
        weakref.finalize(_mapping(arr), lambda: where.append(threading.current_thread().name))
    assert a[99_999] == 99_999.0 and b[0] == 0.0
    TS.unmap_later(a, b)
    del a, b, arr
    gc.collect()
    assert where == []                                      # handed over: still mapped
    threading.Thread(target=TS._unmapper, args=(q,), name="unmapper-under-test", daemon=True).start()
    TS.unmapped()
    assert where == ["unmapper-under-test"] * 2


def test_large_or_unmapped_arrays_are_not_queued(tmp_path, monkeypatch):
    queued = []
    monkeypatch.setattr(TS, "_unmap_queue", type("Q", (), {"put": staticmethod(queued.append)})())
    TS.unmap_later(np.zeros(10, np.float32))                         # in memory: nothing to unmap
    monkeypatch.setattr(TS, "UNMAP_LATER_MAX", 100)
    TS.unmap_later(_mapped(tmp_path, "big.npy", 100_000))            # 400 kB > 100
    assert queued == []
