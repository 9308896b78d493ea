"""Background writer of tensor files with a bounded queue (training never waits on disk
unless the queue is full, which bounds memory: at most ``max_queue`` snapshots and, past the
first, ``max_bytes`` of them; 64 snapshots of a large model's embedding would be 32 GB).

A failed write never kills the writer thread: the error is handed to ``on_error`` on the
*training* thread, at the next ``submit``/``drain``/``close`` (so ``on_write_error: raise``
raises where the user can catch it, and nothing waits on a dead thread). Only the first
failure is handed over: the writes queued behind it fail the same way, and raising again for
each would make every later ``stop()``/``close()`` raise too."""
from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, Callable, List, Optional

import numpy as np

from ..dumpfmt.jsonio import write_atomic
from ..dumpfmt.tensor_pack import (END_OF_ARCHIVE, PACK_INDEX, PACK_TAR, PackIndex, member_header, npy_parts, padding,
                                   write_index)

_STOP = object()
MAX_BYTES_IN_FLIGHT = 512 * 2**20


class _Link:
    __slots__ = ("existing",)

    def __init__(self, existing: str):
        self.existing = existing


class TensorFileWriter:
    def __init__(self, to_numpy: Callable[[Any], np.ndarray], on_error: Callable[[BaseException], None],
                 max_queue: int = 64, max_bytes: int = MAX_BYTES_IN_FLIGHT):
        self._to_numpy = to_numpy
        self._on_error = on_error
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=max_queue)
        self._max_bytes = max_bytes
        self._in_flight = 0                           # bytes of snapshots queued or being written
        self._room = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._errors: List[BaseException] = []       # raised on the writer thread, reported here
        self._reported = False

    def submit(self, path: str, snapshot: Any) -> None:
        self._report_errors()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tsprobe-tensor-writer", daemon=True)
            self._thread.start()
        size = getattr(snapshot, "nbytes", 0)       # torch and numpy both say
        if size:
            with self._room:        # wait for the disk: a snapshot larger than the bound still goes alone
                while self._in_flight and self._in_flight + size > self._max_bytes:
                    self._room.wait()
                self._in_flight += size
        self._queue.put((path, snapshot, size))

    def submit_link(self, existing: str, path: str) -> None:
        self.submit(path, _Link(existing))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                self._queue.task_done()
                return
            path, snapshot, size = item
            try:
                self._write(path, snapshot)
            except BaseException as exc:  # keep draining: one bad write must not block training
                self._errors.append(exc)
            finally:
                item = snapshot = None      # freed before the training thread is told there is room
                if size:
                    with self._room:
                        self._in_flight -= size
                        self._room.notify_all()
                self._queue.task_done()

    def _write(self, path: str, snapshot: Any) -> None:
        if isinstance(snapshot, _Link):
            try:
                os.link(snapshot.existing, path)
            except FileExistsError:
                if not os.path.samefile(snapshot.existing, path):   # a stale file of that name
                    os.remove(path)
                    os.link(snapshot.existing, path)
                # else: this value was linked already (a tied weight's gradient seen twice)
            except OSError:                      # no hard links here: copy the file instead
                import shutil

                shutil.copyfile(snapshot.existing, path)
            return
        array = np.asarray(self._to_numpy(snapshot))
        write_atomic(path, lambda f: np.save(f, array, allow_pickle=False), "wb", fsync=False)

    def seal(self) -> None:
        """Make what is written so far readable as a whole (the packed layout's index)."""

    def _report_errors(self) -> None:
        if not self._errors:
            return
        first = self._errors[0]
        self._errors.clear()
        if not self._reported:
            self._reported = True
            self._on_error(first)

    def drain(self) -> None:
        """Wait until every submitted file is on disk (or failed), then report failures."""
        if self._thread is not None:
            self._queue.join()
        self._report_errors()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        self._report_errors()


class TensorPackWriter(TensorFileWriter):
    """The same queue, bound and error handling, but every tensor is appended to one tar per
    folder (``tensor_format: packed``, see dumpfmt/tensor_pack.py): no file is created per
    tensor. A member goes out in one ``writev``; a failed write is cut off again, so the tar
    never holds half a member followed by whole ones. ``seal`` (each finalize) writes the
    end-of-archive marker and the index; the next member overwrites the marker."""

    def __init__(self, folder: str, to_numpy: Callable[[Any], np.ndarray], on_error: Callable[[BaseException], None],
                 **kwargs: Any):
        super().__init__(to_numpy, on_error, **kwargs)
        self.folder = folder
        try:                        # a stale index of an earlier run must never describe this tar
            os.unlink(os.path.join(folder, PACK_INDEX))
        except FileNotFoundError:
            pass
        self._fd = os.open(os.path.join(folder, PACK_TAR), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._index = PackIndex()
        self._mtime = int(time.time())
        self._lock = threading.Lock()       # the writer thread appends, the training thread seals
        self._sealed = False

    def _write(self, path: str, snapshot: Any) -> None:
        name = os.path.basename(path)
        with self._lock:
            if isinstance(snapshot, _Link):
                target = os.path.basename(snapshot.existing)
                if name == target or self._index.links.get(name) == target:
                    return                  # this value was linked already (a tied weight's gradient)
                if target not in self._index.members:       # its write failed: no member to repeat
                    raise OSError(f"{name}: repeats {target}, which was not written")
                self._append([member_header(name, 0, self._mtime, link=target)])
                self._index.add_link(name, target)          # indexed once its bytes are in the tar
                return
            head, data = npy_parts(np.asarray(self._to_numpy(snapshot)))
            size = len(head) + data.nbytes
            header = member_header(name, size, self._mtime)
            start = self._index.end + len(header)
            self._append([header, head, data, padding(size)])
            self._index.add(name, start, size)

    def _append(self, parts: List[Any]) -> None:
        views = [memoryview(p).cast("B") for p in parts]
        end = self._index.end
        try:
            os.lseek(self._fd, end, os.SEEK_SET)
            while views:
                n = os.writev(self._fd, views)
                end += n
                while views and n >= len(views[0]):
                    n -= len(views[0])
                    views.pop(0)
                if views:
                    views[0] = views[0][n:]
        except BaseException:
            try:
                os.ftruncate(self._fd, self._index.end)
            except OSError:
                pass
            raise
        self._index.end = end
        self._sealed = False

    def seal(self) -> None:
        with self._lock:
            if self._sealed or self._fd < 0:
                return
            os.pwrite(self._fd, END_OF_ARCHIVE, self._index.end)
            write_index(self.folder, self._index)
            self._sealed = True

    def close(self) -> None:
        try:
            super().close()
            self.seal()
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
