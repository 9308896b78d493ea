"""Append-only journal of records: one JSON object per line.

A crash (even kill -9) can only tear the last line, which ``read_journal`` drops; every earlier
line is a complete record. ``stop()``/``step()`` rebuild dump.json from memory; ``recover``
rebuilds it from this file when the process died first.

The file is created by the first flush that has lines the rank's JSON files do not hold yet
(``covered``): a step shorter than the flush interval (0.5 s) writes its records only once, into
dump.json, and creates no journal at all (a file created and removed each step was ~0.4 ms of
CPU here). A crash loses the same as before: lines not yet flushed. Once created, the file
holds every line of the step folder, from its header on.

Entries are kept as they come (kind, key, value: three list appends, no new object) and
formatted as lines only by a flush that writes them: most steps never format one (~3 lines a
record, ~0.4 us each, ~1 ms a GPT-2 L1 step).
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterator, List, Optional

from ..dumpfmt.jsonio import json_string

_FRAMES_JSON: dict = {}


def _frames_json(frames: List[str]) -> str:
    """A stack's frames as JSON, encoded once per distinct stack (the recorder reuses the list)."""
    text = _FRAMES_JSON.get(id(frames))
    if text is None or text[0] is not frames:
        text = _FRAMES_JSON[id(frames)] = (frames, json.dumps(frames))
    return text[1]


_DATA, _STACK, _STACKDEF, _CONSTRUCT, _TEXT = range(5)


def _line(kind: int, key: Any, value: Any) -> str:
    """The journal line of one entry (``read_journal`` and ``recover`` read them back)."""
    if kind == _DATA:       # a record that is JSON text already (encoded once for journal and dump.json)
        return f'{{"t":"data","k":{json_string(key)},"v":{value}}}'
    if kind == _STACK:      # `key` was called from stack `value`
        return f'{{"t":"stack","k":{json_string(key)},"v":{int(value)}}}'
    if kind == _STACKDEF:
        return f'{{"t":"stackdef","k":{int(key)},"v":{_frames_json(value)}}}'
    if kind == _CONSTRUCT:
        p = "null" if value is None else json_string(value)
        return f'{{"t":"construct","k":{json_string(key)},"v":{p}}}'
    return value            # _TEXT: a line encoded when appended


class Journal:
    def __init__(self, path: str):
        self.path = path
        self._fd = -1               # the file is created by the first flush that needs it
        # the entries not yet written, as three parallel lists (kind, key, value)
        self._kinds: List[int] = []
        self._keys: List[Any] = []
        self._values: List[Any] = []
        self._covered = 0           # entries at the head that the JSON files already hold

    @property
    def created(self) -> bool:
        return self._fd >= 0

    def _add(self, kind: int, key: Any, value: Any) -> None:
        self._kinds.append(kind)
        self._keys.append(key)
        self._values.append(value)

    def append(self, entry: dict) -> None:
        self._add(_TEXT, None, json.dumps(entry, separators=(",", ":")))

    def append_record(self, key: str, record_json: str) -> None:
        """A data entry whose record is JSON text already."""
        self._add(_DATA, key, record_json)

    def append_stack(self, key: str, stack_id: int) -> None:
        """`key` was called from stack `stack_id` (one line per recorded call: no dict encoding)."""
        self._add(_STACK, key, stack_id)

    def append_stackdef(self, stack_id: int, frames: List[str]) -> None:
        self._add(_STACKDEF, stack_id, frames)

    def append_construct(self, key: str, parent: Optional[str]) -> None:
        self._add(_CONSTRUCT, key, parent)

    @property
    def unflushed(self) -> bool:
        """Lines neither handed to the OS nor held by the rank's JSON files."""
        return len(self._kinds) > self._covered

    def covered(self) -> None:
        """The rank's JSON files were just written from memory: what is buffered is on disk
        there. Before the file exists those lines are kept, not written: they go into it with
        the first line that is not covered (the file then holds the whole step)."""
        if self._fd >= 0:
            self.flush()
        else:
            self._covered = len(self._kinds)

    def flush(self) -> None:
        """One write() per flush: the OS has the bytes even if the process is killed next."""
        n = len(self._kinds)           # entries appended meanwhile stay for the next flush
        if n <= self._covered:
            return
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._covered = 0
        lines = list(map(_line, self._kinds[:n], self._keys[:n], self._values[:n]))
        del self._kinds[:n], self._keys[:n], self._values[:n]
        view = memoryview(("\n".join(lines) + "\n").encode("utf-8"))
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def close(self) -> None:
        """Flush what the JSON files do not hold (creating the file only then), close it."""
        try:
            self.flush()
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

def read_journal(path: str) -> Iterator[dict]:
    """Every complete entry; a torn or corrupt line (the crash point) is skipped."""
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                yield entry
