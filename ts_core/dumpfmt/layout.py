"""Names of the files and folders of a dump, and finding the step/rank folders under a path.

```
dump_path/step{N}/rank{R}/        ("rank" without a number when not distributed)
    dump.json  stack.json  construct.json  journal.jsonl (until the step is closed)
    token_map.json (token-range inference capture: which rows are which request and token)
    dump_tensor_data/KEY.input.0.npy ...
dump_path/monitor.jsonl  dump_path/tensorboard/rank{R}/   (monitor mode)
```
msprobe names rank folders ``rank{R}`` too, or ``proc{PID}``; both are read.
"""
from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from .errors import DumpFormatError

DUMP_JSON = "dump.json"
STACK_JSON = "stack.json"
CONSTRUCT_JSON = "construct.json"
JOURNAL = "journal.jsonl"         # append-only record log; what a run killed before stop() leaves
TENSOR_DIR = "dump_tensor_data"
TOKEN_MAP = "token_map.json"      # token-range inference capture, see token_map.py
MONITOR_JSONL = "monitor.jsonl"   # monitor mode: one line per step and rank, at the dump root
TENSORBOARD_DIR = "tensorboard"   # monitor mode: default TensorBoard folder, at the dump root
TENSOR_SUFFIX = ".npy"

_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^(rank\d*|proc\d+)$")
_MAX_NAME = 240


def step_dir_name(step: int) -> str:
    return f"step{step}"


def rank_dir_name(rank: Optional[int]) -> str:
    return "rank" if rank is None else f"rank{rank}"


def rank_dir(dump_path: str, step: int, rank: Optional[int]) -> str:
    """``dump_path/step{N}/rank{R}``."""
    return os.path.join(dump_path, step_dir_name(step), rank_dir_name(rank))


def parse_step_dir(name: str) -> Optional[int]:
    m = _STEP.match(name)
    return int(m.group(1)) if m else None


def is_rank_dir(name: str) -> bool:
    return bool(_RANK.match(name))


def rank_number(name: str) -> Optional[int]:
    """``rank3`` -> 3; ``rank``/``proc1234``/"" -> None."""
    return int(name[4:]) if name.startswith("rank") and name[4:].isdigit() else None


def tensor_file_name(value_name: str) -> str:
    """The file of one recorded value (``KEY.input.0`` -> ``KEY.input.0.npy``), made safe: a key
    is user-controlled (custom API names, ``save(name)``), so no separators, no leading dots
    and bounded length: a file can never land outside ``dump_tensor_data``."""
    name = value_name + TENSOR_SUFFIX
    for sep in (os.sep, os.altsep or os.sep, "\0"):
        name = name.replace(sep, "_")
    name = name.lstrip(".") or "_"
    if len(name) > _MAX_NAME:
        name = f"{name[:_MAX_NAME - 20]}.{zlib.crc32(name.encode()):08x}{TENSOR_SUFFIX}"
    return name


@dataclass(frozen=True)
class DumpUnit:
    """One dump.json: the data of one step on one rank."""

    step: Optional[int]
    rank: str           # "rank0", "rank" (not distributed), "proc1234" (msprobe), or ""
    json_path: Path

    @property
    def dir(self) -> Path:
        return self.json_path.parent

    @property
    def label(self) -> str:
        step = "" if self.step is None else step_dir_name(self.step)
        return "/".join(p for p in (step, self.rank) if p) or self.json_path.parent.name


def unit_for(json_path: Path) -> DumpUnit:
    """Step and rank of a dump.json, read from the folders above it."""
    step, rank = None, ""
    for part in reversed(json_path.parent.parts[-3:]):
        if not rank and is_rank_dir(part):
            rank = part
        s = parse_step_dir(part)
        if s is not None and step is None:
            step = s
    return DumpUnit(step, rank, json_path)


def find_dumps(path: "os.PathLike | str") -> List[DumpUnit]:
    """Every dump.json under a dump root, a step folder, a rank folder, or the file itself,
    ordered by step then rank. A folder holding only journals names ``tsprobe recover``."""
    p = Path(path)
    if not p.exists():
        raise DumpFormatError(f"{p}: no such file or directory")
    if p.is_file():
        return [unit_for(p)]
    found: List[Path] = []
    level, visited = [p], []
    for _ in range(4):  # root / step / rank / dump.json, without walking tensor folders
        found = [d / DUMP_JSON for d in level if (d / DUMP_JSON).is_file()]
        if found:
            break
        visited += level
        level = sorted(c for d in level for c in _subdirs(d))
    if not found:
        journals = [d / JOURNAL for d in visited + level if (d / JOURNAL).is_file()]
        if journals:
            raise DumpFormatError(f"{journals[0].parent}: holds no {DUMP_JSON}, only the journal of an interrupted "
                                  f"run; rebuild it first (tsprobe recover {journals[0].parent})")
        raise DumpFormatError(f"{p}: holds no dump (expected step*/rank*/{DUMP_JSON} below it)")
    units = [unit_for(f) for f in found]
    return sorted(units, key=lambda u: (u.step if u.step is not None else -1, _rank_order(u.rank)))


def find_journal_dirs(path: "os.PathLike | str") -> List[str]:
    """Every folder under `path` holding a journal (rank folders of a run to recover)."""
    return [root for root, _, files in sorted(os.walk(path)) if JOURNAL in files]


def _subdirs(d: Path) -> List[Path]:
    try:
        return [c for c in d.iterdir() if c.is_dir() and c.name != TENSOR_DIR]
    except OSError:
        return []


def _rank_order(rank: str) -> Tuple[int, str]:
    digits = re.sub(r"\D", "", rank)
    return (int(digits) if digits else -1, rank)
