"""Find and read dumps written by tsprobe or msprobe (``step*/rank*/dump.json`` layout).

Only data formats are read: JSON, ``.npy`` with ``allow_pickle=False`` and, for msprobe,
``.pt`` with ``torch.load(weights_only=True)``. Nothing else is ever unpickled. torch is
imported only when a ``.pt`` file is actually read.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .errors import DumpFormatError, TensorFileError
from .matching import parse_key

DUMP_JSON = "dump.json"
JOURNAL = "journal.jsonl"        # what a tsprobe run leaves when killed before stop()
TENSOR_DIR = "dump_tensor_data"
_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^(rank\d*|proc\d+)$")

INPUT, OUTPUT, PARAMETER = "input", "output", "parameter"


@dataclass(frozen=True)
class DumpUnit:
    """One dump.json: the data of one step on one rank."""

    step: Optional[int]
    rank: str           # "rank0", "rank" (not distributed), "proc1234" (msprobe), or ""
    json_path: Path

    @property
    def label(self) -> str:
        step = "" if self.step is None else f"step{self.step}"
        return "/".join(p for p in (step, self.rank) if p) or self.json_path.parent.name


def _unit_for(json_path: Path) -> DumpUnit:
    step, rank = None, ""
    for part in reversed(json_path.parent.parts[-3:]):
        if not rank and _RANK.match(part):
            rank = part
        m = _STEP.match(part)
        if m and step is None:
            step = int(m.group(1))
    return DumpUnit(step, rank, json_path)


def find_dumps(path: os.PathLike | str) -> List[DumpUnit]:
    """All dump.json files under a dump root, a step folder, a rank folder, or the file itself."""
    p = Path(path)
    if not p.exists():
        raise DumpFormatError(f"{p}: no such file or directory")
    if p.is_file():
        return [_unit_for(p)]
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
    units = [_unit_for(f) for f in found]
    return sorted(units, key=lambda u: (u.step if u.step is not None else -1, _rank_order(u.rank)))


def _subdirs(d: Path) -> List[Path]:
    try:
        return [c for c in d.iterdir() if c.is_dir() and c.name != TENSOR_DIR]
    except OSError:
        return []


def _rank_order(rank: str) -> Tuple[int, str]:
    digits = re.sub(r"\D", "", rank)
    return (int(digits) if digits else -1, rank)


def read_json(path: Path) -> Any:
    """Parse a JSON file; any failure becomes one DumpFormatError naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DumpFormatError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DumpFormatError(f"{path}: cannot be read ({e})") from None
    if not text.strip():
        raise DumpFormatError(f"{path}: file is empty (the run may have stopped before it was written)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DumpFormatError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} ({e.msg}); "
                              f"the file may be truncated") from None


# ---------------------------------------------------------------- records -> calls

@dataclass
class Entry:
    """One recorded value of a call: a tensor summary, a non-tensor value, or None."""

    role: str        # input / output / parameter
    arg: str         # "input.0", "input.eps", "output.0", "parameters.weight", "weight"
    leaf: Any        # summary dict, {"type","value"} dict, or None

    @property
    def is_tensor(self) -> bool:
        return is_tensor_summary(self.leaf)


@dataclass
class Call:
    key: str
    direction: str
    kind: str        # api / module / parameters_grad / other
    index: int       # position in dump.json (execution order as written)
    entries: List[Entry] = field(default_factory=list)


def is_tensor_summary(v: Any) -> bool:
    return isinstance(v, dict) and isinstance(v.get("type"), str) and "shape" in v and "dtype" in v \
        and "value" not in v


def _is_leaf(v: Any) -> bool:
    return v is None or not isinstance(v, (dict, list)) or \
        (isinstance(v, dict) and isinstance(v.get("type"), str))


def _flatten(value: Any, prefix: str) -> Iterator[Tuple[str, Any]]:
    if _is_leaf(value):
        if value is not None and not isinstance(value, dict):
            value = {"type": type(value).__name__, "value": value}
        yield prefix, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}.{k}")
    else:
        for i, v in enumerate(value):
            yield from _flatten(v, f"{prefix}.{i}")


_SECTIONS = {  # record field -> (role, name used in tensor names, as msprobe's data_name does)
    "input_args": (INPUT, "input"), "input_kwargs": (INPUT, "input"), "input": (INPUT, "input"),
    "output": (OUTPUT, "output"), "parameters": (PARAMETER, "parameters"),
}


def record_to_call(key: str, record: Any, index: int) -> Call:
    info = parse_key(key)
    call = Call(key, info.direction, info.kind, index)
    if not isinstance(record, dict):
        return call
    if info.kind == "parameters_grad":
        for name, v in record.items():
            if isinstance(v, list) and len(v) == 1:  # msprobe writes {"weight": [summary]}
                v = v[0]
            call.entries.extend(Entry(OUTPUT, a, leaf) for a, leaf in _flatten(v, name))
        return call
    for section, v in record.items():
        role, name = _SECTIONS.get(section, (None, section))
        if role is None:
            low = section.lower()
            role = OUTPUT if "output" in low else PARAMETER if "param" in low else INPUT
        call.entries.extend(Entry(role, a, leaf) for a, leaf in _flatten(v, name))
    return call


# ---------------------------------------------------------------- one dump

class Dump:
    """A parsed dump.json with its stack.json and construct.json (both optional)."""

    def __init__(self, unit: DumpUnit):
        self.unit = unit
        self.path = unit.json_path
        self.dir = unit.json_path.parent
        doc = read_json(self.path)
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
            raise DumpFormatError(f"{self.path}: not a dump.json (no \"data\" object mapping keys to records)")
        self.task: str = str(doc.get("task") or "")
        self.level: str = str(doc.get("level") or "")
        self.framework: str = str(doc.get("framework") or "")
        self.data_dir: Optional[str] = doc.get("dump_data_dir") if isinstance(doc.get("dump_data_dir"), str) else None
        self.data: Dict[str, Any] = doc["data"]
        self.incomplete = bool(doc.get("incomplete"))
        self._stack: Optional[Dict[str, List[str]]] = None
        self._construct: Optional[Dict[str, Any]] = None

    def calls(self) -> List[Call]:
        return [record_to_call(k, v, i) for i, (k, v) in enumerate(self.data.items())]

    @property
    def stacks(self) -> Dict[str, List[str]]:
        """key -> frames. Accepts msprobe's grouped form {"0": [[keys], [frames]]} and {key: [frames]}."""
        if self._stack is None:
            self._stack = {}
            p = self.dir / "stack.json"
            raw = read_json(p) if p.is_file() else {}
            if isinstance(raw, dict):
                for k, v in raw.items():
                    if isinstance(v, list) and len(v) == 2 and isinstance(v[0], list) and isinstance(v[1], list):
                        for key in v[0]:
                            self._stack[str(key)] = [str(f) for f in v[1]]
                    elif isinstance(v, list):
                        self._stack[k] = [str(f) for f in v]
        return self._stack

    @property
    def construct(self) -> Dict[str, Any]:
        if self._construct is None:
            p = self.dir / "construct.json"
            raw = read_json(p) if p.is_file() else {}
            self._construct = raw if isinstance(raw, dict) else {}
        return self._construct

    def tensor_path(self, data_name: str) -> Path:
        name = os.path.basename(str(data_name))  # a data_name never leaves the tensor folder
        candidates = [self.dir / TENSOR_DIR / name]
        if self.data_dir:
            candidates.append(Path(self.data_dir) / name)
        for c in candidates:
            if c.is_file():
                return c
        raise TensorFileError(f"tensor file missing: {candidates[0]}")

    def load_tensor(self, data_name: str) -> np.ndarray:
        return load_tensor_file(self.tensor_path(data_name))


def load_tensor_file(path: Path) -> np.ndarray:
    """Load a .npy (memory-mapped, never pickled) or an msprobe .pt (weights_only) as numpy."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            try:
                return np.load(path, mmap_mode="r", allow_pickle=False)
            except ValueError as e:
                if "object" in str(e).lower() or "pickle" in str(e).lower():
                    raise TensorFileError(f"{path}: holds Python objects; refusing to unpickle") from None
                raise
        if suffix == ".pt":
            return _load_pt(path)
    except TensorFileError:
        raise
    except Exception as e:  # truncated/corrupt files: the row says so, the rest goes on
        raise TensorFileError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    raise TensorFileError(f"{path}: unsupported tensor file type {suffix!r} (expected .npy or .pt)")


def _load_pt(path: Path) -> np.ndarray:
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


def pair_units(golden: List[DumpUnit], target: List[DumpUnit]) -> Tuple[List[Tuple[DumpUnit, DumpUnit]],
                                                                         List[DumpUnit], List[DumpUnit]]:
    """Pair step/rank units. A lone step or rank on each side pairs even if named differently
    (msprobe names rank folders after the process id)."""
    def steps(units):
        out: Dict[Optional[int], List[DumpUnit]] = {}
        for u in units:
            out.setdefault(u.step, []).append(u)
        return out

    gs, ts = steps(golden), steps(target)
    step_pairs = [(s, s) for s in gs if s in ts]
    if not step_pairs and len(gs) == 1 and len(ts) == 1:
        step_pairs = [(next(iter(gs)), next(iter(ts)))]
    pairs, used_g, used_t = [], set(), set()
    for sg, st in step_pairs:
        gr, tr = gs[sg], ts[st]
        tmap = {u.rank: u for u in tr}
        if all(u.rank in tmap for u in gr) or not (len(gr) == 1 and len(tr) == 1):
            matched = [(u, tmap[u.rank]) for u in gr if u.rank in tmap]
        else:
            matched = [(gr[0], tr[0])]
        for g, t in matched:
            pairs.append((g, t)); used_g.add(g); used_t.add(t)
    return (pairs, [u for u in golden if u not in used_g], [u for u in target if u not in used_t])
