"""The text of one stack frame in stack.json, written by the recorder and read by the tools.

msprobe's spelling, kept byte for byte: ``File {file}, line {line}, in {func}, \\n {code}``.
The recorder writes it (``format_frame``), compare, acc-check and ``tsprobe summary`` read it
(``parse_frame``, ``one_line``, ``user_frame``): one module, so the two cannot drift apart."""
from __future__ import annotations

import re
from typing import List, NamedTuple, Optional

_FRAME = re.compile(r"File (?P<file>.+?), line (?P<line>\d+), in (?P<func>.+?),\s*(?P<code>.*)", re.S)
# Frames that never are "the user's line": the frameworks, the dump tools, the standard library.
# Model code in site-packages (transformers, ...) does count: it is where the op was called.
_LIBRARY = re.compile(r"[/\\](torch|mindspore|msprobe|ts_core|ts_integrations)[/\\]|<frozen|"
                      r"[/\\]lib[/\\]python3\.\d+[/\\](?!site-packages|dist-packages)")


class Frame(NamedTuple):
    file: str
    line: int
    func: str
    code: str


def format_frame(file: str, line: int, func: str, code: str) -> str:
    """One frame as stack.json holds it (``code``: the source line, stripped)."""
    return f"File {file}, line {line}, in {func}, \n {code}"


def parse_frame(text: str) -> Optional[Frame]:
    """The parts of a frame written by ``format_frame`` (or msprobe); None for other text."""
    m = _FRAME.match(text.strip())
    if m is None:
        return None
    return Frame(m.group("file"), int(m.group("line")), m.group("func"), m.group("code").strip())


def one_line(text: str) -> str:
    """A frame on one line: ``File F, line L, in FUNC: CODE``."""
    return text.replace(", \n ", ": ").strip()


def _short(text: str, frame: Optional[Frame]) -> str:
    return f"{frame.file}:{frame.line} in {frame.func}: {frame.code}" if frame else text.strip()


def user_frame(frames: List[str]) -> Optional[str]:
    """The innermost frame outside torch/mindspore, msprobe, tsprobe and the standard library,
    as 'file:line in func: code'."""
    if not frames:
        return None
    ordered = list(frames)
    if "in <module>" in ordered[0] and "in <module>" not in ordered[-1]:
        ordered.reverse()  # written outermost first
    parsed = [(f, parse_frame(f)) for f in ordered]
    for f, frame in parsed:
        if not _LIBRARY.search(frame.file if frame else f):
            return _short(f, frame)
    return _short(*parsed[-1])
