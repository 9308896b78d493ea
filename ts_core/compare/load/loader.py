"""Find and read dumps written by tsprobe or msprobe (``step*/rank*/dump.json`` layout).

Only data formats are read: JSON, ``.npy`` with ``allow_pickle=False`` and, for msprobe,
``.pt`` with ``torch.load(weights_only=True)``. Nothing else is ever unpickled. torch is
imported only when a ``.pt`` file is actually read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ...dumpfmt import (INPUT, DumpFormatError, OUTPUT, PARAMETER, TENSOR_DIR, DumpUnit, Entry, TensorFileError,
                       find_dumps, is_tensor_summary, parse_key, read_construct, read_header_and_data, read_json,
                       read_stacks, record_entries)
from .autograd_order import reorder

__all__ = ["Dump", "DumpUnit", "Call", "Entry", "find_dumps", "read_json", "record_to_call", "is_tensor_summary",
           "load_tensor_file", "pair_units", "INPUT", "OUTPUT", "PARAMETER"]


@dataclass
class Call:
    key: str
    direction: str
    kind: str        # api / module / parameters_grad / other
    index: int       # position in dump.json (execution order as written)
    entries: List[Entry] = field(default_factory=list)
    members: List["Call"] = field(default_factory=list)   # a merged group: the calls it stands for
    unplaced: bool = False   # an msprobe backward record whose input gradients could not be placed


def record_to_call(key: str, record: Any, index: int) -> Call:
    info = parse_key(key)
    return Call(key, info.direction, info.kind, index, record_entries(record, info.kind == "parameters_grad"))


# ---------------------------------------------------------------- one dump

class Dump:
    """A parsed dump.json with its stack.json and construct.json (both optional)."""

    def __init__(self, unit: DumpUnit):
        self.unit = unit
        self.path = unit.json_path
        self.dir = unit.json_path.parent
        header, self.data = read_header_and_data(str(self.path))
        if self.data and not any(isinstance(v, dict) for v in self.data.values()):
            raise DumpFormatError(f"{self.path}: not a dump (its \"data\" holds no record: each is an object of "
                                  f"input_args/output/... keyed by a call name such as Functional.linear.0.forward)")
        self.task: str = str(header.get("task") or "")
        self.level: str = str(header.get("level") or "")
        self.framework: str = str(header.get("framework") or "")
        self.data_dir: Optional[str] = header.get("dump_data_dir") if isinstance(header.get("dump_data_dir"), str) \
            else None
        self.incomplete = bool(header.get("incomplete"))
        order = reorder(self.path, unit.rank, self.framework, self.data)   # msprobe: backward grads in our order
        self.data, self.transposed, self.unplaced = order.data, order.transposed, order.unplaced
        self.msprobe = order.msprobe
        self._stack: Optional[Dict[str, List[str]]] = None
        self._construct: Optional[Dict[str, Any]] = None

    def calls(self) -> List[Call]:
        calls = [record_to_call(k, v, i) for i, (k, v) in enumerate(self.data.items())]
        for c in calls:
            c.unplaced = c.key in self.unplaced
        return calls

    @property
    def stacks(self) -> Dict[str, List[str]]:
        """key -> frames (msprobe's grouped form and the older {key: [frames]} are both read)."""
        if self._stack is None:
            self._stack = {k: frames for keys, frames in read_stacks(str(self.dir)) for k in keys}
        return self._stack

    @property
    def construct(self) -> Dict[str, Any]:
        if self._construct is None:
            self._construct = read_construct(str(self.dir))
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
        array = load_tensor_file(self.tensor_path(data_name))
        return array.T if data_name in self.transposed else array    # msprobe's weight^T gradient


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
