"""Find and read dumps written by tsprobe or msprobe (``step*/rank*/dump.json`` layout).

Only data formats are read: JSON, ``.npy`` with ``allow_pickle=False`` and, for msprobe,
``.pt`` with ``torch.load(weights_only=True)``. Nothing else is ever unpickled. torch is
imported only when a ``.pt`` file is actually read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ...dumpfmt import (INPUT, JOURNAL, DumpFormatError, OUTPUT, PARAMETER, DumpUnit, Entry,
                       find_dumps, is_tensor_summary, parse_key, read_construct, read_header_and_data, read_json,
                       read_stacks, record_entries)
from ...dumpfmt.tensor_store import TensorStore, load_tensor_file, open_tensors
from .autograd_order import reorder
from .wrappers import unwrap_keys

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
        header, self.data = read_readable(self.path)
        if self.data and not any(isinstance(v, dict) for v in self.data.values()):
            raise DumpFormatError(f"{self.path}: not a dump (its \"data\" holds no record: each is an object of "
                                  f"input_args/output/... keyed by a call name such as Functional.linear.0.forward)")
        self.task: str = str(header.get("task") or "")
        self.level: str = str(header.get("level") or "")
        self.framework: str = str(header.get("framework") or "")
        self.data_dir: Optional[str] = header.get("dump_data_dir") if isinstance(header.get("dump_data_dir"), str) \
            else None
        self.incomplete = bool(header.get("incomplete"))
        # what the dumping tool said the dump cannot hold (a model compiled as a whole)
        self.notes: List[str] = [str(n) for n in header.get("notes") or [] if n]
        order = reorder(self.path, unit.rank, self.framework, self.data)   # msprobe: backward grads in our order
        self.data, self.transposed, self.unplaced = order.data, order.transposed, order.unplaced
        self.msprobe = order.msprobe
        self.data, self._renamed = unwrap_keys(self.data)    # FSDP1/checkpoint/compile wrappers' names
        renamed = self._renamed
        self.unplaced = {renamed.get(k, k) for k in self.unplaced}
        order.inner = {renamed.get(k, k): why for k, why in order.inner.items()}
        order.keyword_modules = [renamed.get(k, k) for k in order.keyword_modules]
        self.conventions = order         # msprobe's recording conventions found (msprobe_conventions.py)
        self._stack: Optional[Dict[str, List[str]]] = None
        self._construct: Optional[Dict[str, Any]] = None
        self._tensors: Optional[TensorStore] = None

    def calls(self) -> List[Call]:
        calls = [record_to_call(k, v, i) for i, (k, v) in enumerate(self.data.items())]
        for c in calls:
            c.unplaced = c.key in self.unplaced
        return calls

    @property
    def stacks(self) -> Dict[str, List[str]]:
        """key -> frames (msprobe's grouped form and the older {key: [frames]} are both read)."""
        if self._stack is None:
            self._stack = {self._renamed.get(k, k): frames for keys, frames in read_stacks(str(self.dir))
                           for k in keys}
        return self._stack

    @property
    def construct(self) -> Dict[str, Any]:
        if self._construct is None:
            self._construct = _renamed_construct(read_construct(str(self.dir)), self._renamed)
        return self._construct

    @property
    def tensors(self) -> TensorStore:
        """Where this dump's tensor files are read, whatever the layout (folder or pack)."""
        if self._tensors is None:
            self._tensors = open_tensors(self.dir, self.data_dir)
        return self._tensors

    def locate(self, data_name: str) -> Optional[Tuple[str, int]]:
        """(file, offset of the .npy bytes) of a tensor whose array is the file's own; None for
        msprobe's transposed gradients and for what the store cannot place."""
        return None if data_name in self.transposed else self.tensors.locate(data_name)

    def load_tensor(self, data_name: str) -> np.ndarray:
        array = self.tensors.load(data_name)
        _BYTES_READ[0] += array.nbytes
        return array.T if data_name in self.transposed else array    # msprobe's weight^T gradient


def _renamed_construct(construct: Dict[str, Any], renamed: Dict[str, str]) -> Dict[str, Any]:
    """construct.json under the keys ``unwrap_keys`` gave; a dropped record's children get its parent."""
    if not renamed:
        return construct

    def parent(key: Any) -> Any:
        for _ in range(64):                 # a chain of dropped wrappers, never a cycle
            if key is None or renamed.get(key, key):
                break
            key = construct.get(key)
        return renamed.get(key, key) if key is not None else None
    return {renamed.get(k, k): parent(v) for k, v in construct.items() if renamed.get(k, k)}


def read_readable(path: Path) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """dump.json's header and records; a file that cannot be parsed raises a DumpFormatError that
    also says what to do: ``tsprobe recover`` when the run's journal is beside it, else dump again."""
    try:
        return read_header_and_data(str(path))
    except DumpFormatError as e:
        if "truncated" not in str(e) and "is empty" not in str(e):
            raise                 # another kind of file, not a dump cut short
        folder = path.parent
        if (folder / JOURNAL).is_file():
            hint = f"rebuild it from the journal beside it: tsprobe recover {folder}"
        else:
            hint = "no journal beside it to rebuild it from (tsprobe recover needs one): dump that step again"
        raise DumpFormatError(f"{e}; {hint}") from None


_BYTES_READ = [0]      # tensor bytes this process loaded (the statistics-first saving, executor.py)


def tensor_bytes_read() -> int:
    return _BYTES_READ[0]


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
