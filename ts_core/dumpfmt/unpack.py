"""``tsprobe unpack DUMP [--out OUT]``: a packed dump (tensor_pack.py) back to msprobe's layout,
one ``.npy`` per tensor in ``dump_tensor_data/``, repeated tensors hard-linked as the default
mode links them, and dump.json's header as the default mode writes it. The files are the same
bytes a ``tensor_format: files`` run writes, for tools that expect that layout.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import List, Optional

from .errors import DumpFormatError
from .jsonio import json_by_line, read_json, write_text_atomic
from .layout import DUMP_JSON, JOURNAL, TENSOR_DIR
from .tensor_pack import PACK_INDEX, PACK_TAR, read_index


def unpack(path: str, out: Optional[str] = None) -> List[str]:
    """Unpack every pack under `path` (a dump root, step or rank folder): in place (the tar and
    its index are removed once the files are written) or into a copy at `out`. Returns the rank
    folders written."""
    if not os.path.isdir(path):
        raise DumpFormatError(f"{path}: not a folder")
    folders = [root for root, _, files in sorted(os.walk(path)) if PACK_TAR in files]
    if not folders:
        raise DumpFormatError(f"{path}: holds no packed dump (no {PACK_TAR} below it)")
    for folder in folders:
        if os.path.isfile(os.path.join(folder, JOURNAL)):
            raise DumpFormatError(f"{folder}: the run that wrote it did not finish; run tsprobe recover "
                                  f"{folder} first")
    if out is not None:
        if os.path.exists(out) and os.listdir(out):
            raise DumpFormatError(f"{out}: exists and is not empty; name a new folder")
        shutil.copytree(path, out, ignore=shutil.ignore_patterns(PACK_TAR, PACK_INDEX), dirs_exist_ok=True)
    written = []
    for folder in folders:
        rel = os.path.relpath(folder, path)
        dest = folder if out is None else (out if rel == "." else os.path.join(out, rel))
        _unpack_folder(folder, dest)
        if out is None:
            os.unlink(os.path.join(folder, PACK_TAR))
            if os.path.isfile(os.path.join(folder, PACK_INDEX)):
                os.unlink(os.path.join(folder, PACK_INDEX))
        written.append(dest)
    return written


def _unpack_folder(folder: str, dest: str) -> None:
    index = read_index(folder)
    tensors = os.path.join(dest, TENSOR_DIR)
    if os.path.isdir(tensors) and os.listdir(tensors):
        raise DumpFormatError(f"{tensors}: exists already; unpack would mix two dumps")
    os.makedirs(tensors, exist_ok=True)
    with open(os.path.join(folder, PACK_TAR), "rb") as src:
        for name, (offset, length) in index.members.items():
            if name not in index.links:
                with open(os.path.join(tensors, name), "wb") as f:
                    _copy_range(src.fileno(), f.fileno(), offset, length)
    for name, target in index.links.items():
        try:
            os.link(os.path.join(tensors, target), os.path.join(tensors, name))
        except OSError:                     # no hard links on this file system: a copy
            shutil.copyfile(os.path.join(tensors, target), os.path.join(tensors, name))
    _rewrite_header(os.path.join(dest, DUMP_JSON), tensors, dest == folder)


def _copy_range(src: int, dst: int, offset: int, length: int) -> None:
    while length > 0:
        n = os.sendfile(dst, src, offset, min(length, 1 << 30))
        if n == 0:
            raise DumpFormatError(f"{PACK_TAR}: ends inside a member its index names; run tsprobe recover")
        offset += n
        length -= n


def _rewrite_header(json_path: str, tensors: str, in_place: bool) -> None:
    """dump.json as the default mode writes it: ``dump_data_dir`` names the folder and
    ``tensor_format`` goes; the records are kept as they are, byte for byte."""
    with open(json_path, encoding="utf-8") as f:
        text = f.read()
    cut = text.find('\n"data": ')
    try:
        head = json.loads(text[:cut].rstrip().rstrip(",") + "}") if cut > 0 else None
    except ValueError:
        head = None
    if not isinstance(head, dict):           # not written by tsprobe's line-per-record writer
        doc = read_json(json_path)
        head, body = {k: v for k, v in doc.items() if k != "data"}, doc.get("data", {})
        rest = None
    else:
        rest = text[cut + 1:]
    head.pop("tensor_format", None)
    old = head.get("dump_data_dir")
    in_place = in_place and isinstance(old, str) and os.path.basename(old) == PACK_TAR
    head["dump_data_dir"] = old[:-len(".tar")] if in_place else tensors     # in place: as the run named it
    if rest is None:
        write_text_atomic(json_path, json_by_line(head, "data", body))
    else:
        write_text_atomic(json_path, json_by_line(head)[:-2] + ",\n" + rest)
