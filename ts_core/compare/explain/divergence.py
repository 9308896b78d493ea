"""Find the call that *introduced* an error, not the ones that propagated it.

Calls are walked in execution order (dump order: forward, the backward pass with the calls
made during it, then what runs after it, such as the optimizer). Rules, in order:

1. **Differing parameter or model input.** A call whose tensor input or parameter differs
   while no earlier recorded call produced it (a parameter, a model input, or the output of
   an op the dump does not record) is the root cause, even when its outputs still agree
   (a changed weight row whose effect cancels after a LayerNorm).
2. **Extra call.** If a differing input was produced by a call that runs on one side only
   and computes something (not a lossless op), that call is the divergence.
3. **Wiring.** If a differing input comes from different calls on the two sides (swapped
   operands, a dropped residual), the call receiving it is the divergence.
4. **Computed here.** A call whose inputs agree and whose outputs differ introduces the error,
   with two refinements: a pair of *different* ops (a group, a decomposition) whose differing
   output every consumer still receives agreeing is a comparison artefact, not a divergence
   (partial gradients of ``x * x`` vs ``x.pow(2)``); and when an input agrees within tolerance
   but was computed at lower precision on one side, the call where that precision was lost is
   named (lossless ops such as up-casts never introduce an error).
5. A differing gradient consumed after the backward pass (the optimizer) is named at the
   parameter's gradient record, never at the optimizer op: the model computed it.

Which earlier call produced a tensor is recognised by its recorded fingerprint on the same
side, followed through lossless calls (dataflow.Flow).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from ...dumpfmt.dtypes import precision
from ...dumpfmt.stack import user_frame
from ...verdicts import ERROR
from ..align.dataflow import LOSSLESS, Facts, Flow, fingerprint, writes_in_place
from ..align.matching import FORWARD, forward_key
from ..align.pairs import CallPair, in_time_order, members
from ..load.loader import INPUT, OUTPUT, PARAMETER, Dump, Entry, is_tensor_summary
from ..judge.verdict import REORDERED, SPLIT_INPUT, SPLIT_OUTPUT, differs, extra_call_verdict, settle
from ..model import FirstDivergence, Row
from ..ops import MOVE_OPS

__all__ = ["find_first_divergence", "fingerprint"]


def _lowered(r: Row) -> bool:
    """The two sides hold this value in floating types of different precision."""
    pg, pt = precision(r.golden_dtype), precision(r.target_dtype)
    return pg is not None and pt is not None and pg != pt


def _changed_args(p: CallPair) -> List[Row]:
    """The literal arguments of `p` that differ, when its tensor inputs do not (the call that
    holds a changed eps, scale or theta); else none."""
    args = [r for r in p.rows if r.mode == "value" and r.failed]
    if args and not any(differs(r) for r in p.rows if r.role != OUTPUT and r.mode in ("tensor", "statistics", "md5")):
        return args
    return []


def _worst(rows: List[Row]) -> Row:
    errors = [r for r in rows if r.verdict == ERROR]
    return (errors or rows)[0]


def _first_key(call) -> str:
    return members(call)[0].key


class _Walk:
    """State of one walk over the pairs of one step/rank."""

    def __init__(self, seqs: List[List[CallPair]], gd: Dump, td: Dump, step, rank, facts: Optional[Facts] = None):
        self.gd, self.td, self.step, self.rank = gd, td, step, rank
        self.describe = facts or Facts()
        self.order = in_time_order(seqs)
        self.pos = {id(cp): i for i, cp in enumerate(self.order)}
        self.flows = (Flow(), Flow())
        self.params: Dict[tuple, Tuple[str, str]] = {}     # golden fingerprint -> (module key, parameter)
        calls = ([], [])
        for cp in self.order:
            for side, call in enumerate((cp.golden, cp.target)):
                calls[side].extend((m, cp) for m in members(call))
        for side in (0, 1):
            for call, cp in sorted(calls[side], key=lambda x: x[0].index):
                self.flows[side].add(cp, self.describe(call), call.index)
                if side == 0 and call.kind == "module":
                    for e in call.entries:
                        if e.role == PARAMETER and fingerprint(e.leaf) is not None:
                            self.params.setdefault(fingerprint(e.leaf), (call.key, e.arg.split(".", 1)[-1]))
        self._consumers: Optional[Tuple[Dict, Dict]] = None
        self.by_key = {m.key: cp for cp in self.order for m in members(cp.golden)}

    # -- facts -------------------------------------------------------------------------------
    def producer(self, side: int, e: Optional[Entry], consumer: Optional[CallPair] = None) -> Optional[CallPair]:
        """The pair whose call made the value `e` carries on `side` (the latest before `consumer`)."""
        if e is None or not is_tensor_summary(e.leaf):
            return None
        return self.flows[side].producer(e.leaf, self._before(side, consumer))

    def slot(self, side: int, e: Entry, consumer: Optional[CallPair] = None) -> Optional[int]:
        return self.flows[side].slot(e.leaf, self._before(side, consumer))

    @staticmethod
    def _before(side: int, consumer: Optional[CallPair]) -> Optional[int]:
        call = None if consumer is None else (consumer.golden if side == 0 else consumer.target)
        return None if call is None else max(m.index for m in members(call))

    def consumers(self, side: int, e: Entry) -> List[Tuple[CallPair, Row]]:
        """Input rows, on any later pair, that received the value `e` on `side`."""
        if self._consumers is None:
            self._consumers = ({}, {})
            for cp in self.order:
                if not cp.matched:
                    continue
                for r in cp.rows:
                    if r.role == OUTPUT or r.mode not in ("tensor", "statistics", "md5"):
                        continue
                    for s, name in ((0, "golden"), (1, "target")):
                        ent = cp.entry(name, r.role, r.arg)
                        root = self.flows[s].root(fingerprint(ent.leaf)) if ent is not None else None
                        if root is not None:
                            self._consumers[s].setdefault(root, []).append((cp, r))
        root = self.flows[side].root(fingerprint(e.leaf))
        return self._consumers[side].get(root, []) if root is not None else []

    # -- the walk ------------------------------------------------------------------------------
    def settle_artefacts(self) -> List[Tuple[Row, str]]:
        """Mark rows that differ only in how the two sides split a computation (``judge.verdict.
        settle`` decides what a mark does to a verdict):
        - outputs of a pair of different ops that every consumer receives agreeing (see
          ``_cleared``; partial gradients of an input used twice);
        - inputs of a call whose outputs agree, fed by a computing call one side runs alone or
          by other (agreeing) calls than on the other side: ``softmax(x - max(x))`` vs
          ``softmax(x)``, ``(q * s) @ k`` vs ``(q @ k) * s``, ``b + a`` vs ``a + b``;
        - a chain of calls fed in another order whose result agrees again at its end (experts
          summed in reverse order: the partial sums differ, the sum does not)."""
        marks: List[Tuple[Row, str]] = []
        for cp in self.order:
            if not cp.matched or cp.kind == "parameters_grad":
                continue
            out_fail = [r for r in cp.rows if r.failed and r.role == OUTPUT]
            in_fail = [r for r in cp.rows if r.failed and r.role != OUTPUT]
            chain = self._reordered_chain(cp, out_fail, in_fail) if out_fail and in_fail else None
            if chain:
                end = chain[-1]
                for p in chain:
                    for r in p.rows:
                        if r.failed and r.mode != "value" and (p is not end or r.role != OUTPUT):
                            marks.append((r, settle(r, REORDERED, f"the two sides feed this chain of calls in another "
                                                    f"order; its intermediate values differ but its result agrees "
                                                    f"again at {end.key}")))
                continue
            if out_fail and not cp.exact and not in_fail and self._cleared(cp, out_fail):
                for r in out_fail:
                    marks.append((r, settle(r, SPLIT_OUTPUT, "every consumer receives this value agreeing: the "
                                            "two sides split it differently (e.g. partial gradients of an input used "
                                            "twice), so it is not compared here")))
            if out_fail or not any(r.role == OUTPUT for r in cp.rows):
                continue
            for r in in_fail:
                if r.mode == "value":
                    continue
                pg = self.producer(0, cp.entry("golden", r.role, r.arg), cp)
                pt = self.producer(1, cp.entry("target", r.role, r.arg), cp)
                extra = next((p for p in (pg, pt) if p is not None and not p.matched and not p.harmless
                              and p.kind == "api"), None)
                rewired = pg is not None and pt is not None and (pg is not pt or pg.same_op and (
                    self.slot(0, cp.entry("golden", r.role, r.arg), cp)
                    != self.slot(1, cp.entry("target", r.role, r.arg), cp)))
                if extra is not None or rewired:
                    why = (f"{extra.key} runs only in {'golden' if extra.golden else 'target'} before it"
                           if extra is not None else f"it comes from {pg.key} in golden and {pt.key} in target")
                    marks.append((r, settle(r, SPLIT_INPUT, f"the two sides split the computation differently "
                                                           f"here ({why}) and this call's outputs agree")))
        return marks

    def _reordered_chain(self, cp: CallPair, out_fail: List[Row], in_fail: List[Row]) -> Optional[List[CallPair]]:
        """`cp` and the calls after it that consume its differing outputs, up to the first whose
        outputs agree, when every differing input of `cp` comes from other (agreeing) calls on the
        two sides; None when the chain does not agree again within a few calls."""
        for r in in_fail:
            if r.mode == "value":
                return None
            pg = self.producer(0, cp.entry("golden", r.role, r.arg), cp)
            pt = self.producer(1, cp.entry("target", r.role, r.arg), cp)
            if pg is None or pt is None or pg is pt or not pg.matched or not pt.matched:
                return None
        chain, here = [cp], cp
        for _ in range(32):
            nxt = set()
            for r in (x for x in here.rows if x.role == OUTPUT and x.failed):
                for side, name in ((0, "golden"), (1, "target")):
                    e = here.entry(name, r.role, r.arg)
                    if e is not None:
                        nxt |= {id(c) for c, _ in self.consumers(side, e) if self.pos[id(c)] > self.pos[id(here)]}
            nxt_pairs = sorted((self.order[self.pos[i]] for i in nxt), key=lambda c: self.pos[id(c)])
            if not nxt_pairs:
                return None
            agreeing = [c for c in nxt_pairs if any(x.role == OUTPUT for x in c.rows)
                        and not any(x.failed for x in c.rows if x.role == OUTPUT)]
            if agreeing:
                return chain + [agreeing[0]]
            if len(nxt_pairs) != 1:
                return None
            here = nxt_pairs[0]
            chain.append(here)
        return None

    def run(self) -> Optional[FirstDivergence]:
        for cp in self.order:
            if not cp.matched or cp.kind == "parameters_grad":
                continue
            fd = self.visit(cp)
            if fd is not None:
                return fd
        return None

    def visit(self, cp: CallPair) -> Optional[FirstDivergence]:
        failing = [r for r in cp.rows if r.failed]
        if not failing:
            return None
        out_fail = [r for r in failing if r.role == OUTPUT]
        in_fail = [r for r in failing if r.role != OUTPUT]
        causes: List[str] = []
        origins: List[str] = []
        # a view or cast only passes a differing input on; a call that joins or selects values
        # (cat, split) is named when they arrive wired differently (swapped operands)
        lossless = all(self.describe(c).effect == LOSSLESS and self.describe(c).op not in MOVE_OPS
                       for c in (cp.golden, cp.target))
        for r in in_fail:
            if r.mode == "value":
                continue
            ge, te = cp.entry("golden", r.role, r.arg), cp.entry("target", r.role, r.arg)
            pg, pt = self.producer(0, ge, cp), self.producer(1, te, cp)
            for p in (pg, pt):
                if p is not None and p.kind == "parameters_grad" and any(x.failed for x in p.rows):
                    return self._gradient(p, cp, r)
            if pg is None and pt is None:
                # computed by the code of an enclosing module (not recorded at this level): that
                # module is named when it changes the result here; else a parameter / model input
                author = self._author(cp, r, ge)
                if author is not None:
                    if out_fail:
                        return author
                    continue
                if not out_fail and r.role == INPUT and r.arg == "input.0" and \
                        writes_in_place(self.describe(cp.golden).op):
                    continue        # the op overwrote it and its result agrees (an empty_like buffer filled)
                writer = self._in_place_writer(cp, r) if r.role == INPUT and \
                    fingerprint(ge.leaf if ge else None) not in self.params else None
                if writer is not None:
                    return writer
                origins.append(self._origin(r, ge))
                continue
            # a value some call made: it only matters here if this call's outputs differ too
            # (an extra or re-wired value the call turns into the same result is harmless), and a
            # lossless call only passes it on (its consumer is named, through it)
            if not out_fail or lossless:
                continue
            for p in (pg, pt):
                if p is not None and not p.matched and p.kind != "parameters_grad" and not p.harmless:
                    return self._extra(p, cp, r)
            if pg is not None and pg is pt:
                if any(x.failed for x in pg.rows if x.role == OUTPUT):
                    continue                                   # propagated from an earlier divergence
                sg, st = self.slot(0, ge, cp), self.slot(1, te, cp)
                if pg.same_op and sg is not None and st is not None and sg != st:
                    causes.append(f"{r.arg} is output {sg} of {pg.key} in golden but output {st} in target "
                                  f"(the calls are wired differently)")
                else:
                    causes.append(f"{r.arg} is the output of {pg.key}, which agrees there, but arrives here "
                                  f"changed (by an op the dump does not record)")
            elif pg is not None and pt is not None:
                causes.append(f"{r.arg} comes from {pg.key} in golden but from {pt.key} in target "
                              f"(the calls are wired differently)")
            else:
                author = self._author(cp, r, ge)
                if author is not None:
                    return author
                src, side = (pg, "golden") if pg is not None else (pt, "target")
                causes.append(f"{r.arg} comes from {src.key} in {side} and from no recorded call in the other")
        if origins:
            causes.insert(0, f"these inputs differ and come from no earlier call: {', '.join(origins)} (the root "
                             f"cause, even where the outputs still agree)")
        if causes:
            rows = out_fail or [r for r in in_fail if r.mode != "value"]    # the output it spoils, if any
            return self._build(cp, rows, "; ".join(causes))
        if not out_fail:
            return None
        values = [r for r in in_fail if r.mode == "value"]
        if values:
            changed = ", ".join(f"{r.arg} (golden {r.golden_value!r}, target {r.target_value!r})" for r in values)
            return self._build(cp, out_fail, f"a changed argument explains its differing outputs: {changed}")
        if in_fail:
            return None                                         # every differing input is propagated
        for r in out_fail:                                      # a module whose result an extra call made
            for side, name in ((0, "golden"), (1, "target")):
                p = self.producer(side, cp.entry(name, r.role, r.arg), cp)
                if p is not None and p is not cp and not p.matched and p.kind == "api" and not p.harmless:
                    return self._extra(p, cp, r)
        moved = self._moved_from(cp, out_fail)
        if moved is not None:
            return moved
        lost = self._precision_lost(cp)
        if lost is not None:
            return lost
        changed = self._changed_argument(cp, out_fail)
        if changed is not None:
            return changed
        return self._build(cp, out_fail, "its inputs and parameters match but its outputs do not: the difference "
                                         "is computed here")

    # -- rules ----------------------------------------------------------------------------------
    def _author(self, cp: CallPair, r: Row, ge: Optional[Entry]) -> Optional[FirstDivergence]:
        """A module whose differing input no recorded call produced (on one side or both)
        received it from the code of an enclosing module: ops between its submodules that the
        level does not record, or a wrong wiring there. Name the innermost enclosing module that
        did not itself receive a differing value from outside. None when the value comes from
        outside every recorded module (a model input) or is a parameter."""
        if cp.kind != "module" or cp.direction != FORWARD or r.role != INPUT or ge is None:
            return None
        if fingerprint(ge.leaf) in self.params:
            return None
        key = cp.golden.key
        while True:
            parent = self.gd.construct.get(key)
            owner = self.by_key.get(parent) if parent else None
            if owner is None or not owner.matched or owner.kind != "module":
                return None
            outside = [x for x in owner.rows if x.failed and x.role == INPUT and x.mode != "value"
                       and self.producer(0, owner.entry("golden", x.role, x.arg), owner) is None]
            if not outside:
                cause = (f"{cp.key} receives {r.arg} differing, and no recorded call made it on both sides: it is "
                         f"computed in the code of {owner.key} itself (between its submodules; the dump does not "
                         f"record those ops at this level)")
                return self._build(owner, [r], cause)
            key = parent                                    # the difference came from further out

    def _in_place_writer(self, cp: CallPair, r: Row) -> Optional[FirstDivergence]:
        """A differing input no recorded call produced, right after an in-place write to a
        tensor of its shape (``r[:, 1] = 0``, ``r.add_(h)``): the dump records what such an op
        received, not what it left. Name the writer, or the extra call that fed it."""
        k = self.pos[id(cp)]
        for w in reversed(self.order[max(0, k - 4):k]):
            if not w.matched or w.kind != "api" or not writes_in_place(self.describe(w.golden).op):
                continue
            ins = self.describe(w.golden).ins
            if not ins or ins[0].leaf.get("shape") != r.golden_shape:
                continue
            for x in w.rows:
                if x.failed and x.role != OUTPUT and x.mode != "value":
                    for side, name in ((0, "golden"), (1, "target")):
                        p = self.producer(side, w.entry(name, x.role, x.arg), w)
                        if p is not None and not p.matched and not p.harmless and p.kind == "api":
                            return self._extra(p, cp, r)
            changed = [x for x in w.rows if x.failed and x.role != OUTPUT]
            cause = (f"{w.key} writes in place to the tensor {cp.key} then receives as {r.arg}, which differs "
                     f"(the dump records what an in-place op receives, not what it leaves)"
                     + (f"; its {', '.join(x.arg for x in changed)} differ" if changed else ""))
            return self._build(w, changed or [r], cause)
        return None

    def _origin(self, r: Row, ge: Optional[Entry]) -> str:
        fp = fingerprint(ge.leaf) if ge is not None else None
        if r.role == PARAMETER:
            return f"{r.arg} (a parameter)"
        if fp in self.params:
            module, name = self.params[fp]
            return f"{r.arg} (the parameter {name} of {module})"
        return (f"{r.arg} (not produced by any earlier recorded call: a parameter, a model input or the result of "
                f"an op the dump does not record)")

    def _cleared(self, cp: CallPair, out_fail: List[Row]) -> bool:
        """A pair of different ops whose differing outputs every consumer receives agreeing:
        the outputs were compared as one thing where the ops compute another (partial gradients)."""
        here = self.pos[id(cp)]
        for r in out_fail:
            seen = []
            for side, name in ((0, "golden"), (1, "target")):
                e = cp.entry(name, r.role, r.arg)
                if e is not None:
                    seen += [(c, x) for c, x in self.consumers(side, e) if self.pos[id(c)] > here]
            if not seen or any(x.failed for _, x in seen):
                return False
        return True

    def _precision_lost(self, cp: CallPair) -> Optional[FirstDivergence]:
        """Where an input of `cp` that agrees within tolerance, but not exactly, was computed at
        lower precision on one side: the nearest earlier call whose output became less precise
        while its inputs were not. Followed back through the producers of inputs that differ at
        all (a bf16 ``down_proj`` output added to a float32 residual: the sum is float32 on both
        sides and within tolerance, the next RMSNorm scales the difference past it), into a
        module that made such a value inside (L0: its submodules), and, for a value made by code
        the dump does not record, to the nearest earlier call that lost precision. Lossless ops (an up-cast) and
        ops that only receive the difference are never the cause."""
        self._unmade = False
        found = self._nearest_source(cp, self._loses_precision)
        if found is None and self._unmade:
            # a differing value came from code the dump does not record (between modules at L0):
            # the nearest earlier call that lost precision
            found = next((p for p in reversed(self.order[:self.pos[id(cp)]])
                          if p.matched and p.direction == cp.direction and self._loses_precision(p)), None)
        lossless = all(self.describe(c).effect == LOSSLESS for c in (cp.golden, cp.target))
        if found is None:
            return None
        while found.kind == "module":                 # the innermost recorded call that lost it
            inner = next((c for c in self._children().get(found.golden.key, []) if self._loses_precision(c)), None)
            if inner is None:
                break
            found = inner
        outs = [r for r in found.rows if r.role == OUTPUT]
        r = next((x for x in outs if _lowered(x)), outs[0] if outs else None)
        what = f"{r.arg} is {r.target_dtype} in target and {r.golden_dtype} in golden" if r is not None else ""
        verb = "only converts it" if lossless else "receives it"
        return self._build(found, [x for x in outs if x.failed] or outs,
                           f"precision is lost here: {what} while its inputs have the same precision on both sides; "
                           f"{cp.key} {verb} and shows the difference")

    def _moved_from(self, cp: CallPair, out_fail: List[Row]) -> Optional[FirstDivergence]:
        """A call that only moves values (split, a slice, a view) cannot compute a difference:
        when its outputs differ while its one tensor input agrees, that input differs in a way
        the compared values cannot show (statistics of a tensor whose elements are reordered).
        Name the call that made it, through other such calls."""
        p, hops = cp, 0
        while all(c is not None and self.describe(c).effect == LOSSLESS for c in (p.golden, p.target)) and hops < 8:
            ins = [r for r in p.rows if r.role == INPUT and r.mode in ("tensor", "statistics", "md5")]
            if len(ins) != 1:
                return None
            src = self.producer(0, p.entry("golden", ins[0].role, ins[0].arg), p)
            if src is None or not src.matched or src is p:
                return None
            p, hops = src, hops + 1
        if p is cp:
            return None
        how = "statistics" if any(r.mode == "statistics" for r in out_fail) else "compared values"
        cause = (f"{cp.key} only moves values, yet its outputs differ while its input agrees: that input, made "
                 f"here, differs in a way its {how} cannot show (its elements in another order)")
        fd = self._build(p, [r for r in p.rows if r.role == OUTPUT] or out_fail, cause)
        worst = _worst(out_fail)
        fd.verdict, fd.reason = worst.verdict, f"as seen at {cp.key} ({worst.arg}): {worst.reason}"
        return fd

    def _changed_argument(self, cp: CallPair, out_fail: List[Row]) -> Optional[FirstDivergence]:
        """An input of `cp` that agrees within tolerance but not exactly, made upstream by a call
        whose own recorded argument changed (``var + eps`` with another eps, a scale, a rotary
        theta): its output moved by less than the tolerance, and `cp` amplifies it (an rsqrt of
        a small variance). Name that call, followed back through the inputs that differ at all."""
        src = self._nearest_source(cp, lambda s: bool(_changed_args(s)), hops=16)
        if src is None:
            return None
        args = _changed_args(src)
        changed = ", ".join(f"{r.arg} (golden {r.golden_value!r}, target {r.target_value!r})" for r in args)
        outs = [r for r in src.rows if r.role == OUTPUT and differs(r)]
        cause = (f"a changed argument: {changed}; its output differs only within tolerance, and "
                 f"{cp.key} downstream amplifies that difference past tolerance")
        fd = self._build(src, args + outs, cause)
        worst = _worst(out_fail)
        fd.verdict, fd.reason = worst.verdict, f"{fd.reason}; at {cp.key} ({worst.arg}): {worst.reason}"
        return fd

    def _nearest_source(self, cp: CallPair, hit: Callable[[CallPair], bool],
                        hops: Optional[int] = None) -> Optional[CallPair]:
        """The nearest matched call upstream of `cp` for which `hit` holds: breadth first through
        ``_sources`` (the makers of inputs that differ), at most `hops` levels (None: all)."""
        seen, frontier = {id(cp)}, [cp]
        while frontier and (hops is None or hops > 0):
            nxt = []
            for p in frontier:
                for src in self._sources(p):
                    if id(src) in seen or not src.matched:
                        continue
                    seen.add(id(src))
                    if hit(src):
                        return src
                    nxt.append(src)
            frontier = nxt
            hops = None if hops is None else hops - 1
        return None

    def _sources(self, p: CallPair) -> List[CallPair]:
        """The pairs that made the inputs of `p` that differ at all (or in precision) and, for a
        module whose own inputs do not, its recorded submodules and calls (it made it inside)."""
        out = []
        outside = False
        for r in p.rows:
            if r.role == OUTPUT or r.mode not in ("tensor", "statistics", "md5") or not (_lowered(r) or differs(r)):
                continue
            src = self.producer(0, p.entry("golden", r.role, r.arg), p) or \
                self.producer(1, p.entry("target", r.role, r.arg), p)
            if src is not None:
                out.append(src)
                outside = True
            elif differs(r):
                self._unmade = True
        if p.kind == "module" and not outside and p.golden is not None:
            out += [c for c in self._children().get(p.golden.key, []) if any(differs(r) for r in c.rows)]
        return out

    def _children(self) -> Dict[str, List[CallPair]]:
        if not hasattr(self, "_kids"):
            self._kids: Dict[str, List[CallPair]] = {}
            for cp in self.order:
                if cp.matched:
                    parent = self.gd.construct.get(cp.golden.key)
                    if parent:
                        self._kids.setdefault(parent, []).append(cp)
        return self._kids

    @staticmethod
    def _loses_precision(p: CallPair) -> bool:
        outs = [r for r in p.rows if r.role == OUTPUT and r.mode in ("tensor", "statistics", "md5")]
        ins = [r for r in p.rows if r.role != OUTPUT and r.mode in ("tensor", "statistics", "md5")]
        return any(map(_lowered, outs)) and not any(map(_lowered, ins))

    # -- results --------------------------------------------------------------------------------
    def _build(self, cp: CallPair, rows: List[Row], cause: str) -> FirstDivergence:
        worst = _worst(rows) if rows else Row(self.step, self.rank, 0, cp.direction, None, None, OUTPUT, "", cp.key,
                                              "unmatched", ERROR, "")
        sides = [(c, d) for c, d in ((cp.golden, self.gd), (cp.target, self.td)) if c is not None]
        # a backward call has no stack of its own: use its forward call's; a group uses its first call's
        stack = next((s for c, d in sides for s in (d.stacks.get(forward_key(_first_key(c))),
                                                     d.stacks.get(_first_key(c))) if s), [])
        module = next((d.construct[_first_key(c)] for c, d in sides if d.construct.get(_first_key(c))), None)
        return FirstDivergence(
            key=cp.key, target_key=cp.target.key if cp.target else None, direction=cp.direction,
            tensor=worst.name, verdict=worst.verdict, reason=worst.reason, cause=cause,
            metrics=worst.metrics(), stack=list(stack), source=user_frame(list(stack)),
            module=str(module) if module else None, step=self.step, rank=self.rank,
            statistics_based=worst.mode != "tensor", golden_key=cp.golden.key if cp.golden else None)

    def _extra(self, src: CallPair, consumer: CallPair, row: Row) -> FirstDivergence:
        """The extra call (present on one side only) whose output feeds a differing input."""
        side = "golden" if src.golden is not None else "target"
        call = src.golden or src.target
        outs = [r for r in src.rows if r.role == OUTPUT] or src.rows
        cause = (f"{call.key} runs only in {side} and changes what {consumer.key} receives: "
                 f"{row.arg} differs from there on")
        fd = self._build(src, outs, cause)
        fd.verdict, fd.reason = extra_call_verdict(side, consumer.key, row.arg)
        return fd

    def _gradient(self, grad: CallPair, consumer: CallPair, row: Row) -> FirstDivergence:
        """A differing parameter gradient read after the backward pass (by the optimizer)."""
        rows = [r for r in grad.rows if r.failed]
        cause = (f"the gradient recorded in {grad.key} differs although every recorded backward call before it "
                 f"agrees: it is computed by something the dump does not record; {consumer.key} (after the "
                 f"backward pass) only consumes it ({row.arg})")
        return self._build(grad, rows, cause)


def find_first_divergence(seqs, gd: Dump, td: Dump, step, rank,
                          facts: Optional[Facts] = None) -> Tuple[Optional[FirstDivergence], str]:
    """Return the first divergence (or None) and a note saying why there is none. Rows of
    outputs that two different ops split differently (every consumer agrees) are passed first."""
    walk = _Walk(seqs, gd, td, step, rank, facts)
    walk.settle_artefacts()
    fd = walk.run()
    if fd is not None:
        return fd, ""
    failing = [(cp, r) for seq in seqs for cp in seq for r in cp.rows if r.failed]
    if not failing:
        return None, "no call introduced an error: every compared value is within tolerance"
    grads = [cp.key for cp, r in failing if cp.kind == "parameters_grad"]
    if grads:
        return None, (f"no call introduced an error; parameter gradients differ from {grads[0]} on, "
                      f"although every recorded call's outputs match")
    return None, (f"no call introduced an error; {len(failing)} values differ only where their "
                  f"difference is explained by earlier calls")
