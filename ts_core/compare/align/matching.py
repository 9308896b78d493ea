"""Key parsing and order-preserving alignment of two call sequences.

Keys carry a per-name call counter (``Functional.linear.3.forward``,
``Module.fc.Linear.forward.0``). One extra ``reshape`` shifts every later reshape
counter, so calls are aligned on their *normalised* names (counter removed) with a
diff, not paired by exact key. ``normalise`` is a plain function so a cross-framework
mapping (``Cell.fc.Dense`` <-> ``Module.fc.Linear``) can replace it later.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Callable, List, Optional, Sequence, Tuple

from ...dumpfmt import BACKWARD, FORWARD, OTHER, KeyInfo, forward_key, parse_key

Pair = Tuple[Optional[int], Optional[int]]
__all__ = ["align", "default_normalise", "parse_key", "forward_key", "KeyInfo", "FORWARD", "BACKWARD", "OTHER"]


def default_normalise(key: str) -> str:
    """Name a call independently of how often it ran before: counter removed, kind kept."""
    info = parse_key(key)
    return f"{info.name}.{info.kind}.{info.direction}"


# Above this many (golden x target) comparisons a plain diff gets slow (it is quadratic on
# sequences where a few API names repeat thousands of times); split the work on anchors first.
_DIRECT_LIMIT = 1_000_000


def align(golden: Sequence[str], target: Sequence[str],
          normalise: Callable[[str], str] = default_normalise) -> List[Pair]:
    """Pair two key sequences, preserving order; unpaired keys get ``None`` as partner.

    Identical name sequences pair one to one. Otherwise exact keys come first: the longest
    order-preserving chain of identical keys anchors the alignment and the gaps between
    anchors are diffed on normalised names. A plain diff on normalised names is computed
    too and wins if it pairs more calls (when counters shifted on a frequent name).
    Every input index appears exactly once in the result.
    """
    a = [normalise(k) for k in golden]
    b = [normalise(k) for k in target]
    if a == b:
        return [(i, i) for i in range(len(a))]
    plain: List[Pair] = []
    _align(a, b, 0, len(a), 0, len(b), plain)
    where: dict = {}
    for j, k in enumerate(target):
        where.setdefault(k, j)
    anchors = _longest_chain([(i, where[k]) for i, k in enumerate(golden) if k in where])
    if not anchors:
        return plain
    exact = _fill_gaps(a, b, 0, len(a), 0, len(b), anchors)
    return exact if _n_matched(exact) >= _n_matched(plain) else plain


def _n_matched(pairs: List[Pair]) -> int:
    return sum(1 for i, j in pairs if i is not None and j is not None)


def _longest_chain(cands: List[Pair]) -> List[Pair]:
    """Longest subsequence of (i, j) candidates (sorted by i) with increasing j, O(n log n)."""
    tails: List[int] = []      # smallest j ending a chain of each length
    ends: List[int] = []       # index into cands of that chain's end
    prev = [-1] * len(cands)
    for k, (_, j) in enumerate(cands):
        pos = bisect_left(tails, j)
        if pos == len(tails):
            tails.append(j); ends.append(k)
        else:
            tails[pos] = j; ends[pos] = k
        prev[k] = ends[pos - 1] if pos else -1
    chain, k = [], ends[-1] if ends else -1
    while k != -1:
        chain.append(cands[k]); k = prev[k]
    return chain[::-1]


def _fill_gaps(a, b, alo, ahi, blo, bhi, anchors: List[Pair]) -> List[Pair]:
    out: List[Pair] = []
    pi, pj = alo, blo
    for i, j in anchors:
        _align(a, b, pi, i, pj, j, out)
        out.append((i, j))
        pi, pj = i + 1, j + 1
    _align(a, b, pi, ahi, pj, bhi, out)
    return out


def _align(a, b, alo, ahi, blo, bhi, out: List[Pair]) -> None:
    # common prefix/suffix are cheap and cover the usual "one extra call" case
    while alo < ahi and blo < bhi and a[alo] == b[blo]:
        out.append((alo, blo)); alo += 1; blo += 1
    tail = []
    while alo < ahi and blo < bhi and a[ahi - 1] == b[bhi - 1]:
        ahi -= 1; bhi -= 1; tail.append((ahi, bhi))
    if (ahi - alo) * (bhi - blo) <= _DIRECT_LIMIT:
        _diff(a, b, alo, ahi, blo, bhi, out)
    elif not _myers(a, b, alo, ahi, blo, bhi, out) and not _split_on_anchors(a, b, alo, ahi, blo, bhi, out):
        _diff(a, b, alo, ahi, blo, bhi, out)
    out.extend(reversed(tail))


_MAX_EDITS = 1000


def _myers(a, b, alo, ahi, blo, bhi, out: List[Pair], max_d: int = _MAX_EDITS) -> bool:
    """Shortest edit script (Myers 1986): fast when the sequences differ by few calls,
    however long they are. Gives up (returns False) beyond ``max_d`` edits."""
    n, m = ahi - alo, bhi - blo
    off = max_d + 1
    v = [0] * (2 * max_d + 3)
    trace = []
    for d in range(max_d + 1):
        trace.append(v[off - d - 1:off + d + 2])      # the diagonals round d reads
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[off + k - 1] < v[off + k + 1]):
                x = v[off + k + 1]
            else:
                x = v[off + k - 1] + 1
            y = x - k
            while x < n and y < m and a[alo + x] == b[blo + y]:
                x += 1; y += 1
            v[off + k] = x
            if x >= n and y >= m:
                out.extend(_myers_path(trace, n, m, alo, blo))
                return True
    return False


def _myers_path(trace, n, m, alo, blo) -> List[Pair]:
    path: List[Pair] = []
    x, y = n, m
    for d in range(len(trace) - 1, -1, -1):
        v = trace[d]                                   # v[i] is diagonal i - d - 1
        k = x - y
        get = lambda kk: v[kk + d + 1]
        prev_k = k + 1 if (k == -d or (k != d and get(k - 1) < get(k + 1))) else k - 1
        prev_x = get(prev_k)
        prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y:
            path.append((alo + x - 1, blo + y - 1)); x -= 1; y -= 1
        if d > 0:
            path.append((None, blo + prev_y) if x == prev_x else (alo + prev_x, None))
        x, y = prev_x, prev_y
    path.reverse()
    return path


def _diff(a, b, alo, ahi, blo, bhi, out: List[Pair]) -> None:
    from difflib import SequenceMatcher    # only when the two call lists differ

    sm = SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out.extend((alo + i, blo + j) for i, j in zip(range(i1, i2), range(j1, j2)))
        else:
            out.extend((alo + i, None) for i in range(i1, i2))
            out.extend((None, blo + j) for j in range(j1, j2))


def _split_on_anchors(a, b, alo, ahi, blo, bhi, out: List[Pair]) -> bool:
    """For many edits: the k-th call of a name on each side is a candidate pair; the
    longest order-preserving chain of them anchors the alignment, gaps are aligned alone."""
    seen: dict = {}
    where = {}
    for j in range(blo, bhi):
        n = seen[b[j]] = seen.get(b[j], -1) + 1
        where[(b[j], n)] = j
    seen = {}
    cands = []
    for i in range(alo, ahi):
        n = seen[a[i]] = seen.get(a[i], -1) + 1
        j = where.get((a[i], n))
        if j is not None:
            cands.append((i, j))
    anchors = _longest_chain(cands)
    if not anchors:
        return False
    out.extend(_fill_gaps(a, b, alo, ahi, blo, bhi, anchors))
    return True
