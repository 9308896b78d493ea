"""Call stacks for stack.json, cheap enough for every call.

A capture walks raw frames (no source reads, no ``inspect``), drops tool and framework frames,
and looks the result up in a cache; source lines are read once per distinct stack. Works under
``python -c`` (the source line is simply empty).
"""
from __future__ import annotations

import linecache
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TOOL_DIRS = tuple(os.path.join(_ROOT, pkg) + os.sep for pkg in ("ts_core", "ts_integrations"))


class StackRecorder:
    def __init__(self, skip_dirs: Sequence[str] = ()):
        self._skip_dirs = tuple(_TOOL_DIRS) + tuple(d.rstrip(os.sep) + os.sep for d in skip_dirs)
        self._skip: Dict[str, bool] = {}
        self._ids: Dict[Tuple, int] = {}

    def capture(self) -> Tuple[int, Optional[List[str]]]:
        """(stack id, formatted frames if this stack is new else None)."""
        frames = []
        skip = self._skip
        f = sys._getframe(1)
        while f is not None:
            code = f.f_code
            name = code.co_filename
            s = skip.get(name)
            if s is None:
                s = skip[name] = name.startswith(self._skip_dirs)
            if not s:
                frames.append((name, f.f_lineno, code.co_name))
            f = f.f_back
        key = tuple(frames)
        sid = self._ids.get(key)
        if sid is not None:
            return sid, None
        sid = self._ids[key] = len(self._ids)
        return sid, [f"File {fn}, line {ln}, in {func}, \n {linecache.getline(fn, ln).strip()}"
                     for fn, ln, func in frames]

    def reset(self) -> None:
        """A new dump folder: stacks are numbered afresh."""
        self._ids.clear()
