"""Append-only journal of records: one JSON object per line.

A crash (even kill -9) can only tear the last line, which ``read_journal`` drops; every earlier
line is a complete record. ``stop()``/``step()`` rebuild dump.json from memory; ``recover``
rebuilds it from this file when the process died first.
"""
from __future__ import annotations

import json
import os
from typing import Iterator, List, Optional

from ..dumpfmt.jsonio import json_string

_FRAMES_JSON: dict = {}


def _frames_json(frames: List[str]) -> str:
    """A stack's frames as JSON, encoded once per distinct stack (the recorder reuses the list)."""
    text = _FRAMES_JSON.get(id(frames))
    if text is None or text[0] is not frames:
        text = _FRAMES_JSON[id(frames)] = (frames, json.dumps(frames))
    return text[1]


class Journal:
    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._buf: List[str] = []

    def append(self, entry: dict) -> None:
        self._buf.append(json.dumps(entry, separators=(",", ":")))

    def append_record(self, key: str, record_json: str) -> None:
        """A data entry whose record is JSON text already (encoded once for journal and dump.json)."""
        self._buf.append(f'{{"t":"data","k":{json_string(key)},"v":{record_json}}}')

    def append_stack(self, key: str, stack_id: int) -> None:
        """`key` was called from stack `stack_id` (one line per recorded call: no dict encoding)."""
        self._buf.append(f'{{"t":"stack","k":{json_string(key)},"v":{int(stack_id)}}}')

    def append_stackdef(self, stack_id: int, frames: List[str]) -> None:
        self._buf.append(f'{{"t":"stackdef","k":{int(stack_id)},"v":{_frames_json(frames)}}}')

    def append_construct(self, key: str, parent: Optional[str]) -> None:
        p = "null" if parent is None else json_string(parent)
        self._buf.append(f'{{"t":"construct","k":{json_string(key)},"v":{p}}}')

    @property
    def unflushed(self) -> bool:
        return bool(self._buf)

    def flush(self) -> None:
        """One write() per flush: the OS has the bytes even if the process is killed next."""
        n = len(self._buf)             # lines appended meanwhile stay for the next flush
        if not n:
            return
        data = ("\n".join(self._buf[:n]) + "\n").encode("utf-8")
        del self._buf[:n]
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.flush()
            finally:
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
