"""A dump's tensors are read through one object, whatever the layout: ``open_tensors(folder)``
gives a ``TensorStore`` whose ``load(data_name)`` returns the array. Two layouts exist: msprobe's
``dump_tensor_data/`` folder (``.npy``, or msprobe's ``.pt``) and the packed tar
(tensor_pack.py). Only data formats are read: ``.npy`` never unpickled, ``.pt`` through
``torch.load(weights_only=True)`` (torch imported only when such a file is read).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from .errors import TensorFileError
from .layout import TENSOR_DIR
from .npy_map import is_mapped, read_npy
from .tensor_pack import PackReader, has_pack


class TensorStore:
    """The tensors of one step/rank folder, by ``data_name`` (``KEY.input.0.npy``)."""

    layout = ""

    def load(self, data_name: str) -> np.ndarray:
        raise NotImplementedError

    def names(self) -> List[str]:
        """The tensor files stored (repeated tensors under each of their names)."""
        raise NotImplementedError

    def locate(self, data_name: str) -> Optional[Tuple[str, int]]:
        """(file, offset of the .npy bytes in it) where the store keeps a .npy; None when unknown.
        The file is not checked to exist: its caller's ``os.stat`` says (one system call a file)."""
        return None


class FolderTensors(TensorStore):
    """msprobe's layout: one file per tensor in ``dump_tensor_data/`` (or ``dump_data_dir``)."""

    layout = "files"

    def __init__(self, folders: List[Path]):
        self.folders = folders
        self._dirs = [os.fspath(f) for f in folders]

    def load(self, data_name: str) -> np.ndarray:
        name = os.path.basename(str(data_name))  # a data_name never leaves the tensor folder
        for folder in self._dirs:
            path = os.path.join(folder, name)
            try:
                return load_tensor_file(path)    # no stat first: one file per tensor, thousands a dump
            except TensorFileError:
                if os.path.isfile(path):
                    raise
        raise TensorFileError(f"tensor file missing: {os.path.join(self._dirs[0], name)}")

    def locate(self, data_name: str) -> Optional[Tuple[str, int]]:
        name = os.path.basename(str(data_name))
        if len(self._dirs) == 1:
            return os.path.join(self._dirs[0], name), 0
        return next(((p, 0) for p in (os.path.join(d, name) for d in self._dirs) if os.path.isfile(p)), None)

    def names(self) -> List[str]:
        folder = next((f for f in self.folders if f.is_dir()), None)
        return sorted(os.listdir(folder)) if folder is not None else []


class PackedTensors(TensorStore):
    """The packed layout: members of ``dump_tensor_data.tar``, mapped in place."""

    layout = "packed"

    def __init__(self, folder: Path):
        self.folder = folder
        self._reader: Optional[PackReader] = None

    @property
    def reader(self) -> PackReader:
        if self._reader is None:             # the index is read on the first tensor asked for
            self._reader = PackReader(self.folder)
        return self._reader

    def load(self, data_name: str) -> np.ndarray:
        return self.reader.load(os.path.basename(str(data_name)))

    def locate(self, data_name: str) -> Optional[Tuple[str, int]]:
        where = self.reader.index.members.get(os.path.basename(str(data_name)))
        return (self.reader.tar, where[0]) if where else None

    def names(self) -> List[str]:
        return self.reader.names()


def open_tensors(folder: "os.PathLike | str", data_dir: Optional[str] = None) -> TensorStore:
    """The tensors of the rank folder `folder` (``data_dir``: dump.json's ``dump_data_dir``)."""
    folder = Path(folder)
    if has_pack(folder):
        return PackedTensors(folder)
    folders = [folder / TENSOR_DIR]
    if data_dir:
        folders.append(Path(data_dir))
    return FolderTensors(folders)


# Unmapping a tensor file's pages (munmap: the page tables, and every other core's TLB told) cost
# 1.5 ms a 16 MB pair on this VM, a quarter of a compare's time, on the one thread that also
# opens the next pair while the kernel's threads wait. A daemon thread drops the arrays instead
# (CPython's mmap releases the GIL to unmap); larger ones are dropped where they are, so that two
# of them are never mapped at once.
UNMAP_LATER_MAX = 64 << 20
_unmap_queue: Optional["queue.SimpleQueue"] = None


def unmap_later(*arrays: np.ndarray) -> None:
    """Let a background thread drop these memory-mapped arrays (the caller drops its own
    references right after): their unmapping overlaps the next compare instead of preceding it."""
    global _unmap_queue
    if sum(a.nbytes for a in arrays) > UNMAP_LATER_MAX or not any(is_mapped(a) for a in arrays):
        return
    if _unmap_queue is None:
        import queue
        import threading

        _unmap_queue = queue.SimpleQueue()
        threading.Thread(target=_unmapper, args=(_unmap_queue,), name="tsprobe-unmap", daemon=True).start()
    _unmap_queue.put(arrays)


def unmapped() -> None:
    """Return once every array handed to ``unmap_later`` so far is dropped."""
    if _unmap_queue is not None:
        import threading

        done = threading.Event()
        _unmap_queue.put(done)
        done.wait()


def _forget_unmapper() -> None:
    """In a forked child: the parent's unmapping thread is not there to drain its queue."""
    global _unmap_queue
    _unmap_queue = None


os.register_at_fork(after_in_child=_forget_unmapper)


def _unmapper(q: "queue.SimpleQueue") -> None:
    while True:
        item = q.get()
        if not isinstance(item, tuple):
            item.set()       # unmapped(): everything queued before it is dropped
        del item             # the arrays: the last reference unmaps them


def load_tensor_file(path: "os.PathLike | str") -> np.ndarray:
    """Load a .npy (memory-mapped, never pickled) or an msprobe .pt (weights_only) as numpy."""
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    try:
        if suffix == ".npy":
            fd = os.open(path, os.O_RDONLY)
            try:
                return read_npy(fd, 0, os.fstat(fd).st_size, path)
            finally:
                os.close(fd)
        if suffix == ".pt":
            return _load_pt(path)
    except TensorFileError:
        raise
    except Exception as e:  # truncated/corrupt files: the row says so, the rest goes on
        raise TensorFileError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    raise TensorFileError(f"{path}: unsupported tensor file type {suffix!r} (expected .npy or .pt)")


def _load_pt(path: str) -> np.ndarray:
    import torch  # only msprobe's .pt files need it

    try:  # memory-mapped where the file format allows: a large tensor is not read twice
        t = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:
        t = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(t, torch.Tensor):
        raise TensorFileError(f"{path}: holds {type(t).__name__}, not a tensor")
    t = t.detach()
    if t.dtype == torch.bfloat16 or "float8" in str(t.dtype) or "float4" in str(t.dtype):
        t = t.float()  # numpy has no such dtype; float32 holds these values exactly
    return t.contiguous().numpy()
