"""Diff-only dump (msprobe's ``bench_path`` + ``diff_nums``): statistics and CRCs for every
record, tensor files only for the records that introduce a difference against a bench dump.

A record *introduces* a difference when every tensor it consumes (inputs, keyword inputs,
the module's parameters; for a backward record the gradients it receives, and its forward
must have consumed the bench's tensors too) has the bench's checksum and shape, and at least
one tensor it produces has the bench's shape but not its checksum: the call itself changed
the bits (a non-deterministic kernel, a different algorithm). Records downstream of it consume changed tensors and do not count, so
``diff_nums: N`` saves the first N independent sources of a difference, not their echoes.

msprobe's rule, widened: msprobe compares positional tensor inputs of forward records only;
here keyword inputs, parameters and backward records count too. The bench is the
``step{N}/rank{R}`` folder of ``bench_path`` with the step and rank being recorded.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional, Tuple

from ..dumpfmt import (BACKWARD, DUMP_JSON, FORWARD, INPUT, OUTPUT, DumpFormatError, checksum_kind, is_rank_dir,
                       parse_key, rank_dir, read_header_and_data, record_entries, step_dir_name, without_direction)

Held = List[Tuple[dict, str, Any]]      # (summary, value name, tensor or snapshot)
_Tensors = Dict[str, Tuple[str, dict]]  # value name ("input.0") -> (role, summary)


def _tensors(record: Any) -> _Tensors:
    return {e.arg: (e.role, e.leaf) for e in record_entries(record) if e.is_tensor}


def _same(cur: dict, ref: dict) -> bool:
    return cur.get("md5") is not None and cur.get("md5") == ref.get("md5") \
        and list(cur.get("shape") or []) == list(ref.get("shape") or [])


def bench_folder(bench_path: str, step: int, rank: Optional[int]) -> Optional[str]:
    """The bench's folder for `step` and `rank`: ``step{N}/rank{R}``; a run that was not
    distributed may be named ``rank`` or (msprobe) ``proc{PID}``."""
    exact = rank_dir(bench_path, step, rank)
    if os.path.isfile(os.path.join(exact, DUMP_JSON)):
        return exact
    if rank is None:
        step_dir = os.path.join(bench_path, step_dir_name(step))
        try:
            names = [n for n in sorted(os.listdir(step_dir)) if is_rank_dir(n)
                     and os.path.isfile(os.path.join(step_dir, n, DUMP_JSON))]
        except OSError:
            names = []
        if len(names) == 1:
            return os.path.join(step_dir, names[0])
    return None


class DiffDump:
    """Per step: the bench's records, and which of this run's records get their tensors saved."""

    def __init__(self, bench_path: str, diff_nums: int, checksum: str):
        self.bench_path = bench_path
        self.limit = diff_nums                   # -1: no limit
        self.kind = "crc32" if checksum == "md5" else checksum
        self.found: List[str] = []               # keys whose tensors were saved, over the whole run
        self._bench: Dict[str, Any] = {}
        self._held: Dict[str, Held] = {}         # forward key -> snapshots of inputs that matched
        self._clean: set = set()                 # calls whose forward consumed the bench's tensors
        self._warned: set = set()

    # -- steps ------------------------------------------------------------------------------
    def open_step(self, step: int, rank: Optional[int]) -> None:
        self._bench, self._held, self._clean = {}, {}, set()
        folder = bench_folder(self.bench_path, step, rank)
        if folder is None:
            self._warn("missing", f"no bench dump for step {step} at {rank_dir(self.bench_path, step, rank)}: "
                                  "no tensors are saved for this step (statistics and CRCs are)")
            return
        try:
            _, data = read_header_and_data(folder)
        except DumpFormatError as exc:
            self._warn("unreadable", f"bench dump unreadable ({exc}): no tensors are saved for this step")
            return
        kind = next((checksum_kind(s.get("md5")) for rec in data.values() for _, s in _tensors(rec).values()
                     if s.get("md5") is not None), None)
        if kind != self.kind:
            self._warn("kind", f"the bench dump in {folder} holds no {self.kind} checksums "
                               f"(found {kind or 'none'}): make the bench with the same summary_mode")
            return
        self._bench = data

    @property
    def searching(self) -> bool:
        """Does a record still stand a chance of having its tensors saved?"""
        return bool(self._bench) and (self.limit == -1 or len(self.found) < self.limit)

    # -- forward: inputs first, the decision when the outputs are known ---------------------
    def inputs_match(self, key: str, record: dict) -> bool:
        """Every tensor input recorded so far (before the call ran) has the bench's checksum."""
        ref = self._bench.get(key)
        if ref is None:
            return False
        cur, want = _tensors(record), _tensors(ref)
        ins = {a: s for a, (role, s) in want.items() if role == INPUT}
        return set(cur) == set(ins) and all(_same(cur[a][1], ins[a]) for a in cur)

    def hold(self, key: str, held: Held) -> None:
        self._held[key] = held

    def take_held(self, key: str) -> Optional[Held]:
        return self._held.pop(key, None)

    def introduces(self, key: str, record: dict) -> bool:
        """The record consumed exactly the bench's tensors and produced a different one. A
        backward record also needs its forward to have consumed the bench's tensors (a backward
        reads the forward's saved inputs, not only the gradients it receives)."""
        ref = self._bench.get(key)
        if ref is None:
            return False
        name, direction = without_direction(key), parse_key(key).direction
        if direction == BACKWARD and name not in self._clean:
            return False
        cur, want = _tensors(record), _tensors(ref)
        cur_in = {a: s for a, (role, s) in cur.items() if role != OUTPUT}
        want_in = {a: s for a, (role, s) in want.items() if role != OUTPUT}
        if set(cur_in) != set(want_in) or not all(_same(cur_in[a], want_in[a]) for a in cur_in):
            return False
        if direction == FORWARD:
            self._clean.add(name)
        for a, (role, s) in cur.items():
            if role != OUTPUT or a not in want:
                continue
            r = want[a][1]
            if list(s.get("shape") or []) == list(r.get("shape") or []) and s.get("md5") is not None \
                    and r.get("md5") is not None and s["md5"] != r["md5"]:
                return True
        return False

    def saved(self, key: str) -> None:
        self.found.append(key)

    def _warn(self, tag: str, message: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            warnings.warn(f"tsprobe: diff-only dump: {message}", RuntimeWarning, stacklevel=4)
