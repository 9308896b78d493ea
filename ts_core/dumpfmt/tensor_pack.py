"""The packed tensor layout (``tensor_format: packed``): one file per step and rank instead of
one file per tensor. Creating a file costs ~1 ms of CPU on ext4 and more on Lustre/GPFS, so a
step of 1,140 tensor files costs 6.7x the no-tool step before a byte is written (issue 29).

```
step{N}/rank{R}/dump_tensor_data.tar          uncompressed POSIX (pax) tar, appended as the step runs:
                                              member ``dump_tensor_data/NAME.npy`` holds exactly the
                                              bytes ``np.save`` writes; a repeated tensor is a
                                              hard-link member (stored once)
step{N}/rank{R}/dump_tensor_data.index.json   NAME.npy -> [offset, length] of its .npy bytes in the
                                              tar; written at step end, rebuilt from the tar if missing
```
``tar -xf dump_tensor_data.tar`` in the rank folder gives back msprobe's ``dump_tensor_data/``
byte for byte (``tsprobe unpack`` does it and fixes dump.json). A killed run keeps every member
written before the kill; ``tsprobe recover`` cuts a torn last member and rewrites the index.
Readers map one member at a time (``PackReader.load``), never the whole file.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from .errors import DumpFormatError, TensorFileError
from .jsonio import read_json, write_json_atomic
from .layout import TENSOR_DIR
from .npy_map import read_npy

PACKED = "packed"                       # tensor_format value; "files" is msprobe's layout
TENSOR_FORMATS = ("files", PACKED)
PACK_TAR = TENSOR_DIR + ".tar"
PACK_INDEX = TENSOR_DIR + ".index.json"
BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
_PREFIX = TENSOR_DIR + "/"
_INDEX_FORMAT = "tsprobe-tensor-pack/1"

try:    # the function np.save itself calls, so the bytes are the same (numpy 2 moved it)
    from numpy.lib._format_impl import _write_array_header
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.lib.format import _write_array_header  # type: ignore[attr-defined,no-redef]


# ---------------------------------------------------------------- writing

def npy_parts(array: np.ndarray) -> Tuple[bytes, np.ndarray]:
    """(header, data) of ``np.save(f, array, allow_pickle=False)``: the same bytes, without a
    copy of a contiguous array's data."""
    if array.dtype.hasobject:
        raise TensorFileError("refusing to pack an object array (it would need pickle)")
    buf = io.BytesIO()
    _write_array_header(buf, np.lib.format.header_data_from_array_1_0(array), None)
    fortran = array.flags.f_contiguous and not array.flags.c_contiguous
    data = np.ascontiguousarray(array.T if fortran else array)
    return buf.getvalue(), data.reshape(-1).view(np.uint8)


def member_header(name: str, size: int, mtime: int, link: Optional[str] = None) -> bytes:
    """The tar header block(s) of member ``dump_tensor_data/NAME`` (pax records for long names)."""
    import tarfile      # here, not at import: ``import ts_core`` stays light
    info = tarfile.TarInfo(_PREFIX + name)
    info.size, info.mtime, info.mode = (0 if link else size), mtime, 0o644
    if link is not None:
        info.type, info.linkname = tarfile.LNKTYPE, _PREFIX + link
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def padding(size: int) -> bytes:
    return bytes(-size % BLOCK)


# ---------------------------------------------------------------- the index

@dataclass
class PackIndex:
    """Where each member's .npy bytes are. ``links``: name -> the member it repeats;
    ``end``: where the next member goes (the end-of-archive marker starts there)."""

    members: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    links: Dict[str, str] = field(default_factory=dict)
    end: int = 0

    def add(self, name: str, offset: int, length: int) -> None:
        self.members[name] = (offset, length)
        self.links.pop(name, None)

    def add_link(self, name: str, target: str) -> None:
        if target not in self.members:
            raise TensorFileError(f"{name}: links to {target}, which the pack does not hold")
        self.members[name] = self.members[target]
        self.links[name] = target


def write_index(folder: str, index: PackIndex) -> None:
    write_json_atomic(os.path.join(folder, PACK_INDEX),
                      {"format": _INDEX_FORMAT, "tar": PACK_TAR, "end": index.end,
                       "members": {k: list(v) for k, v in index.members.items()}, "links": index.links},
                      indent=None)


def read_index(folder: str) -> PackIndex:
    """The index of a rank folder's pack; scanned from the tar when the index is missing."""
    path = os.path.join(folder, PACK_INDEX)
    if not os.path.isfile(path):
        return scan(os.path.join(folder, PACK_TAR))
    doc = read_json(path)
    try:
        if doc.get("format") != _INDEX_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        members = {str(k): (int(v[0]), int(v[1])) for k, v in doc["members"].items()}
        return PackIndex(members, {str(k): str(v) for k, v in doc.get("links", {}).items()}, int(doc["end"]))
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as e:
        raise DumpFormatError(f"{path}: not a tsprobe pack index ({e}); delete it to rebuild it from "
                              f"{PACK_TAR}") from None


# ---------------------------------------------------------------- scanning

def scan(tar_path: str) -> PackIndex:
    """Every complete member of a pack, read from its tar headers. A torn last member (the run
    was killed while writing it) is left out; anything else that is not a tar is an error."""
    import tarfile
    index = PackIndex()
    try:
        f = open(tar_path, "rb")
    except FileNotFoundError:
        raise DumpFormatError(f"{tar_path}: file not found") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        pos, pax = 0, {}
        while True:
            block = f.read(BLOCK)
            if len(block) < BLOCK or block == bytes(BLOCK):     # torn header, or the end marker
                break
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as e:
                raise DumpFormatError(f"{tar_path}: not a tar archive: bad header at byte {pos} ({e}); "
                                      "the file is corrupt") from None
            length = pax.get("size", info.size)
            data_at, data_end = pos + BLOCK, pos + BLOCK + length
            if data_end > size:
                break                                           # torn member: the crash point
            if info.type in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME):
                raw = f.read(length)
                pax = _pax_records(raw) if info.type == tarfile.XHDTYPE else {"path": raw.rstrip(b"\0").decode()}
            else:
                name = _member_name(pax.get("path", info.name))
                if info.type == tarfile.LNKTYPE:
                    try:
                        index.add_link(name, _member_name(pax.get("linkpath", info.linkname)))
                    except TensorFileError as e:
                        raise DumpFormatError(f"{tar_path}: {e}") from None
                elif info.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    index.add(name, data_at, length)
                pax = {}
            pos = data_end + (-length % BLOCK)
            f.seek(pos)
            index.end = pos if not pax else index.end
    return index


def _pax_records(raw: bytes) -> dict:
    out: dict = {}
    while raw:
        length, _, rest = raw.partition(b" ")
        n = int(length)
        key, _, value = rest[:n - len(length) - 2].partition(b"=")
        out[key.decode()] = int(value) if key == b"size" else value.decode("utf-8", "surrogateescape")
        raw = raw[n:]
    return out


def _member_name(name: str) -> str:
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else name


def repair(folder: str) -> PackIndex:
    """After a crash: cut the torn tail of the tar, close the archive, rewrite the index."""
    tar = os.path.join(folder, PACK_TAR)
    index = scan(tar)
    with open(tar, "r+b") as f:
        f.truncate(index.end)
        f.seek(index.end)
        f.write(END_OF_ARCHIVE)
    write_index(folder, index)
    return index


def has_pack(folder: "os.PathLike | str") -> bool:
    return os.path.isfile(os.path.join(folder, PACK_TAR))


# ---------------------------------------------------------------- reading

class PackReader:
    """The tensors of one rank folder's pack, by file name (``KEY.input.0.npy``)."""

    def __init__(self, folder: "os.PathLike | str"):
        self.folder = os.fspath(folder)
        self.tar = os.path.join(self.folder, PACK_TAR)
        self.index = read_index(self.folder)
        size = os.path.getsize(self.tar)
        if any(off + n > size for off, n in self.index.members.values()):
            raise DumpFormatError(f"{self.tar}: shorter than its index says ({PACK_INDEX}); the tar was "
                                  f"cut after the index was written: run tsprobe recover {self.folder}")

    def names(self) -> List[str]:
        return list(self.index.members)

    def __contains__(self, name: str) -> bool:
        return name in self.index.members

    def load(self, name: str) -> np.ndarray:
        """The array, read-only: small ones read, large ones memory-mapped (no copy)."""
        where = self.index.members.get(name)
        if where is None:
            raise TensorFileError(f"tensor missing: {name} is not in {self.tar}")
        offset, length = where
        fd = os.open(self.tar, os.O_RDONLY)
        try:
            return read_npy(fd, offset, length, f"{name} in {self.tar}")
        finally:
            os.close(fd)
