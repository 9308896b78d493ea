"""A pair of aligned calls, the merged call standing for a group, and which values pair.

Two calls that run the same op in the same framework pair their values by position
(``input.0`` with ``input.0``). Otherwise (torch ``layer_norm(x, shape, w, b, eps)`` vs the
MindSpore ``LayerNorm`` primitive ``(x, gamma, beta)``; ``F.linear`` vs ``MatMul`` + ``BiasAdd``;
``x.pow(2)`` vs ``x * x``) tensors pair by what flows through them: same number of elements,
closest recorded statistics, then argument order. A value one side's signature does not have
is not compared.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ...dumpfmt import FORWARD, INPUT, OUTPUT, PARAMETER, Entry, is_tensor_summary
from ...dumpfmt.dtypes import precision
from ..predicates import is_bool
from ..load.loader import Call
from ..model import Row
from .dataflow import fingerprint, numel, stats_distance

ValuePair = Tuple[str, str, Optional[Entry], Optional[Entry], str]     # role, arg, golden, target, note


@dataclass
class CallPair:
    """Aligned calls (either may be None when unmatched) with the rows comparing them.

    ``same_op``: both run the same op in the same framework, values pair by position.
    ``exact``: the calls have the same (mapped) name; a pair of different ops (a decomposition,
    a group) is not exact and may take in linked calls of one side only. ``harmless``: for a call on one
    side only, why it cannot change a result (a lossless op, a shape query); None when nothing
    explains it.
    """

    golden: Optional[Call]
    target: Optional[Call]
    direction: str
    rows: List[Row] = field(default_factory=list)
    same_op: bool = True
    exact: bool = True
    harmless: Optional[str] = None
    values: Dict[Tuple[str, str], Tuple[Optional[Entry], Optional[Entry]]] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return (self.golden or self.target).key

    @property
    def kind(self) -> str:
        return (self.golden or self.target).kind

    @property
    def matched(self) -> bool:
        return self.golden is not None and self.target is not None

    def entry(self, side: str, role: str, arg: str) -> Optional[Entry]:
        """The entry of `side` compared in the row (role, arg)."""
        pair = self.values.get((role, arg))
        if pair is not None:
            return pair[0] if side == "golden" else pair[1]
        call = self.golden if side == "golden" else self.target
        if call is None:
            return None
        return next((e for e in call.entries if e.role == role and e.arg == arg), None)


def members(call: Optional[Call]) -> List[Call]:
    if call is None:
        return []
    return call.members or [call]


def merge(calls: List[Call], root: Callable[[Optional[tuple]], Optional[tuple]] = lambda fp: fp) -> Call:
    """One call standing for a run of calls that together compute one thing.

    Its inputs are the members' inputs not produced inside the group (MatMul's x and weight,
    BiasAdd's bias); its outputs the members' outputs no later member consumes (BiasAdd's
    result), or the last member's when every output is consumed. ``root`` links values
    through lossless calls between members (a Reshape between MatMul and BiasAdd)."""
    if len(calls) == 1:
        return calls[0]
    made = set()
    ins: List[Entry] = []
    n_pos = 0
    kw_seen = set()
    for c in calls:
        for e in c.entries:
            if e.role == OUTPUT:
                continue
            if is_tensor_summary(e.leaf) and root(fingerprint(e.leaf)) in made:
                continue                                    # made by an earlier member
            name = e.arg.split(".", 1)[1] if "." in e.arg else e.arg
            if name.split(".", 1)[0].isdigit() or name in kw_seen:
                ins.append(Entry(e.role, f"input.{n_pos}", e.leaf))
                n_pos += 1
            else:
                kw_seen.add(name)
                ins.append(Entry(e.role, e.arg, e.leaf))
        for e in c.entries:
            if e.role == OUTPUT and is_tensor_summary(e.leaf):
                made.add(root(fingerprint(e.leaf)))
    # an output is internal when a later member consumes it
    later: List[set] = [set() for _ in calls]
    seen: set = set()
    for k in range(len(calls) - 1, -1, -1):
        later[k] = set(seen)
        seen |= {root(fingerprint(e.leaf)) for e in calls[k].entries
                 if e.role != OUTPUT and is_tensor_summary(e.leaf)}
    outs: List[Entry] = []
    for k, c in enumerate(calls):
        for e in c.entries:
            if e.role == OUTPUT and e.leaf is not None and root(fingerprint(e.leaf)) not in later[k]:
                outs.append(e)
    if not outs:
        outs = [e for e in calls[-1].entries if e.role == OUTPUT]
    outs = [Entry(OUTPUT, f"output.{i}", e.leaf) for i, e in enumerate(outs)]
    first = calls[0]
    return Call("+".join(c.key for c in calls), first.direction or FORWARD, first.kind, first.index,
                ins + outs, members=list(calls))


def _first_index(call: Optional[Call]) -> Optional[int]:
    return None if call is None else min(m.index for m in members(call))


def in_time_order(lists: List[List[CallPair]]) -> List[CallPair]:
    """Merge ordered lists of pairs by golden execution order (a pair without a golden call
    stays right after the pair before it)."""
    keyed = []
    for n, pairs in enumerate(lists):
        t = -1.0
        for pos, cp in enumerate(pairs):
            gi = _first_index(cp.golden)
            if gi is None:
                key = t + 0.5
            else:
                key = t = float(gi)
            keyed.append((key, n, pos, cp))
    keyed.sort(key=lambda x: x[:3])
    return [cp for *_, cp in keyed]


# ------------------------------------------------------------------- which values pair
_CLOSE, _SIMILAR = 1e-3, 1e-1


def _positional(g: Optional[Call], t: Optional[Call]) -> List[ValuePair]:
    keys: Dict[Tuple[str, str], None] = {}
    for c in (g, t):
        for e in (c.entries if c else []):
            keys.setdefault((e.role, e.arg), None)
    out = []
    for role, arg in keys:
        ge = next((e for e in g.entries if e.role == role and e.arg == arg), None) if g else None
        te = next((e for e in t.entries if e.role == role and e.arg == arg), None) if t else None
        out.append((role, arg, ge, te, ""))
    return out


def _dtype_kind(leaf: dict) -> str:
    """``bool``, ``float`` or ``int``: a mask, a value, an index or count."""
    if is_bool(leaf):
        return "bool"
    return "float" if precision(leaf.get("dtype")) is not None else "int"


def _by_data(gs: List[Entry], ts: List[Entry], leftovers: bool) -> List[Tuple[Optional[Entry], Optional[Entry]]]:
    """Pair tensors of one role: same element count and kind of dtype (a boolean flag is not
    an integer index: one causal-mask builder's ``[0]`` is not another's ``all(mask)``), then
    closest statistics, then order. With ``leftovers`` (the same op on both sides), what is
    left pairs by order when both sides have some (a shape or dtype bug still shows); else it
    stays unpaired."""
    cands = []
    for i, g in enumerate(gs):
        for j, t in enumerate(ts):
            if numel(g.leaf) != numel(t.leaf) or _dtype_kind(g.leaf) != _dtype_kind(t.leaf):
                continue
            d = stats_distance(g.leaf, t.leaf)
            level = 0 if d <= _CLOSE else 1 if d <= _SIMILAR else 2
            cands.append((level, abs(i - j), g.leaf.get("shape") != t.leaf.get("shape"), i, j))
    cands.sort()
    gi_used, tj_used, got = set(), set(), {}
    for _, _, _, i, j in cands:
        if i not in gi_used and j not in tj_used:
            gi_used.add(i); tj_used.add(j); got[i] = j
    rest_t = [j for j in range(len(ts)) if j not in tj_used] if leftovers else []
    for i in range(len(gs)):
        if i not in got and rest_t:
            got[i] = rest_t.pop(0)
    return [(gs[i], ts[got[i]]) for i in sorted(got)]


def pair_values(cp: CallPair) -> List[ValuePair]:
    """(role, arg, golden entry, target entry, note) for every value to compare in `cp`."""
    g, t = cp.golden, cp.target
    if g is None or t is None or cp.same_op:
        return _positional(g, t)
    out: List[ValuePair] = []
    # parameters pair by name (both sides name them the same once mapped)
    t_params = {e.arg: e for e in t.entries if e.role == PARAMETER}
    for e in g.entries:
        if e.role == PARAMETER and e.arg in t_params:
            out.append((PARAMETER, e.arg, e, t_params[e.arg], ""))
    for role in (INPUT, OUTPUT):
        gs = [e for e in g.entries if e.role == role and is_tensor_summary(e.leaf)]
        ts = [e for e in t.entries if e.role == role and is_tensor_summary(e.leaf)]
        for ge, te in _by_data(gs, ts, cp.exact):
            note = f"paired with target {te.arg} by data flow" if te.arg != ge.arg else ""
            out.append((role, ge.arg, ge, te, note))
        # keyword arguments both signatures have (approximate=, eps=) are compared by name
        t_kw = {e.arg: e for e in t.entries if e.role == role and not is_tensor_summary(e.leaf)
                and not e.arg.split(".", 1)[-1].split(".", 1)[0].isdigit()}
        for e in g.entries:
            if e.role == role and e.arg in t_kw and not is_tensor_summary(e.leaf):
                out.append((role, e.arg, e, t_kw[e.arg], ""))
    return out


__all__ = ["CallPair", "merge", "members", "pair_values", "in_time_order", "ValuePair"]
