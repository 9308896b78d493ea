"""Call stacks for stack.json, cheap enough for every call.

A capture reads the raw stack in C (``native.frame_walker``: code addresses and lines, ~1 us)
and looks it up; only a stack not met before is walked in Python (no source reads, no
``inspect``), its tool and framework frames dropped, and its source lines read and formatted,
once for the whole run (ids restart in each dump folder, the text does not change). Without
the native library every capture is the Python walk. Works under ``python -c`` (the source line
is simply empty).
"""
from __future__ import annotations

import linecache
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import native
from ..dumpfmt.stack import format_frame

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TOOL_DIRS = tuple(os.path.join(_ROOT, pkg) + os.sep for pkg in ("ts_core", "ts_integrations"))


class StackRecorder:
    def __init__(self, skip_dirs: Sequence[str] = ()):
        self._skip_dirs = tuple(_TOOL_DIRS) + tuple(d.rstrip(os.sep) + os.sep for d in skip_dirs)
        # id(code) -> (code, left out?): holding the code object keeps its id from being reused,
        # and ints hash in no time (a code object's own hash is recomputed on every lookup)
        self._codes: Dict[int, Tuple[Any, bool]] = {}
        self._ids: Dict[Tuple, int] = {}           # this folder's stack ids
        self._keys: List[Tuple] = []               # stack id -> its key (the text is in _text)
        self._text: Dict[Tuple, List[str]] = {}    # formatted frames, kept across folders
        # raw native stack (every frame, tool ones included) -> its key below. A raw stack names
        # code objects by address: each one met was walked in Python once, which keeps its code
        # objects in _codes, so an address can never come to mean another code object.
        self._raw: Dict[bytes, Tuple] = {}
        self._native = native.frame_walker() if native.available() else None

    def capture(self) -> Tuple[int, Optional[List[str]]]:
        """(stack id, formatted frames if this stack is new else None)."""
        raw = self._native() if self._native is not None else None
        key = self._raw.get(raw) if raw is not None else None
        if key is None:
            key = self._walk(sys._getframe(0))      # (this frame is a tool one: left out)
            if raw is not None:
                self._raw[raw] = key
        sid = self._ids.get(key)
        if sid is not None:
            return sid, None
        sid = self._ids[key] = len(self._ids)
        self._keys.append(key)
        text = self._text.get(key)
        if text is None:
            text = self._text[key] = [self._format(self._codes[key[i]][0], key[i + 1]) for i in range(0, len(key), 2)]
        return sid, text

    def frames_of(self, sid: int) -> List[str]:
        """The formatted frames of stack `sid` (from the one text cache)."""
        return self._text[self._keys[sid]]

    def _walk(self, f: Any) -> Tuple:
        """(id(code), line, ...) of the user's frames from `f` outwards."""
        frames = []
        codes = self._codes
        while f is not None:
            code = f.f_code
            entry = codes.get(id(code))
            if entry is None:
                entry = codes[id(code)] = (code, code.co_filename.startswith(self._skip_dirs))
            if not entry[1]:
                frames.append(id(code))
                frames.append(f.f_lineno)
            f = f.f_back
        return tuple(frames)

    @staticmethod
    def _format(code: Any, line: int) -> str:
        return format_frame(code.co_filename, line, code.co_name, linecache.getline(code.co_filename, line).strip())

    def reset(self) -> None:
        """A new dump folder: stacks are numbered afresh."""
        self._ids.clear()
        self._keys.clear()
