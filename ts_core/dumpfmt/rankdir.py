"""The three JSON files of one ``step{N}/rank{R}`` folder, read and written as a unit.

``stack.json`` groups keys by identical stack: ``{"0": [[KEY, ...], ["File F, line L, in
FUNC, \\n CODE", ...]]}``; ``construct.json`` maps each key to its parent module's key (or null).
Writers (the live dump, ``tsprobe recover``, the per-request split) all go through
``write_rank_files``; readers get the stacks per key from ``stacks_by_key``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .errors import DumpFormatError
from .jsonio import json_by_line, read_json, read_json_optional, write_text_atomic
from .layout import CONSTRUCT_JSON, DUMP_JSON, STACK_JSON, TENSOR_DIR
from .tensor_pack import PACK_TAR, has_pack

StackGroup = Tuple[List[str], List[str]]          # (keys, frames)


@dataclass
class RankFiles:
    """dump.json (header and records), stack.json and construct.json of one folder."""

    path: str
    header: Dict[str, Any]                 # task, level, framework, dump_data_dir, (incomplete)
    data: Dict[str, Any]
    stacks: List[StackGroup] = field(default_factory=list)
    construct: Dict[str, Optional[str]] = field(default_factory=dict)

    @property
    def tensor_dir(self) -> str:
        """Where this folder's tensor files are (``dump_data_dir`` may point elsewhere). A packed
        folder has none: its readers go through ``tensor_store.open_tensors``."""
        if has_pack(self.path):
            raise DumpFormatError(f"{self.path}: its tensors are packed ({PACK_TAR}); this tool reads the "
                                  f"dump_tensor_data/ folder: run tsprobe unpack {self.path} first")
        d = self.header.get("dump_data_dir")
        local = os.path.join(self.path, TENSOR_DIR)
        return local if os.path.isdir(local) or not isinstance(d, str) else d

    def stacks_by_key(self) -> Dict[str, List[str]]:
        return {k: frames for keys, frames in self.stacks for k in keys}


def stack_groups(raw: Any) -> List[StackGroup]:
    """stack.json content -> groups. Accepts the grouped form and the older ``{key: [frames]}``."""
    out: List[StackGroup] = []
    if not isinstance(raw, dict):
        return out
    for k, v in raw.items():
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], list) and isinstance(v[1], list):
            out.append(([str(x) for x in v[0]], [str(f) for f in v[1]]))
        elif isinstance(v, list):
            out.append(([str(k)], [str(f) for f in v]))
    return out


def read_header_and_data(path: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """dump.json of a rank folder (or the file itself) -> (header, records)."""
    json_path = path if path.endswith(".json") else os.path.join(path, DUMP_JSON)
    doc = read_json(json_path)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise DumpFormatError(f"{json_path}: not a dump.json (no \"data\" object mapping keys to records)")
    return {k: v for k, v in doc.items() if k != "data"}, doc["data"]


def read_stacks(folder: str) -> List[StackGroup]:
    return stack_groups(read_json_optional(os.path.join(folder, STACK_JSON), {}))


def read_construct(folder: str) -> Dict[str, Optional[str]]:
    raw = read_json_optional(os.path.join(folder, CONSTRUCT_JSON), {})
    return raw if isinstance(raw, dict) else {}


def read_rank_files(folder: str) -> RankFiles:
    header, data = read_header_and_data(folder)
    return RankFiles(folder, header, data, read_stacks(folder), read_construct(folder))


def write_rank_files(folder: str, header: Dict[str, Any], data: Dict[str, Any],
                     stacks: Sequence[StackGroup], construct: Dict[str, Optional[str]],
                     data_encoded: bool = False) -> None:
    """dump.json, stack.json and construct.json, each complete or not at all, one record per line.
    ``data_encoded``: the records are JSON text already. Not fsynced (``write_atomic``)."""
    write_text_atomic(os.path.join(folder, DUMP_JSON), json_by_line(header, "data", data, encoded=data_encoded),
                      fsync=False)
    groups = {str(i): [list(keys), list(frames)] for i, (keys, frames) in enumerate(stacks)}
    write_text_atomic(os.path.join(folder, STACK_JSON), json_by_line(groups), fsync=False)
    write_text_atomic(os.path.join(folder, CONSTRUCT_JSON), json_by_line(construct), fsync=False)
