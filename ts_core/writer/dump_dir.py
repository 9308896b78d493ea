"""One ``step{N}/rank{R}`` folder: records go to the journal as they come; ``finalize`` writes
dump.json, stack.json and construct.json atomically from memory.

Write failures (disk full, permissions, file-size limit) warn once, mark the dump incomplete
and let training go on, unless the config says ``on_write_error: raise``.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from ..dumpfmt import JOURNAL, TENSOR_DIR, record_json, tensor_file_name, write_rank_files
from ..errors import DumpWriteError, warn_user
from .journal import Journal, read_journal
from ..dumpfmt.tensor_pack import PACK_TAR, PACKED, has_pack, repair
from .tensor_files import TensorFileWriter, TensorPackWriter

def _survive_file_size_limit() -> None:
    """By default exceeding RLIMIT_FSIZE kills the process with SIGXFSZ; ignored, the write
    fails with EFBIG instead, which we report as a write error while training goes on.
    Only changes the default disposition, never a handler the program installed."""
    import signal
    import threading

    sig = getattr(signal, "SIGXFSZ", None)
    if sig is not None and threading.current_thread() is threading.main_thread():
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, signal.SIG_IGN)


class DumpDir:
    def __init__(self, path: str, header: Dict[str, Any], *, tensor_to_numpy=None,
                 raise_on_error: bool = False, warned: Optional[List[bool]] = None, tensor_format: str = "files"):
        self.path = path
        self.header = dict(header)       # task, level, framework
        self.raise_on_error = raise_on_error
        self.data: Dict[str, str] = {}      # key -> record as JSON text
        self.construct: Dict[str, Optional[str]] = {}
        self.stacks: Dict[int, Tuple[List[str], List[str]]] = {}
        self.incomplete = False
        self._dirty = True                  # something changed since the JSON files were written
        self._warned = warned if warned is not None else [False]    # shared: warn once per run
        self._journal: Optional[Journal] = None
        self._tensors: Optional[TensorFileWriter] = None
        self.tensor_dir: Optional[str] = None
        self._data_dir: Optional[str] = None     # dump.json's dump_data_dir: the folder, or the pack
        _survive_file_size_limit()
        try:
            os.makedirs(path, exist_ok=True)
            self._journal = Journal(os.path.join(path, JOURNAL))
            if tensor_to_numpy is not None and tensor_format == PACKED:
                self.tensor_dir = os.path.join(path, TENSOR_DIR)    # the names; no folder is made
                self._data_dir = os.path.join(path, PACK_TAR)
                self.header["tensor_format"] = PACKED
                self._tensors = TensorPackWriter(path, tensor_to_numpy, self._failed)
            elif tensor_to_numpy is not None:
                self.tensor_dir = self._data_dir = os.path.join(path, TENSOR_DIR)
                os.makedirs(self.tensor_dir, exist_ok=True)
                self._tensors = TensorFileWriter(tensor_to_numpy, self._failed)
            self._journal.append({"t": "header", "v": self._header_json()})
        except OSError as exc:
            self._failed(exc)

    # -- collecting ---------------------------------------------------------------------
    def add_record(self, key: str, record: Any) -> None:
        """`record` is final (its statistics resolved): it is encoded once, here."""
        text = record_json(record)
        self.data[key] = text
        self._dirty = True
        if self._journal is not None:
            self._journal.append_record(key, text)

    def add_construct(self, key: str, parent: Optional[str]) -> None:
        self.construct[key] = parent
        self._dirty = True
        if self._journal is not None:
            self._journal.append_construct(key, parent)

    def add_stack(self, key: str, stack_id: int, frames: List[str]) -> None:
        entry = self.stacks.get(stack_id)
        if entry is None:
            entry = self.stacks[stack_id] = ([], frames)
            if self._journal is not None:
                self._journal.append_stackdef(stack_id, frames)
        entry[0].append(key)
        self._dirty = True
        if self._journal is not None:
            self._journal.append_stack(key, stack_id)

    def save_tensor(self, value_name: str, snapshot: Any) -> str:
        """Queue the tensor file of one value (``KEY.input.0``); returns its file name, which
        stays inside this folder."""
        file_name = tensor_file_name(value_name)
        if self._tensors is not None and not self.incomplete:
            self._tensors.submit(os.path.join(self.tensor_dir, file_name), snapshot)
        return file_name

    def link_tensor(self, existing: str, value_name: str) -> str:
        """A second name for a tensor file already queued (same data): a hard link, written in
        queue order after the original, so no bytes are copied or stored twice."""
        file_name = tensor_file_name(value_name)
        if file_name == existing:           # the same value again (a tied weight's gradient)
            return file_name
        if self._tensors is not None and not self.incomplete:
            self._tensors.submit_link(os.path.join(self.tensor_dir, existing),
                                      os.path.join(self.tensor_dir, file_name))
        return file_name

    @property
    def unflushed(self) -> bool:
        """Journal lines collected but not yet handed to the OS."""
        return self._journal is not None and self._journal.unflushed

    def flush(self) -> None:
        if self._journal is None:
            return
        try:
            self._journal.flush()
        except OSError as exc:
            self._failed(exc)

    # -- finishing ----------------------------------------------------------------------
    def finalize(self) -> None:
        """Write the three JSON files (complete, or not at all). Cheap when nothing changed.
        A journal that exists is brought up to date first; one that does not is created only
        if writing the JSON files fails (``Journal.covered``)."""
        if self._journal is not None and self._journal.created:
            self.flush()
        if self._tensors is not None:
            self._tensors.drain()
            try:
                self._tensors.seal()
            except OSError as exc:
                self._failed(exc)
        if not self._dirty:
            return
        try:
            head = self._header_json()
            if self.incomplete:
                head["incomplete"] = True
            write_rank_files(self.path, head, self.data, list(self.stacks.values()), self.construct,
                             data_encoded=True)
            self._dirty = False
        except OSError as exc:
            self._failed(exc)
        if self._journal is None:
            return
        if self._dirty:
            self.flush()            # the JSON files failed: the journal is what recover reads
        else:
            try:
                self._journal.covered()
            except OSError as exc:
                self._failed(exc)

    def close(self) -> None:
        """Finalize, stop the tensor writer, close the journal: each runs even when one before
        it raised (``on_write_error: raise``), so nothing stays open."""
        try:
            self.finalize()
        finally:
            tensors, self._tensors = self._tensors, None
            try:
                if tensors is not None:
                    tensors.close()
            finally:
                self._close_journal()

    def _close_journal(self) -> None:
        if self._journal is None:
            return
        try:
            created = self._journal.created
            self._journal.close()
            if created and not self.incomplete:
                os.unlink(self._journal.path)
        except OSError as exc:
            self._failed(exc)
        finally:
            self._journal = None

    def _header_json(self) -> Dict[str, Any]:
        head = dict(self.header)
        head["dump_data_dir"] = self._data_dir
        if "tensor_format" in head:             # after dump_data_dir: unpack drops only this key
            head["tensor_format"] = head.pop("tensor_format")
        return head

    def _failed(self, exc: BaseException) -> None:
        self.incomplete = True
        self._dirty = True
        if self.raise_on_error:
            raise DumpWriteError(f"tsprobe could not write the dump in {self.path}: {exc}") from exc
        if not self._warned[0]:
            self._warned[0] = True
            warn_user(f"tsprobe: writing the dump in {self.path} failed ({exc}); the dump is "
                      "marked incomplete and training goes on. Free space or fix permissions, "
                      "or set on_write_error: raise to stop instead.", RuntimeWarning)


def recover(path: str) -> int:
    """Rebuild dump.json/stack.json/construct.json of one rank folder from its journal
    (after a crash). Returns the number of records recovered."""
    journal = os.path.join(path, JOURNAL)
    if not os.path.isfile(journal):
        raise FileNotFoundError(f"no {JOURNAL} in {path}: nothing to recover")
    header: Dict[str, Any] = {}
    data: Dict[str, Any] = {}
    construct: Dict[str, Any] = {}
    stackdefs: Dict[Any, List[str]] = {}
    stack_keys: Dict[Any, List[str]] = {}
    for entry in read_journal(journal):
        kind, key, value = entry.get("t"), entry.get("k"), entry.get("v")
        if kind == "header" and isinstance(value, dict):
            header = value
        elif kind == "data":
            data[key] = value
        elif kind == "construct":
            construct[key] = value
        elif kind == "stackdef":
            stackdefs[key] = value
        elif kind == "stack":
            stack_keys.setdefault(value, []).append(key)
    if has_pack(path):          # the tar of a killed run: cut its torn member, rewrite its index
        repair(path)
    head = dict(header)
    head["incomplete"] = True
    write_rank_files(path, head, data, [(stack_keys.get(sid, []), frames) for sid, frames in stackdefs.items()],
                     construct)
    return len(data)
