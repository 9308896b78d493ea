"""Compare one golden dump with one target dump: align calls, compare every value, build rows."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ..dumpfmt import checksum_kind
from .align.crossframework import is_cross, prepare
from .align.dataflow import Facts
from .chunks import gated
from .explain.diagnosis import diagnose
from .explain.divergence import find_first_divergence
from .errors import TensorFileError
from .load.loader import OUTPUT, PARAMETER, Call, Dump, DumpUnit, Entry, is_tensor_summary
from .judge.masks import encodings_differ, is_bool, same_mask, same_mask_stats
from .align.matching import BACKWARD, FORWARD, OTHER, align, default_normalise
from .judge.metrics import STAT_NAMES, compare_arrays, compare_stats, has_stats, stat_value
from .align.pairs import CallPair, in_time_order, members, pair_values
from .align.refine import Side, forward_partners, refine
from .model import PairResult, Row, count_rows
from .judge.statsfirst import unchanged
from .judge.verdict import ERROR, PASS, WARNING, dtype_family, pick_tolerance, stats_verdict, tensor_verdict, values_equal, worse


@dataclass
class Options:
    """Comparison settings; ``None`` tolerances mean "follow the dtype"."""

    rtol: Optional[float] = None
    atol: Optional[float] = None
    stats_only: bool = False
    equal_nan: bool = True
    normalise: Callable[[str], str] = default_normalise
    crossframework: Optional[bool] = None     # None: when the dumps' frameworks are torch and MindSpore
    mapping: Optional[str] = None             # cross-framework mapping file (default: torch_mapping.yaml)
    stats_first: bool = False                 # read tensors only where the summaries differ (judge/statsfirst.py)


class Progress:
    """A one-line progress bar on stderr, only for large dumps on a terminal."""

    def __init__(self, total: int, label: str, enabled: Optional[bool] = None, every: int = 50):
        self.total, self.label, self.done, self.every = max(total, 1), label, 0, every
        self.enabled = (sys.stderr.isatty() and total >= 500) if enabled is None else enabled

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.enabled and (self.done % self.every == 0 or self.done >= self.total):
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(30 * frac)
            sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.done}/{self.total}")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def _shape(s) -> Optional[list]:
    return list(s) if isinstance(s, (list, tuple)) else None


def _dtype_name(dtype) -> str:
    """``torch.float32``, MindSpore's ``Float32`` and numpy's ``float32`` name the same dtype."""
    name = str(dtype).lower()
    for prefix in ("torch.", "mindspore.", "ms.", "numpy.", "np."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _squeezed(shape: list) -> list:
    return [d for d in shape if d != 1]


def _what(leaf) -> str:
    if leaf is None:
        return "None"
    return "a tensor" if is_tensor_summary(leaf) else f"the value {_value(leaf)!r}"


def _value(leaf) -> object:
    return leaf.get("value") if isinstance(leaf, dict) else leaf


def compare_entries(g: Optional[Entry], t: Optional[Entry], base: dict, gd: Dump, td: Dump,
                    opts: Options, exact_shape: bool = True) -> Optional[Row]:
    """One row for one recorded value of a call pair, or None when there is nothing to say
    (equal non-tensor arguments, None on both sides). ``exact_shape=False`` (values of two
    different ops, e.g. a group's boundary): the same elements in another shape or layout
    compare as equal ([2, 5, 16] vs the [10, 16] MatMul saw)."""
    gl = g.leaf if g else None
    tl = t.leaf if t else None
    if gl is None and tl is None:
        return None
    g_tensor, t_tensor = is_tensor_summary(gl), is_tensor_summary(tl)
    row = Row(**base, mode="missing")
    if g_tensor:
        row.golden_dtype, row.golden_shape = gl.get("dtype"), _shape(gl.get("shape"))
        _recorded_stats(row, "golden", gl)
    if t_tensor:
        row.target_dtype, row.target_shape = tl.get("dtype"), _shape(tl.get("shape"))
        _recorded_stats(row, "target", tl)
    if gl is None or tl is None or g_tensor != t_tensor:
        row.verdict = WARNING
        row.reason = f"golden recorded {_what(gl)}, target recorded {_what(tl)}"
        return row
    if not g_tensor:
        gv, tv = _value(gl), _value(tl)
        if values_equal(gv, tv):
            return None
        row.mode, row.golden_value, row.target_value = "value", gv, tv
        row.verdict, row.reason = WARNING, f"argument differs: golden {gv!r}, target {tv!r}"
        return row
    return _compare_tensor(gl, tl, row, gd, td, opts, exact_shape)


def _recorded_stats(row: Row, side: str, leaf: dict) -> None:
    """Each side's own Max/Min/Mean/Norm on its row: compare.csv and report.html show both, as
    msprobe's CSV does (Bench max ... NPU l2norm)."""
    for k in STAT_NAMES:
        setattr(row, f"{side}_{k.lower()}", stat_value(leaf.get(k)))


def _numel(shape: Optional[list]) -> Optional[int]:
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    n = 1
    for d in shape:
        n *= d
    return n


def _compare_tensor(gl: dict, tl: dict, row: Row, gd: Dump, td: Dump, opts: Options,
                    exact_shape: bool = True) -> Row:
    tol = pick_tolerance(row.golden_dtype, row.target_dtype, opts.rtol, opts.atol)
    exact = "exact" in (dtype_family(row.golden_dtype), dtype_family(row.target_dtype))   # as pick_tolerance
    row.rtol, row.atol, row.stat_rtol = tol.rtol, tol.atol, tol.stat_rtol
    notes: List[str] = []
    if _dtype_name(row.golden_dtype) != _dtype_name(row.target_dtype):
        notes.append(f"dtype differs ({row.golden_dtype} vs {row.target_dtype}), compared at the tolerance of "
                     f"the more precise one")
    gs, ts = row.golden_shape, row.target_shape
    layout = False
    if gs is not None and ts is not None and gs != ts:
        if _squeezed(gs) == _squeezed(ts):
            notes.append(f"shapes {gs} and {ts} differ only in size-1 dimensions")
        elif not exact_shape and _numel(gs) == _numel(ts):
            layout = True
            notes.append(f"shapes {gs} and {ts} hold the same number of elements: compared as one value in "
                         f"two layouts")
        else:
            row.mode, row.verdict = "tensor", ERROR
            row.reason = "; ".join([f"shape differs: golden {gs}, target {ts}"] + notes)
            return row
    if gs is not None and ts is not None and 0 in gs and 0 in ts:
        row.mode, row.verdict, row.reason = "tensor", PASS, "; ".join(["empty tensors"] + notes)
        return row
    if encodings_differ(gl, tl):
        mask = _one_mask(gl, tl, gd, td, opts)
        if mask is not None:
            row.mode, row.verdict = mask[0], PASS
            row.reason = "; ".join([f"the same mask in two encodings: boolean ({mask[1]}) and additive float "
                                    f"(0 / large negative)"] + notes)
            return row
    stats = None
    if has_stats(gl) and has_stats(tl):
        stats = compare_stats(gl, tl)
        for k in STAT_NAMES:
            setattr(row, f"{k.lower()}_diff", stats.diffs[k])
            setattr(row, f"{k.lower()}_rel_diff", stats.rel_diffs[k])
    kind = checksum_kind(gl.get("md5")) or "checksum"     # crc32 (md5 mode) or xor: compared within a kind
    if gl.get("md5") is not None and tl.get("md5") is not None \
            and checksum_kind(gl["md5"]) == checksum_kind(tl["md5"]):
        row.md5_equal = str(gl["md5"]) == str(tl["md5"])

    unread = unchanged(gl, tl) if opts.stats_first and not layout else ""
    if unread:
        notes.append(unread)
    if not opts.stats_only and not unread and gl.get("data_name") and tl.get("data_name"):
        try:
            verdict, reason = gated(lambda r: _compare_data(gl["data_name"], tl["data_name"], r, gd, td, tol, opts,
                                                            layout), row)
            if verdict == PASS or not layout or stats is None or stats_verdict(stats, tol.stat_rtol, tol.atol, _numel(gs), exact)[0] != PASS:
                row.mode, row.verdict, row.reason = "tensor", verdict, "; ".join([reason] + notes)
                return row
            notes.append("element-wise in no layout tried; the statistics (which do not depend on the layout) "
                         "agree")
        except TensorFileError as e:
            notes.append(f"{e}; compared statistics instead")
    elif not opts.stats_only and not unread and (gl.get("data_name") or tl.get("data_name")):
        side = "target" if gl.get("data_name") else "golden"
        notes.append(f"{side} has no tensor data; compared statistics")

    if stats is not None:
        verdict, reason = stats_verdict(stats, tol.stat_rtol, tol.atol, _numel(gs), exact)
        row.mode = "statistics"
        if row.md5_equal is True:
            verdict, reason = PASS, f"bitwise equal ({kind})"
        elif row.md5_equal is False:
            verdict, reason = worse(verdict, WARNING), f"bitwise different ({kind}); {reason}"
    elif row.md5_equal is not None:
        row.mode = "md5"
        verdict, reason = (PASS, f"bitwise equal ({kind})") if row.md5_equal else (ERROR, f"bitwise different ({kind})")
    else:
        verdict, reason = WARNING, "nothing comparable recorded (no data, statistics or md5)"
    row.verdict, row.reason = verdict, "; ".join([reason] + notes)
    return row


def _one_mask(gl: dict, tl: dict, gd: Dump, td: Dump, opts: Options):
    """(mode, the boolean's convention) when a boolean and a float tensor hold one attention
    mask (masks.py), from the data when both sides saved it, else from statistics; else None."""
    b, f = (gl, tl) if is_bool(gl) else (tl, gl)
    bd, fd = (gd, td) if b is gl else (td, gd)
    if not opts.stats_only and b.get("data_name") and f.get("data_name"):
        try:
            how = same_mask(bd.load_tensor(b["data_name"]), fd.load_tensor(f["data_name"]))
            return ("tensor", how) if how else None
        except TensorFileError:
            pass
    how = same_mask_stats(b, f) if has_stats(b) and has_stats(f) else None
    return ("statistics", f"{how}, from statistics") if how else None


def _layouts(ga, ta):
    """Target arrays to try against golden: the same elements in golden's shape, then (for a
    layout transpose on one side) every axis order of target that gives golden's shape."""
    yield ta.reshape(ga.shape)
    gshape = [d for d in ga.shape if d != 1]
    tt = ta.reshape([d for d in ta.shape if d != 1])
    if sorted(gshape) == sorted(tt.shape) and 1 < tt.ndim <= 5:
        from itertools import permutations
        for p in permutations(range(tt.ndim)):
            if list(p) != list(range(tt.ndim)) and [tt.shape[i] for i in p] == gshape:
                yield tt.transpose(p).reshape(ga.shape)


def _compare_data(g_name: str, t_name: str, row: Row, gd: Dump, td: Dump, tol, opts: Options,
                  layout: bool = False) -> Tuple[str, str]:
    ga = gd.load_tensor(g_name)
    ta = td.load_tensor(t_name)
    if ga.size != ta.size:
        return ERROR, f"tensor data size differs: golden {list(ga.shape)}, target {list(ta.shape)}"
    m = None
    for cand in (_layouts(ga, ta) if layout else [ta.reshape(ga.shape) if ga.shape != ta.shape else ta]):
        got = compare_arrays(ga, cand, tol.rtol, tol.atol, equal_nan=opts.equal_nan)
        if m is None or got.allclose_ratio > m.allclose_ratio:
            m = got
        if tensor_verdict(m)[0] == PASS:
            break
    for k, v in m.to_dict().items():
        if hasattr(row, k) and k not in ("rtol", "atol"):
            setattr(row, k, v)
    return tensor_verdict(m)


# Keyword arguments that change no value, only where a warning points: torch's nn.Softmax/
# LogSoftmax/Softmin pass ``_stacklevel=5`` to the function, mindtorch's modules pass none.
# Recorded on one side or with another value, they are no difference (issue 25).
NO_VALUE_KWARGS = frozenset({"_stacklevel"})


def compare_calls(cp: CallPair, order: int, step: Optional[int], rank: str, gd: Dump, td: Dump,
                  opts: Options, one_sided_params: bool = True) -> List[Row]:
    """Rows of one call pair. ``one_sided_params=False`` (cross-framework) skips a parameter
    recorded by one side only (MindSpore records a BatchNorm's moving_mean as a Parameter,
    torch's running_mean is a buffer its dump does not list). Values of two different ops pair
    by data (see pairs.py); one a signature does not have is not compared."""
    g, t = cp.golden, cp.target
    base = dict(step=step, rank=rank, order=order, direction=cp.direction,
                golden_key=g.key if g else None, target_key=t.key if t else None)
    cp.values = {}
    if g is None or t is None:
        present = g or t
        side, other = ("golden", "target") if g else ("target", "golden")
        if cp.harmless:
            verdict, reason = PASS, f"call only in {side}: {cp.harmless}, it cannot change a result"
        else:
            verdict, reason = WARNING, f"call only in {side}: no matching call in {other}"
        rows = []
        for e in present.entries:
            if e.leaf is None or not (e.is_tensor or e.role == OUTPUT):
                continue
            r = Row(**base, role=e.role, arg=e.arg, name=f"{present.key}.{e.arg}", mode="unmatched",
                    verdict=verdict, reason=reason)
            if e.is_tensor:
                setattr(r, f"{side}_dtype", e.leaf.get("dtype"))
                setattr(r, f"{side}_shape", _shape(e.leaf.get("shape")))
                _recorded_stats(r, side, e.leaf)
            rows.append(r)
        if not rows:
            rows.append(Row(**base, role=OUTPUT, arg="", name=present.key, mode="unmatched", verdict=verdict,
                            reason=reason))
        return rows
    rows = []
    for role, arg, ge, te, note in pair_values(cp):
        if role == OUTPUT and ((ge is None and g.unplaced) or (te is None and t.unplaced)):
            continue            # msprobe recorded no gradient we can place for this input
        if role != OUTPUT and arg.rsplit(".", 1)[-1] in NO_VALUE_KWARGS:
            continue
        if not one_sided_params and (ge is None or te is None) and \
                (role == PARAMETER or (role != OUTPUT and cp.kind == "api")):
            continue
        row = compare_entries(ge, te, dict(base, role=role, arg=arg, name=f"{g.key}.{arg}"), gd, td, opts,
                              exact_shape=cp.same_op)
        if row is not None:
            if note:
                row.reason = f"{row.reason}; {note}"
            cp.values[(role, arg)] = (ge, te)
            rows.append(row)
    return rows


def align_calls(gcalls: List[Call], tcalls: List[Call], opts: Options,
                golden_name: Optional[Callable[[str], str]] = None,
                target_name: Optional[Callable[[str], str]] = None, cross: bool = False,
                golden_parents: Optional[dict] = None, target_parents: Optional[dict] = None,
                facts: Optional[Facts] = None) -> List[List[CallPair]]:
    """Aligned call pairs per direction, in execution order: forward, backward, other.

    Module records and API calls are aligned apart (tools and frameworks emit a module's
    record before or after its inner calls), and so are the forward calls of the model and
    those made during or after the backward pass; each by name and order first
    (``matching.align``), then the gaps by data flow (``refine``); all are merged back in
    execution order.
    parameters_grad records pair by exact key instead, since tools place them differently
    (msprobe: before the module's backward record). ``golden_name``/``target_name`` give the
    name a key is aligned under (cross-framework: MindSpore keys in torch vocabulary);
    ``*_parents`` each side's construct.json.
    """
    gn = golden_name or _same
    tn = target_name or _same
    facts = facts or Facts()
    g_side, t_side = Side(gcalls, gn, golden_parents, facts), Side(tcalls, tn, target_parents, facts)
    out = []
    partners: dict = {}
    for direction in (FORWARD, BACKWARD, OTHER):
        gs = [c for c in gcalls if c.direction == direction]
        ts = [c for c in tcalls if c.direction == direction]
        lists = []
        # forward calls made during or after the backward pass (a custom backward, the optimizer)
        # align among themselves, not with the model's forward
        for modules, late in ((True, False), (False, False), (True, True), (False, True)):
            g_seq = [c for c in gs if c.kind != "parameters_grad" and (c.kind == "module") == modules
                     and (direction == FORWARD and g_side.after_backward(c)) == late]
            t_seq = [c for c in ts if c.kind != "parameters_grad" and (c.kind == "module") == modules
                     and (direction == FORWARD and t_side.after_backward(c)) == late]
            raw = [CallPair(g_seq[i] if i is not None else None, t_seq[j] if j is not None else None, direction)
                   for i, j in align([gn(c.key) for c in g_seq], [tn(c.key) for c in t_seq], opts.normalise)]
            lists.append(refine(raw, g_side, t_side, cross, partners if direction == BACKWARD else None))
        if direction == FORWARD:
            partners = forward_partners([cp for seq in lists for cp in seq])
        out.append(_insert_keyed(in_time_order(lists), gs, ts, direction, gn, tn))
    return out


def _same(key: str) -> str:
    return key


def _insert_keyed(pairs: List[CallPair], gs: List[Call], ts: List[Call], direction: str,
                  gn: Callable[[str], str] = _same, tn: Callable[[str], str] = _same) -> List[CallPair]:
    """Pair parameters_grad records by key; place each after the call that preceded it."""
    where = {}
    for i, p in enumerate(pairs):
        for c in (p.golden, p.target):
            for m in ([c] + members(c) if c is not None else []):
                where[id(m)] = i
    after: Dict[int, List[CallPair]] = {}
    t_grads = {tn(c.key): c for c in ts if c.kind == "parameters_grad"}
    for side_calls, is_golden in ((gs, True), (ts, False)):
        prev = -1
        for c in side_calls:
            if c.kind != "parameters_grad":
                prev = where[id(c)] if id(c) in where else where[id(members(c)[0])]
            elif is_golden:
                after.setdefault(prev, []).append(CallPair(c, t_grads.pop(gn(c.key), None), direction))
            elif tn(c.key) in t_grads:
                after.setdefault(prev, []).append(CallPair(None, c, direction))
    merged = list(after.get(-1, []))
    for i, p in enumerate(pairs):
        merged.append(p)
        merged.extend(after.get(i, []))
    return merged


def compare_pair(golden: DumpUnit, target: DumpUnit, opts: Options,
                 progress: Optional[bool] = None) -> PairResult:
    """Compare one step/rank: every call aligned, every value a row, then the first divergence."""
    gd, td = Dump(golden), Dump(target)
    gcalls, tcalls = gd.calls(), td.calls()
    names: Tuple = (None, None)
    notes: List[str] = []
    cross = opts.crossframework
    if cross is None:
        cross = is_cross(gd.framework, td.framework)
    if cross:
        prep = prepare(gcalls, tcalls, gd.framework, td.framework, opts.mapping)
        gcalls, tcalls, names = prep.golden, prep.target, (prep.golden_name, prep.target_name)
        notes.append(f"cross-framework compare ({gd.framework or '?'} vs {td.framework or '?'}): calls paired "
                     f"through the torch<->MindSpore mapping"
                     + (f"; groups merged: {'; '.join(prep.groups)}" if prep.groups else ""))
    facts = Facts()
    seqs = align_calls(gcalls, tcalls, opts, *names, cross=bool(cross), golden_parents=gd.construct,
                       target_parents=td.construct, facts=facts)
    step = golden.step if golden.step is not None else target.step
    rank = golden.rank or target.rank
    bar = Progress(sum(len(s) for s in seqs), f"compare {golden.label}", progress)
    order = 0
    for seq in seqs:
        for cp in seq:
            cp.rows = compare_calls(cp, order, step, rank, gd, td, opts, not cross)
            order += 1
            bar.advance()
    rows = [r for seq in seqs for cp in seq for r in cp.rows]
    fd, note = find_first_divergence(seqs, gd, td, step, rank, facts)
    programs = same_program(seqs)
    diagnosis = [h.to_dict() for h in diagnose(fd, seqs, gd, td)] if programs["same"] else []
    if not programs["same"] and gd.level and td.level and gd.level != td.level:
        programs["evidence"] += (f"; the dumps were made at different levels (golden {gd.level}, target "
                                 f"{td.level}): dump both at one level")
    lone = programs["only_golden"] + programs["only_target"]
    if not programs["same"]:
        fd, note = None, programs["evidence"]
    elif fd is None and lone:
        note += f"; {lone} calls have no partner on the other side and were not compared"
    matched = sum(1 for seq in seqs for cp in seq if cp.golden and cp.target)
    counts = {"records_golden": len(gcalls), "records_target": len(tcalls), "matched": matched,
              "unmatched_golden": sum(1 for s in seqs for cp in s if cp.target is None),
              "unmatched_target": sum(1 for s in seqs for cp in s if cp.golden is None),
              "rows": len(rows), **count_rows(rows)}
    modes = sorted({r.mode for r in rows if r.mode in ("tensor", "statistics", "md5")})
    warnings = notes + [f"{side} dump is marked incomplete (the run stopped early): {d.path}"
                for side, d in (("golden", gd), ("target", td)) if d.incomplete]
    return PairResult(step, rank, str(golden.json_path), str(target.json_path), rows, fd, note, counts, modes,
                      warnings, programs=programs, diagnosis=diagnosis)


MIN_MATCHED_SHARE = 0.5     # below this share of paired calls on both sides: different programs


def same_program(seqs: List[List[CallPair]]) -> dict:
    """Do two dumps describe the same program? Not when, on each side, fewer than
    MIN_MATCHED_SHARE of the calls that could change a result found a partner (one side may
    record more: MindSpore's loss Cells, a framework's extra ops), or when both record modules
    and none pairs. Returns the counts and, when they differ, the evidence in words."""
    pairs = [cp for seq in seqs for cp in seq if cp.kind != "parameters_grad"]
    counted = [cp for cp in pairs if cp.matched or not cp.harmless]
    matched = sum(1 for cp in counted if cp.matched)
    only_g = sum(1 for cp in counted if cp.target is None)
    only_t = sum(1 for cp in counted if cp.golden is None)
    # a side that records nothing pairs nothing (its share is 0, not "all of nothing")
    share = max(matched / (matched + only_g) if matched + only_g else 0.0,
                matched / (matched + only_t) if matched + only_t else 0.0)
    modules = {"golden": [cp.golden for cp in pairs if cp.kind == "module" and cp.golden is not None],
               "target": [cp.target for cp in pairs if cp.kind == "module" and cp.target is not None]}
    no_common_tree = bool(modules["golden"] and modules["target"]) and not any(
        cp.matched for cp in pairs if cp.kind == "module")
    if not counted:       # nothing recorded on either side: nothing was checked, which is no pass
        return {"same": False, "matched": 0, "calls": 0, "only_golden": 0, "only_target": 0, "matched_share": 0.0,
                "min_matched_share": MIN_MATCHED_SHARE, "common_module_tree": False,
                "evidence": "nothing was compared: neither dump records a call (an empty step, or a dump made "
                            "with a scope or list that matched nothing); re-dump the steps that ran the model"}
    out = {"same": share >= MIN_MATCHED_SHARE and not no_common_tree, "matched": matched, "calls": len(counted),
           "only_golden": only_g, "only_target": only_t, "matched_share": round(share, 4),
           "min_matched_share": MIN_MATCHED_SHARE, "common_module_tree": not no_common_tree, "evidence": ""}
    if not out["same"]:
        why = [f"{matched} calls paired, {only_g} only in golden, {only_t} only in target (in one program, "
               f"at least {MIN_MATCHED_SHARE:.0%} of one side's calls pair)"]
        if no_common_tree:
            names = {side: ", ".join(list(dict.fromkeys(c.key.rsplit(".", 2)[0] for c in calls))[:3])
                     for side, calls in modules.items()}
            why.append(f"no module in common (golden: {names['golden']} ...; target: {names['target']} ...)")
        out["evidence"] = ("the two dumps do not describe the same program: " + "; ".join(why)
                           + ". Calls of two programs were paired only by chance: their rows say nothing about "
                             "precision; compare two dumps of the same model")
    return out
