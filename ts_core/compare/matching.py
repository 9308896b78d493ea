"""Key parsing and order-preserving alignment of two call sequences.

Keys carry a per-name call counter (``Functional.linear.3.forward``,
``Module.fc.Linear.forward.0``). One extra ``reshape`` shifts every later reshape
counter, so calls are aligned on their *normalised* names (counter removed) with a
diff, not paired by exact key. ``normalise`` is a plain function so a cross-framework
mapping (``Cell.fc.Dense`` <-> ``Module.fc.Linear``) can replace it later.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Callable, List, Optional, Sequence, Tuple

FORWARD, BACKWARD, OTHER = "forward", "backward", "other"

_API = re.compile(r"^(?P<name>.+)\.(?P<n>\d+)\.(?P<dir>forward|backward)$")
_MODULE = re.compile(r"^(?P<name>.+)\.(?P<dir>forward|backward|parameters_grad)\.(?P<n>\d+)$")

Pair = Tuple[Optional[int], Optional[int]]


@dataclass(frozen=True)
class KeyInfo:
    key: str
    name: str            # call name without counter: "Functional.linear", "Module.fc.Linear"
    direction: str       # forward / backward / other
    counter: Optional[int]
    kind: str            # "api", "module", "parameters_grad" or "other"


def parse_key(key: str) -> KeyInfo:
    m = _MODULE.match(key)
    if m:
        d = m.group("dir")
        kind = "parameters_grad" if d == "parameters_grad" else "module"
        return KeyInfo(key, m.group("name"), BACKWARD if d != FORWARD else FORWARD, int(m.group("n")), kind)
    m = _API.match(key)
    if m:
        return KeyInfo(key, m.group("name"), m.group("dir"), int(m.group("n")), "api")
    return KeyInfo(key, key, OTHER, None, "other")


def default_normalise(key: str) -> str:
    """Name a call independently of how often it ran before: counter removed, kind kept."""
    info = parse_key(key)
    return f"{info.name}.{info.kind}.{info.direction}"


def forward_key(key: str) -> str:
    """The forward key of a backward/parameters_grad key (its stack lives there)."""
    m = _MODULE.match(key)
    if m:
        return f"{m.group('name')}.forward.{m.group('n')}"
    m = _API.match(key)
    if m:
        return f"{m.group('name')}.{m.group('n')}.forward"
    return key


# Above this many (golden x target) comparisons the diff is split on rare names first.
_DIRECT_LIMIT = 4_000_000
_RARE = 4


def align(golden: Sequence[str], target: Sequence[str],
          normalise: Callable[[str], str] = default_normalise) -> List[Pair]:
    """Pair two key sequences, preserving order; unpaired keys get ``None`` as partner.

    Identical name sequences pair one to one. Otherwise a diff over normalised names
    keeps the calls around an extra or missing one matched; every input index appears
    exactly once in the result.
    """
    a = [normalise(k) for k in golden]
    b = [normalise(k) for k in target]
    if a == b:
        return [(i, i) for i in range(len(a))]
    out: List[Pair] = []
    _align(a, b, 0, len(a), 0, len(b), out)
    return out


def _align(a, b, alo, ahi, blo, bhi, out: List[Pair]) -> None:
    # common prefix/suffix are cheap and cover the usual "one extra call" case
    while alo < ahi and blo < bhi and a[alo] == b[blo]:
        out.append((alo, blo)); alo += 1; blo += 1
    tail = []
    while alo < ahi and blo < bhi and a[ahi - 1] == b[bhi - 1]:
        ahi -= 1; bhi -= 1; tail.append((ahi, bhi))
    if (ahi - alo) * (bhi - blo) <= _DIRECT_LIMIT or not _split_on_rare(a, b, alo, ahi, blo, bhi, out):
        _diff(a, b, alo, ahi, blo, bhi, out)
    out.extend(reversed(tail))


def _diff(a, b, alo, ahi, blo, bhi, out: List[Pair]) -> None:
    sm = SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out.extend((alo + i, blo + j) for i, j in zip(range(i1, i2), range(j1, j2)))
        else:
            out.extend((alo + i, None) for i in range(i1, i2))
            out.extend((None, blo + j) for j in range(j1, j2))


def _split_on_rare(a, b, alo, ahi, blo, bhi, out: List[Pair]) -> bool:
    """Patience-style: align names that are rare on both sides, then fill the gaps."""
    ca, cb = Counter(a[alo:ahi]), Counter(b[blo:bhi])
    ra = [i for i in range(alo, ahi) if ca[a[i]] <= _RARE and 0 < cb[a[i]] <= _RARE]
    rb = [j for j in range(blo, bhi) if cb[b[j]] <= _RARE and 0 < ca[b[j]] <= _RARE]
    if not ra or not rb:
        return False
    sm = SequenceMatcher(None, [a[i] for i in ra], [b[j] for j in rb], autojunk=False)
    anchors = [(ra[i + k], rb[j + k]) for i, j, n in sm.get_matching_blocks() for k in range(n)]
    if not anchors:
        return False
    pi, pj = alo, blo
    for i, j in anchors:
        _align(a, b, pi, i, pj, j, out)
        out.append((i, j))
        pi, pj = i + 1, j + 1
    _align(a, b, pi, ahi, pj, bhi, out)
    return True
