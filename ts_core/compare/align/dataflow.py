"""What flows through a dump: tensor identities, producer -> consumer links, lossless ops.

Both alignment and the first-divergence walk reason about *values*, not names:

- a recorded tensor is identified on its own side by its **fingerprint** (dtype, shape,
  statistics, md5): the consumer of a tensor recorded the same fingerprint as its producer;
- **lossless** calls only move, copy or widen values (views, reshapes, layout transposes,
  contiguous/clone, up-casts, shape queries, or any call whose output holds exactly its input's
  values): one side may run them and the other not without any effect on a result, and they
  cannot introduce an error. Down-casts are *not* lossless: precision is lost there;
- a tensor's **root** is the fingerprint it had before lossless calls moved or widened it, so
  a value reshaped by MindSpore's ``nn.Dense`` is still linked to the MatMul that made it.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ...dumpfmt import INPUT, OUTPUT, PARAMETER, STAT_FIELDS, Entry, is_tensor_summary, parse_key
from ...dumpfmt.dtypes import precision
from ..predicates import numel
from ..ops import CAST_OPS, MOVE_OPS, QUERY_OPS, SHAPE_CONST_OPS, STRUCTURAL_OPS, VIEW_OPS

LOSSLESS_RTOL = 1e-6        # statistics this close: the same values (computed by different kernels)


_FP_FIELDS = STAT_FIELDS + ("md5",)


def fingerprint(leaf) -> Optional[tuple]:
    """What identifies one recorded tensor on its side: equal fingerprints mean the same value."""
    if not is_tensor_summary(leaf):
        return None
    get = leaf.get
    stats = tuple("nan" if v != v else v for v in map(get, _FP_FIELDS))     # NaN == NaN here
    if stats == (None, None, None, None, None):
        return None
    shape = get("shape")
    return (str(get("dtype")), tuple(shape) if isinstance(shape, list) else shape) + stats


def _stat(leaf, k) -> Optional[float]:
    v = leaf.get(k)
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def stats_distance(a: dict, b: dict) -> float:
    """Largest relative difference of Max/Min/Mean/Norm, scaled like compare_stats (by the
    larger of the value and the RMS); inf when nothing is comparable or numel differs."""
    if a is b or all(a.get(k) == b.get(k) for k in STAT_FIELDS) and a.get("Max") is not None:
        return 0.0 if numel(a) == numel(b) else math.inf
    na, nb = numel(a), numel(b)
    if na != nb:
        return math.inf
    norm = _stat(a, "Norm")
    rms = abs(norm) / math.sqrt(na) if norm is not None and na and math.isfinite(norm) else 0.0
    worst, seen = 0.0, 0
    for k in STAT_FIELDS:
        x, y = _stat(a, k), _stat(b, k)
        if x is None or y is None:
            continue
        seen += 1
        if not (math.isfinite(x) and math.isfinite(y)):
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return math.inf
            continue
        scale = max(abs(x), rms)
        d = abs(x - y) / scale if scale > 0 else (0.0 if x == y else math.inf)
        worst = max(worst, d)
    if not seen:
        ma, mb = a.get("md5"), b.get("md5")
        return 0.0 if ma is not None and ma == mb else math.inf
    return worst


def op_name(key: str) -> str:
    """The op a key runs, lower-cased: ``reshape`` for ``Tensor.reshape.3.forward`` and
    ``Primitive.reshape.Reshape.0.forward``, ``linear`` for ``Functional.linear.0.forward``."""
    info = parse_key(key)
    if info.kind != "api":
        return info.class_name.lower()
    if info.prefix == "Primitive":
        return info.class_name.lower()
    return info.api_name.lower()


def tensors(entries: Sequence[Entry], role: str) -> List[Entry]:
    """The tensor entries of a role; parameters count as inputs."""
    roles = (INPUT, PARAMETER) if role == INPUT else (role,)
    return [e for e in entries if e.role in roles and is_tensor_summary(e.leaf)]


# -------------------------------------------------------------------- what a call does
QUERY, LOSSLESS, LOSSY_CAST, COMPUTE = "query", "lossless", "lossy_cast", "compute"


@dataclass
class CallInfo:
    """Facts about one call used for alignment and localisation."""

    op: str
    effect: str                                   # QUERY / LOSSLESS / LOSSY_CAST / COMPUTE
    ins: List[Entry] = field(default_factory=list)     # tensor inputs (and parameters)
    outs: List[Entry] = field(default_factory=list)    # tensor outputs
    src: Optional[Entry] = None                        # LOSSLESS: the input whose values it passes on

    @property
    def made(self) -> List[Entry]:
        """Outputs the call computed, not one of its inputs passed on (BiasAdd's gradient of
        its input is the gradient it received)."""
        return [o for o in self.outs if not any(_same_values(o.leaf, i.leaf) for i in self.ins)]

    @property
    def harmless(self) -> bool:
        """Cannot change a result when run on one side only."""
        return self.effect in (QUERY, LOSSLESS)


def writes_in_place(op: str) -> bool:
    """``add_``, ``__iadd__``, ``__setitem__``: the op changes its first argument."""
    return op == "__setitem__" or (op.startswith("__i") and op.endswith("__")) or \
        (op.endswith("_") and not op.endswith("__"))


def _same_values(out: dict, inp: dict) -> bool:
    return numel(out) == numel(inp) and stats_distance(inp, out) <= LOSSLESS_RTOL


def describe_call(call) -> CallInfo:
    """Classify a call (an ``api`` record; modules, gradients and groups are always COMPUTE).
    A backward record is classified by its op: the gradient of a reshape is a reshape."""
    entries = call.entries
    ins, outs = tensors(entries, INPUT), tensors(entries, OUTPUT)
    info = CallInfo(op_name(call.key), COMPUTE, ins, outs)
    if call.kind != "api" or "+" in call.key:
        return info
    op = info.op
    if not outs:
        # nothing recorded comes out (a shape query, a backward record whose gradient goes to no
        # recorded tensor): nothing downstream can depend on it, unless it writes in place
        if op in QUERY_OPS or not writes_in_place(op):
            info.effect = QUERY
        return info
    if not ins:
        return info
    if op in VIEW_OPS:
        info.effect, info.src = LOSSLESS, ins[0]
        return info
    if op in SHAPE_CONST_OPS:
        info.effect = QUERY          # reads only its input's shape: a constant, no error can enter here
        return info
    if op in MOVE_OPS:
        info.effect = LOSSLESS       # no src: its outputs are values of their own, linked to it
        return info
    if op in CAST_OPS:
        pi = precision(ins[0].leaf.get("dtype"))
        po = precision(outs[0].leaf.get("dtype"))
        lossy = pi is not None and (po is None or po < pi)
        info.effect, info.src = (LOSSY_CAST if lossy else LOSSLESS), ins[0]
        return info
    if len(outs) == 1:
        src = next((e for e in ins if _same_values(outs[0].leaf, e.leaf)), None)
        if src is not None:
            pi, po = precision(src.leaf.get("dtype")), precision(outs[0].leaf.get("dtype"))
            if pi is None or po is None or po >= pi:
                info.effect, info.src = LOSSLESS, src
    return info




def moves_only(info: CallInfo) -> bool:
    """Does the call only move, view, widen or query values *by what it is* (a view, a
    broadcast, a split, an up-cast, a shape query), whatever values it happened to record?"""
    return info.harmless and (info.op in STRUCTURAL_OPS or info.op in CAST_OPS)


def never_pair(a: CallInfo, b: CallInfo) -> bool:
    """A call that only moves values and a call that computes are never the same call (a
    broadcast returning its input is not a loss's subtraction), wherever they run."""
    return (moves_only(a) and not b.harmless) or (moves_only(b) and not a.harmless)


class Facts:
    """``describe_call`` once per call (alignment and the walk both ask)."""

    def __init__(self) -> None:
        self._memo: Dict[int, Tuple[object, CallInfo]] = {}

    def __call__(self, call) -> CallInfo:
        got = self._memo.get(id(call))
        if got is None or got[0] is not call:
            got = self._memo[id(call)] = (call, describe_call(call))
        return got[1]


class Flow:
    """Producer -> consumer links of one side, by fingerprint, through lossless calls.

    ``root(fp)`` is the fingerprint a value had before lossless calls reshaped, copied or
    widened it; ``producer(leaf)`` the call whose output carried that root: the last one
    before ``before`` (a dump index) when given, since equal masks or constants made by
    several calls share a fingerprint, else the first.
    """

    def __init__(self) -> None:
        self._root: Dict[tuple, tuple] = {}
        self._made: Dict[tuple, List[Tuple[int, object, int]]] = {}    # root -> [(index, owner, slot)]

    def root(self, fp: Optional[tuple]) -> Optional[tuple]:
        if fp is None:
            return None
        return self._root.get(fp, fp)

    def add(self, owner: object, info: CallInfo, index: int = 0) -> None:
        """Record what a call produced (owner: what ``producer`` returns for it); calls are
        added in execution order."""
        if info.effect == LOSSLESS and info.src is not None:
            src = self.root(fingerprint(info.src.leaf))
            if src is not None:
                for o in info.outs:
                    fp = fingerprint(o.leaf)
                    if fp is not None and fp != src and fp not in self._made:
                        self._root.setdefault(fp, src)
                return
        for i, o in enumerate(info.outs):
            fp = fingerprint(o.leaf)
            if fp is not None:
                made = self._made.setdefault(self.root(fp), [])
                if not made or made[-1][1] is not owner:
                    made.append((index, owner, i))

    def _find(self, leaf, before: Optional[int]) -> Optional[Tuple[int, object, int]]:
        made = self._made.get(self.root(fingerprint(leaf)))
        if not made:
            return None
        if before is None:
            return made[0]
        k = bisect_left(made, before, key=lambda m: m[0])
        return made[k - 1] if k else made[0]

    def producer(self, leaf, before: Optional[int] = None) -> Optional[object]:
        got = self._find(leaf, before)
        return got[1] if got else None

    def slot(self, leaf, before: Optional[int] = None) -> Optional[int]:
        """The position, among its producer's tensor outputs, of the value `leaf` carries."""
        got = self._find(leaf, before)
        return got[2] if got else None


def roots(flow: Flow, entries: Sequence[Entry]) -> List[Optional[tuple]]:
    return [flow.root(fingerprint(e.leaf)) for e in entries]


def first_numels(entries: Sequence[Entry]) -> Tuple[Optional[int], ...]:
    return tuple(numel(e.leaf) for e in entries)
