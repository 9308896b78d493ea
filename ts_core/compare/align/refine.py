"""Refine a name alignment by data flow: the calls names could not pair.

``matching.align`` pairs calls by name and order. Between two such anchors remain *gaps*:
calls one side runs and the other does not, or runs under another name. Each gap is resolved
by what flows through its calls:

1. calls pair by a score (same or related op, same element count, recorded statistics of
   outputs and inputs close), best order-preserving set first (a small dynamic programme;
   long gaps are first split on equal op names);
2. a call on one side only that is lossless (reshape, view, layout transpose, contiguous,
   same-dtype or up-cast, shape query, or any call whose output holds its input's values)
   is *harmless*: shown, never a divergence by itself;
3. a computing call on one side only joins a neighbouring pair of *different* ops it is
   linked to by data (it feeds one of its calls, or consumes one's output): MindSpore's
   MatMul joins the BiasAdd that pairs with torch's ``linear``, and the pair compares the
   group's boundary values (N:M groups). Next to a pair of the *same* op it stays an extra
   call, which the first-divergence walk may name;
4. what is still unpaired on both sides between the same two pairs forms one group.

Lossless calls of different shapes never pair, by name or by score; backward records then
pair as their forward calls did (``_follow_forward``).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ...dumpfmt import BACKWARD, FORWARD, INPUT, OUTPUT, forward_key
from ...dumpfmt.dtypes import precision
from .dataflow import (COMPUTE, LOSSLESS, LOSSY_CAST, QUERY, CallInfo, Facts, Flow, fingerprint, never_pair, numel,
                       roots, stats_distance, tensors)
from ..predicates import values_equal
from ..load.loader import Call
from ..ops import MOVE_OPS, op_family
from .matching import align, default_normalise
from .pairs import CallPair, members, merge

PAIR_MIN = 3                 # lowest score at which two calls of a gap pair
DP_LIMIT = 40_000            # larger gaps are split on equal op names first
_CLOSE, _SIMILAR = 1e-3, 5e-2

class Side:
    """One dump's calls with their facts: what each does and how values flow."""

    def __init__(self, calls: Sequence[Call], name: Callable[[str], str],
                 parents: Optional[Dict[str, object]] = None, facts: Optional[Facts] = None):
        self.name = name
        self.describe = facts or Facts()
        self.parents = parents or {}
        self.info: Dict[int, CallInfo] = {}
        self.flow = Flow()
        for c in sorted(calls, key=lambda c: c.index):
            self._add(c)
        self.consumed = {r for c in calls for r in roots(self.flow, self.of(c).ins)} - {None}
        self.by_key = {m.key: m for c in calls for m in [c] + c.members}
        self.first_backward = min((c.index for c in calls if c.direction == BACKWARD), default=None)

    def parent_of(self, c: Call) -> Optional[object]:
        """The module record `c` ran in (construct.json), if known."""
        return self.parents.get(members(c)[0].key)

    def after_backward(self, c: Call) -> bool:
        """Does `c` run once the backward pass has begun (a custom backward's ops, the optimizer)?"""
        return self.first_backward is not None and c.index > self.first_backward

    def _add(self, c: Call) -> None:
        if id(c) in self.info:
            return
        info = self.describe(c)
        self.info[id(c)] = info
        for m in c.members:
            self._add(m)
        self.flow.add(c, info, c.index)

    def of(self, c: Call) -> CallInfo:
        if id(c) not in self.info:
            self._add(c)
        return self.info[id(c)]

    def links(self, a: Call, group: List[Call]) -> bool:
        """Does `a` feed a member of `group` or consume one's output (through lossless calls)?
        Backward records are linked as their forward calls are: a gradient that reaches its
        consumer only summed with others (an input used twice) carries no recorded fingerprint."""
        if self._linked(a, group):
            return True
        if a.direction == BACKWARD:
            af = self.by_key.get(forward_key(a.key))
            fwd = [self.by_key.get(forward_key(m.key)) for m in group if m.direction == BACKWARD]
            return af is not None and self._linked(af, [f for f in fwd if f is not None])
        return False

    def _linked(self, a: Call, group: List[Call]) -> bool:
        ia = self.of(a)
        a_out = set(roots(self.flow, ia.outs)) - {None}
        a_in = set(roots(self.flow, ia.ins)) - {None}
        for m in group:
            im = self.of(m)
            if a_out & set(roots(self.flow, im.ins)) or a_in & set(roots(self.flow, im.outs)):
                return True
        return False


def _score(gc: Call, tc: Call, gs: Side, ts: Side) -> Optional[int]:
    """How well two calls of a gap correspond; None: they cannot pair."""
    if (gc.kind == "module") != (tc.kind == "module") or gc.kind == "parameters_grad":
        return None
    gi, ti = gs.of(gc), ts.of(tc)
    if gc.kind == "module":
        return 6 if gs.name(gc.key).rsplit(".", 3)[0] == ts.name(tc.key).rsplit(".", 3)[0] else None
    if not gi.outs or not ti.outs or ((gi.harmless or ti.harmless) and gi.effect != ti.effect) or never_pair(gi, ti):
        return None          # lossless ops (and constants) pair only with their kind: alone they are harmless
    if _shapes_conflict(gi, ti):
        return None
    g_n = {numel(e.leaf) for e in gi.outs}
    t_n = {numel(e.leaf) for e in ti.outs}
    if not g_n & t_n:
        return None
    s = 0
    same_name = default_normalise(gs.name(gc.key)) == default_normalise(ts.name(tc.key))
    if same_name:
        s += 4
    elif op_family(gi.op) == op_family(ti.op) or gi.effect == LOSSLESS:
        s += 2
    if gi.outs[0].leaf.get("shape") == ti.outs[0].leaf.get("shape"):
        s += 1
    best = min((stats_distance(g.leaf, t.leaf) for g in _results(gi) for t in _results(ti)), default=float("inf"))
    s += 4 if best <= _CLOSE else 1 if best <= _SIMILAR else 0
    if same_name and best > _SIMILAR:
        s -= 2        # the same op computing something else: weaker than another op computing the same
    if any(stats_distance(g.leaf, t.leaf) <= _CLOSE for g in gi.ins for t in ti.ins):
        s += 1
    return s


def _dp(G: List[Call], T: List[Call], gs: Side, ts: Side) -> List[Tuple[int, int]]:
    """Order-preserving pairs of highest total score (each at least PAIR_MIN)."""
    n, m = len(G), len(T)
    if not n or not m:
        return []
    sc = [[_score(g, t, gs, ts) for t in T] for g in G]
    best = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        row, prev = best[i], best[i - 1]
        for j in range(1, m + 1):
            v = max(prev[j], row[j - 1])
            s = sc[i - 1][j - 1]
            if s is not None and s >= PAIR_MIN:
                v = max(v, prev[j - 1] + s)
            row[j] = v
    out, i, j = [], n, m
    while i and j:
        s = sc[i - 1][j - 1]
        if s is not None and s >= PAIR_MIN and best[i][j] == best[i - 1][j - 1] + s:
            out.append((i - 1, j - 1)); i -= 1; j -= 1
        elif best[i][j] == best[i - 1][j]:
            i -= 1
        else:
            j -= 1
    return out[::-1]


def _pair_gap(G: List[Call], T: List[Call], gs: Side, ts: Side) -> List[Tuple[int, int]]:
    if len(G) * len(T) <= DP_LIMIT:
        return _dp(G, T, gs, ts)
    # too long for the quadratic programme: anchor on equal op families, then fill the gaps
    a = [op_family(gs.of(c).op) for c in G]
    b = [op_family(ts.of(c).op) for c in T]
    anchors = [(i, j) for i, j in align(a, b, lambda k: k) if i is not None and j is not None]
    out, pi, pj = [], 0, 0
    for i, j in anchors + [(len(G), len(T))]:
        if (i - pi) * (j - pj) <= DP_LIMIT:
            out.extend((pi + x, pj + y) for x, y in _dp(G[pi:i], T[pj:j], gs, ts))
        if i < len(G) and j < len(T):
            out.append((i, j))
        pi, pj = i + 1, j + 1
    return out


def _harmless_reason(call: Call, side: Side) -> Optional[str]:
    inside = getattr(call, "inside_region", None)       # set by crossframework.prepare
    if inside:
        return inside
    info = side.of(call)
    if info.effect == QUERY:
        return (f"a constant made from its input's shape ({info.op})" if info.outs
                else f"a query ({info.op}) with no tensor output")
    if info.effect == LOSSLESS:
        return f"a lossless op ({info.op}): its outputs hold only its inputs' values"
    unread = not set(roots(side.flow, info.outs)) & side.consumed
    if info.outs and unread and all(precision(o.leaf.get("dtype")) is None for o in info.outs):
        return f"integer bookkeeping ({info.op}, e.g. a step counter) that no recorded call reads"
    # msprobe gives the optimizer's calls the parent "optimizer" (tsprobe records none of torch's)
    if unread and call.direction == FORWARD and call.kind == "api" and side.after_backward(call) \
            and side.parent_of(call) in (None, "optimizer"):
        return (f"an update after the backward pass ({info.op}, e.g. the optimizer's) that the other side does not "
                f"record; no recorded call reads its result")
    return None


class _Gap:
    """One gap being resolved: its calls, their pairs and groups."""

    def __init__(self, G: List[Call], T: List[Call], gs: Side, ts: Side, cross: bool,
                 left: Optional[CallPair], right: Optional[CallPair]):
        self.G, self.T, self.gs, self.ts, self.cross = G, T, gs, ts, cross
        self.left, self.right = left, right

    def resolve(self) -> List[CallPair]:
        gs, ts = self.gs, self.ts
        pairs = _pair_gap(self.G, self.T, gs, ts)
        # groups: index of the pair (in `pairs`, or "left"/"right") -> members per side
        grp: List[Tuple[List[Call], List[Call]]] = [([self.G[i]], [self.T[j]]) for i, j in pairs]
        paired_g = {i for i, _ in pairs}
        paired_t = {j for _, j in pairs}
        # open: computing API calls left unpaired (module records are never grouped: they nest)
        open_g = [i for i in range(len(self.G)) if i not in paired_g and self.G[i].kind == "api"
                  and gs.of(self.G[i]).effect in (COMPUTE, LOSSY_CAST)]
        open_t = [j for j in range(len(self.T)) if j not in paired_t and self.T[j].kind == "api"
                  and ts.of(self.T[j]).effect in (COMPUTE, LOSSY_CAST)]
        edges = []
        for side_pos in ("left", "right"):
            cp = getattr(self, side_pos)
            if cp is not None and cp.matched and not cp.exact and cp.kind == "api":
                edges.append(cp)
        fuzzy = [k for k, (gm, tm) in enumerate(grp) if not self._exact(gm[0], tm[0])]
        # a computing call on one side only joins a linked pair of different ops of the gap ...
        grouped_g = self._join(open_g, self.G, 0, grp, fuzzy, [], gs)
        grouped_t = self._join(open_t, self.T, 1, grp, fuzzy, [], ts)
        # ... what is open on both sides between the same two pairs forms one group ...
        bounds_g = [i for i, _ in pairs] + [len(self.G)]
        bounds_t = [j for _, j in pairs] + [len(self.T)]
        extra_groups: Dict[int, Tuple[List[int], List[int]]] = {}     # segment -> open indices
        for seg in range(len(bounds_g)):
            lo_g = bounds_g[seg - 1] if seg else -1
            lo_t = bounds_t[seg - 1] if seg else -1
            sg = [i for i in open_g if lo_g < i < bounds_g[seg] and i not in grouped_g]
            st = [j for j in open_t if lo_t < j < bounds_t[seg] and j not in grouped_t]
            if sg and st:
                extra_groups[seg] = (sg, st)
        grouped_g |= {i for sg, _ in extra_groups.values() for i in sg}
        grouped_t |= {j for _, st in extra_groups.values() for j in st}
        # ... and what is left joins a linked group or neighbouring pair of different ops, if any
        extra = {seg: ([self.G[i] for i in sg], [self.T[j] for j in st]) for seg, (sg, st) in extra_groups.items()}
        cands = grp + list(extra.values())
        later = list(range(len(grp), len(cands))) + fuzzy
        grouped_g |= self._join([i for i in open_g if i not in grouped_g], self.G, 0, cands, later, edges, gs)
        grouped_t |= self._join([j for j in open_t if j not in grouped_t], self.T, 1, cands, later, edges, ts)
        in_group_g = {id(c) for gm, _ in grp for c in gm}
        in_group_t = {id(c) for _, tm in grp for c in tm}

        out: List[CallPair] = []
        gi = ti = 0
        direction = (self.G or self.T)[0].direction
        for seg in range(len(bounds_g)):
            while gi < bounds_g[seg]:
                c = self.G[gi]
                if id(c) not in in_group_g and gi not in grouped_g:
                    out.append(self._single(c, None, direction))
                gi += 1
            while ti < bounds_t[seg]:
                c = self.T[ti]
                if id(c) not in in_group_t and ti not in grouped_t:
                    out.append(self._single(None, c, direction))
                ti += 1
            if seg in extra:
                out.append(self._pair(*extra[seg], direction))
            if seg < len(pairs):
                gm, tm = grp[seg]
                out.append(self._pair(gm, tm, direction))
                gi, ti = bounds_g[seg] + 1, bounds_t[seg] + 1
        return out

    def _exact(self, g: Call, t: Call) -> bool:
        return _exact(g, t, self.gs, self.ts)

    def _join(self, open_idx: List[int], calls: List[Call], side: int, grp, fuzzy: List[int],
              edges: List[CallPair], flow_side: Side) -> set:
        """Attach open computing calls to linked pairs of different ops when that makes the two
        sides' boundary values correspond better (MindSpore's MatMul joins the BiasAdd paired with
        torch's linear; torch's pow.backward does not join the linear.backward it feeds, whose
        input already corresponds); returns those attached."""
        joined = set()
        changed = True
        while changed:
            changed = False
            for i in open_idx:
                if i in joined:
                    continue
                c = calls[i]
                cands = [grp[k] for k in fuzzy] + [(members(cp.golden), members(cp.target), cp) for cp in edges]
                best, best_gain = None, None
                for cand in cands:
                    mine = cand[side]
                    if not flow_side.links(c, mine):
                        continue
                    before = self._quality(cand[0], cand[1])
                    after = self._quality(*((mine + [c], cand[1]) if side == 0 else (cand[0], mine + [c])))
                    # more values correspond, or as many and no input loses its partner
                    if (after[0] > before[0] or (after[0] == before[0] and after[1] >= before[1])) and \
                            (best_gain is None or after > best_gain):
                        best, best_gain = cand, after
                if best is None:
                    continue
                joined.add(i); changed = True
                if len(best) == 3:                      # a neighbouring pair: merge into it now
                    cp = best[2]
                    new = sorted(best[side] + [c], key=lambda x: x.index)
                    if side == 0:
                        cp.golden = merge(new, flow_side.flow.root)
                    else:
                        cp.target = merge(new, flow_side.flow.root)
                else:
                    best[side].append(c)
                    best[side].sort(key=lambda x: x.index)
        return joined

    def _quality(self, gm: List[Call], tm: List[Call]) -> Tuple[int, int]:
        """How well two groups' boundaries correspond: (values with close statistics, minus
        inputs without a partner of the same size)."""
        g = merge(sorted(gm, key=lambda c: c.index), self.gs.flow.root)
        t = merge(sorted(tm, key=lambda c: c.index), self.ts.flow.root)
        close = unpaired = 0
        for role in (INPUT, OUTPUT):
            a = _boundary(g, role, self.gs.flow)
            b = _boundary(t, role, self.ts.flow)
            n_close, n_pairs = _match(a, b)
            close += n_close
            if role == INPUT:
                unpaired += len(a) + len(b) - 2 * n_pairs
        return close, -unpaired

    def _pair(self, gm: List[Call], tm: List[Call], direction: str) -> CallPair:
        g = merge(sorted(gm, key=lambda c: c.index), self.gs.flow.root)
        t = merge(sorted(tm, key=lambda c: c.index), self.ts.flow.root)
        return _classified(CallPair(g, t, direction), self.gs, self.ts, self.cross)

    def _single(self, g: Optional[Call], t: Optional[Call], direction: str) -> CallPair:
        c = g or t
        side = self.gs if g is not None else self.ts
        return CallPair(g, t, direction, harmless=_harmless_reason(c, side))


def _boundary(call: Call, role: str, flow: Flow) -> List[dict]:
    """The tensors a (merged) call takes in or gives out, each value once."""
    seen, out = set(), []
    for e in tensors(call.entries, role):
        r = flow.root(fingerprint(e.leaf))
        if r is None or r not in seen:
            seen.add(r)
            out.append(e.leaf)
    return out


def _match(a: List[dict], b: List[dict]) -> Tuple[int, int]:
    """(close pairs, pairs) of a greedy pairing of same-size tensors, closest statistics first."""
    cands = sorted((stats_distance(x, y), i, j) for i, x in enumerate(a) for j, y in enumerate(b)
                   if numel(x) == numel(y))
    used_a, used_b, close = set(), set(), 0
    for d, i, j in cands:
        if i not in used_a and j not in used_b:
            used_a.add(i); used_b.add(j)
            close += d <= _CLOSE
    return close, len(used_a)


def _exact(g: Call, t: Call, gs: Side, ts: Side) -> bool:
    return g.kind == t.kind and not g.members and not t.members \
        and default_normalise(gs.name(g.key)) == default_normalise(ts.name(t.key))


def _classified(cp: CallPair, gs: Side, ts: Side, cross: bool) -> CallPair:
    """Set how a matched pair's values pair: by position for the same op in the same framework
    (and for modules, whose inputs are the user's), else by data."""
    cp.exact = _exact(cp.golden, cp.target, gs, ts)
    cp.same_op = cp.kind == "module" or (not cross and cp.exact
                                         and default_normalise(cp.golden.key) == default_normalise(cp.target.key))
    return cp


DOUBT_WINDOW = 6             # how far a call that matches a name anchor's value may be


def _results(info: CallInfo) -> List:
    return info.outs if info.effect == LOSSLESS else info.made


def _close_made(a: CallInfo, b: CallInfo) -> bool:
    return any(numel(x.leaf) == numel(y.leaf) and stats_distance(x.leaf, y.leaf) <= _CLOSE
               for x in _results(a) for y in _results(b))


def _leading_shape(entries: List) -> Optional[tuple]:
    shape = entries[0].leaf.get("shape") if entries else None
    return tuple(shape) if isinstance(shape, (list, tuple)) else None


def _shapes_conflict(a: CallInfo, b: CallInfo) -> bool:
    """Two lossless calls (views, reshapes, copies, up-casts, queries) that take or give values
    of different shapes are different calls, whatever their names: ``view(2, 5, 2, 8)`` of one
    head split is not the ``reshape(2, 5, 48)`` MindSpore's ``Dense`` runs, nor is a ``float()``
    of ``[2, 5, 32]`` the ``Reshape`` of ``[10, 32]``. (Backward records: the shapes of the
    gradients they receive.) Alone on its side each is harmless; paired they would compare
    values of different tensors. Not for calls that select or join values (cat, split,
    getitem): given other shapes, the same call was made another way (swapped operands)."""
    if not (a.harmless and b.harmless) or a.op in MOVE_OPS or b.op in MOVE_OPS:
        return False
    for x, y in ((a.ins, b.ins), (a.outs, b.outs)):
        sx, sy = _leading_shape(x), _leading_shape(y)
        if sx is not None and sy is not None and sx != sy:
            return True
    return False


def _records_fit(a: CallInfo, b: CallInfo) -> bool:
    """Could two backward records be one call's: the gradients they receive and give hold as
    many elements (and, for lossless calls, have the same shapes)? The backward of a mean over
    two axes does not fit that of one of the two means a decomposition runs instead."""
    if _shapes_conflict(a, b):
        return False
    for x, y in ((a.ins, b.ins), (a.outs, b.outs)):
        if x and y and numel(x[0].leaf) != numel(y[0].leaf):
            return False
    return True


def _dissolve_misshaped(raw: List[CallPair], gs: Side, ts: Side) -> List[CallPair]:
    """Undo a name anchor of two lossless calls of different shapes (``_shapes_conflict``) that
    are different calls: they take tensors of different shapes, or a call left alone nearby on
    one side has the shapes of the other side's call (the target's extra reshapes shifted the
    names). Both are left to their gap, where a lossless call on one side only is harmless.
    Otherwise the anchor stays: the same view giving another shape is a shape bug to show."""
    out: List[CallPair] = []
    for k, cp in enumerate(raw):
        if cp.matched and cp.kind == "api":
            gi, ti = gs.of(cp.golden), ts.of(cp.target)
            if _shapes_conflict(gi, ti) and (_leading_shape(gi.ins) != _leading_shape(ti.ins)
                                             or _fitting_call_near(raw, k, gi, ti, gs, ts)):
                out += [CallPair(cp.golden, None, cp.direction), CallPair(None, cp.target, cp.direction)]
                continue
        out.append(cp)
    return out


def _fitting_call_near(raw: List[CallPair], k: int, gi: CallInfo, ti: CallInfo, gs: Side, ts: Side) -> bool:
    """Is a lossless call left alone near ``raw[k]`` shaped like the other side's call?"""
    for o in raw[max(0, k - DOUBT_WINDOW):k + DOUBT_WINDOW + 1]:
        if o.matched or o.kind != "api":
            continue
        if o.target is not None and ts.of(o.target).harmless and not _shapes_conflict(gi, ts.of(o.target)):
            return True
        if o.golden is not None and gs.of(o.golden).harmless and not _shapes_conflict(gs.of(o.golden), ti):
            return True
    return False


def _dissolve_doubtful(raw: List[CallPair], gs: Side, ts: Side) -> List[CallPair]:
    """Undo a name anchor whose two calls computed different values while a nearby call left
    unpaired on one side computed what the other did: ``h + r`` vs ``(h + 0.5 r) + 0.5 r``
    paired the first additions by their counters, the value says the second one. Repeated
    while it undoes something (an undone anchor leaves its calls unpaired for the next)."""
    for _ in range(3):
        new = _dissolve_once(raw, gs, ts)
        if len(new) == len(raw):
            return new
        raw = new
    return raw


def _dissolve_once(raw: List[CallPair], gs: Side, ts: Side) -> List[CallPair]:
    out = list(raw)
    for k, cp in enumerate(raw):
        if not cp.matched or cp.kind != "api":
            continue
        gi, ti = gs.of(cp.golden), ts.of(cp.target)
        if not _results(gi) or not _results(ti) or _close_made(gi, ti):
            continue
        near = raw[max(0, k - DOUBT_WINDOW):k + DOUBT_WINDOW + 1]
        if any((o.golden is None and o.target is not None and _close_made(gi, ts.of(o.target))) or
               (o.target is None and o.golden is not None and _close_made(gs.of(o.golden), ti)) for o in near):
            out[k] = None
    result: List[CallPair] = []
    for k, cp in enumerate(out):
        if cp is None:
            result += [CallPair(raw[k].golden, None, raw[k].direction), CallPair(None, raw[k].target, raw[k].direction)]
        else:
            result.append(cp)
    return result


def forward_partners(pairs: List[CallPair]) -> Dict[str, str]:
    """golden forward key -> target forward key of the pairs of one op (for backward records)."""
    return {cp.golden.key: cp.target.key for cp in pairs
            if cp.matched and not cp.golden.members and not cp.target.members}


def _follow_forward(pairs: List[CallPair], partners: Dict[str, str], gs: Side, ts: Side,
                    cross: bool) -> List[CallPair]:
    """A backward record pairs with the backward record of the call its forward call paired
    with: the backward of the expert visited first in golden pairs with the backward of the
    same expert, visited last in target; the backward of torch's ``view`` pairs with that of the
    ``reshape`` its forward paired with, not with the one before it (MindSpore's ``Dense``) that
    the name alignment chose. The wanted record is taken from wherever it is, a pair or alone;
    the record it replaces is left alone (a lossless one is harmless there)."""
    single = lambda c: c is not None and not c.members            # noqa: E731
    movable = lambda cp: cp.golden is None or cp.target is None or cp.exact   # noqa: E731
    where = {forward_key(cp.target.key): k for k, cp in enumerate(pairs)
             if single(cp.target) and single(cp.golden or cp.target) and movable(cp)}
    changed = set()
    for k, cp in enumerate(pairs):
        if not single(cp.golden) or not single(cp.target or cp.golden) or not movable(cp):
            continue
        want = partners.get(forward_key(cp.golden.key))
        have = forward_key(cp.target.key) if cp.target is not None else None
        m = where.get(want) if want is not None else None
        if m is None or want == have or m == k:
            continue
        other = pairs[m]
        if not _records_fit(gs.of(cp.golden), ts.of(other.target)):
            continue
        cp.target, other.target = other.target, cp.target
        where[want] = k
        if have is not None:
            where[have] = m
        changed |= {k, m}
    out: List[CallPair] = []
    for k, cp in enumerate(pairs):
        if k not in changed:
            out.append(cp)
        elif cp.matched:
            out.append(_classified(cp, gs, ts, cross))
        elif cp.golden is not None or cp.target is not None:
            c, side = (cp.golden, gs) if cp.golden is not None else (cp.target, ts)
            out.append(CallPair(cp.golden, cp.target, cp.direction, harmless=_harmless_reason(c, side)))
    return out


def refine(raw: List[CallPair], gs: Side, ts: Side, cross: bool,
           partners: Optional[Dict[str, str]] = None) -> List[CallPair]:
    """Resolve the gaps between the matched pairs of `raw` (one direction, one kind of call).
    ``partners`` (backward records): how the forward calls paired."""
    raw = _dissolve_doubtful(_dissolve_misshaped(_split_movers(raw, gs, ts), gs, ts), gs, ts)
    out: List[CallPair] = []
    G: List[Call] = []
    T: List[Call] = []

    def flush(right: Optional[CallPair]) -> None:
        if G or T:
            left = out[-1] if out else None
            out.extend(_Gap(list(G), list(T), gs, ts, cross, left, right).resolve())
            G.clear(); T.clear()

    for cp in raw:
        if cp.matched:
            _classified(cp, gs, ts, cross)
            flush(cp)
            out.append(cp)
        elif cp.golden is not None:
            G.append(cp.golden)
        else:
            T.append(cp.target)
    flush(None)
    out = _pair_moved_modules(out, gs, ts, cross)
    if partners:
        out = _follow_forward(out, partners, gs, ts, cross)
    else:
        _repair_order(out, gs, ts)
    return _split_movers(_regroup_swapped(out, gs, ts, cross), gs, ts)


def _split_movers(pairs: List[CallPair], gs: Side, ts: Side) -> List[CallPair]:
    """No pair of a call that only moves values with one that computes (``dataflow.never_pair``),
    however it was made (names, a mapping, a move): each stays alone on its side, where the
    mover is harmless and the computing call is shown (and may be named) as one-sided."""
    out: List[CallPair] = []
    for cp in pairs:
        if cp.matched and cp.kind == "api" and not cp.golden.members and not cp.target.members \
                and never_pair(gs.of(cp.golden), ts.of(cp.target)):
            out += [CallPair(cp.golden, None, cp.direction, harmless=_harmless_reason(cp.golden, gs)),
                    CallPair(None, cp.target, cp.direction, harmless=_harmless_reason(cp.target, ts))]
        else:
            out.append(cp)
    return out


def _pair_moved_modules(pairs: List[CallPair], gs: Side, ts: Side, cross: bool) -> List[CallPair]:
    """Module records that ran in another order (``b(x) - a(x)`` vs ``a(x) - b(x)``): the name
    alignment keeps one and leaves the other alone on each side. A module record's name is its
    place and its call count, so two left alone under the same name are the same call: pair them."""
    alone_t: Dict[str, int] = {}
    for k, cp in enumerate(pairs):
        if cp.golden is None and cp.target.kind == "module":
            alone_t.setdefault(ts.name(cp.target.key), k)
    if not alone_t:
        return pairs
    out: List[Optional[CallPair]] = list(pairs)
    for k, cp in enumerate(pairs):
        if cp.target is None and cp.golden.kind == "module":
            m = alone_t.pop(gs.name(cp.golden.key), None)
            if m is not None:
                out[k] = _classified(CallPair(cp.golden, pairs[m].target, cp.direction), gs, ts, cross)
                out[m] = None
    return [cp for cp in out if cp is not None]


def _regroup_swapped(pairs: List[CallPair], gs: Side, ts: Side, cross: bool) -> List[CallPair]:
    """Two ops run in the other order on the two sides (``(q @ k) * s`` vs ``(q * s) @ k``, and
    their backward): one op pairs by name, the other is left alone on each side, next to it.
    When a call left alone on *each* side is linked to that pair, the four calls form one group."""
    alone = lambda cp: not cp.matched and cp.harmless is None and (cp.golden or cp.target).kind == "api"  # noqa: E731
    out = list(pairs)
    for k, cp in enumerate(pairs):
        if not cp.matched or cp.kind != "api" or out[k] is None:
            continue
        near = [i for i in range(max(0, k - 2), min(len(pairs), k + 3)) if i != k and out[i] is not None
                and alone(out[i])]
        g_side = [i for i in near if out[i].golden is not None and gs.links(out[i].golden, members(cp.golden))]
        t_side = [i for i in near if out[i].target is not None and ts.links(out[i].target, members(cp.target))]
        if not g_side or not t_side:
            continue
        gm = members(cp.golden) + [out[i].golden for i in g_side]
        tm = members(cp.target) + [out[i].target for i in t_side]
        g = merge(sorted(gm, key=lambda c: c.index), gs.flow.root)
        t = merge(sorted(tm, key=lambda c: c.index), ts.flow.root)
        out[k] = _classified(CallPair(g, t, cp.direction), gs, ts, cross)
        for i in g_side + t_side:
            out[i] = None
    return [cp for cp in out if cp is not None]


REORDER_WINDOW = 8           # how far apart two calls of one op may have swapped places


def _last(call: Call) -> int:
    return max(m.index for m in members(call))


def _args(call: Call) -> Dict[str, object]:
    return {e.arg: e.leaf.get("value") for e in call.entries
            if e.role == INPUT and isinstance(e.leaf, dict) and "value" in e.leaf}


def _inputs_agree(g: Call, t: Call, gs: Side, ts: Side, partner: Optional[Dict[int, set]] = None,
                  args: bool = True) -> bool:
    """Does every tensor input (and parameter) of `g` have a same-size one in `t` with close
    statistics (made by the partner of its producer, where both are known: two masks with the
    same statistics are still told apart), and (``args``) every argument both record the same value?"""
    t_ins = ts.of(t).ins
    for a in gs.of(g).ins:
        pa = gs.flow.producer(a.leaf, _last(g)) if partner is not None else None
        want = partner.get(id(pa)) if pa is not None else None
        if not any(numel(a.leaf) == numel(b.leaf) and stats_distance(a.leaf, b.leaf) <= _CLOSE
                   and (not want or id(ts.flow.producer(b.leaf, _last(t))) in want) for b in t_ins):
            return False
    if not args:
        return True
    ga, ta = _args(g), _args(t)
    return all(values_equal(ga[k], ta[k]) for k in ga.keys() & ta.keys())


def _repair_order(pairs: List[CallPair], gs: Side, ts: Side) -> None:
    """Independent calls of one op that ran in another order (``q``, ``k``, ``v`` projections;
    experts visited in reverse; ``b(x) - a(x)`` vs ``a(x) - b(x)``) were paired by their
    counters; re-pair them by what they consumed: first by tensors (and which calls made them),
    then, near a call re-paired so, also by argument values (``idx == 3`` visited first). A
    differing argument alone is not a reason to re-pair (an off-by-one constant is a bug)."""
    same = [k for k, cp in enumerate(pairs) if cp.matched and cp.exact and cp.kind != "parameters_grad"]
    partner: Dict[int, set] = {}

    def link(cp: CallPair) -> None:
        for m in members(cp.golden):
            partner[id(m)] = {id(x) for x in members(cp.target)}

    for cp in pairs:
        if cp.matched:
            link(cp)
    by_name: Dict[str, List[int]] = {}
    for k in same:
        by_name.setdefault(default_normalise(gs.name(pairs[k].golden.key)), []).append(k)
    moved: List[int] = []
    for args in (False, True):
        for k in same:                                 # in execution order: producers are re-paired first
            cp = pairs[k]
            if _inputs_agree(cp.golden, cp.target, gs, ts, partner, args):
                continue
            if args and not any(abs(k - m) <= 4 * REORDER_WINDOW for m in moved):
                continue
            peers = by_name[default_normalise(gs.name(cp.golden.key))]
            at = peers.index(k)
            for m in peers[max(0, at - REORDER_WINDOW):at + REORDER_WINDOW + 1]:
                other = pairs[m]
                if m == k or not _inputs_agree(cp.golden, other.target, gs, ts, partner, args):
                    continue
                if _inputs_agree(other.golden, other.target, gs, ts, partner, args) and \
                        not _inputs_agree(other.golden, cp.target, gs, ts, partner, args):
                    continue                           # would break a pair that agrees
                cp.target, other.target = other.target, cp.target
                link(cp); link(other)
                if not args:
                    moved += [k, m]
                break


__all__ = ["Side", "refine", "forward_partners", "op_family", "PAIR_MIN"]
