"""Compare one golden dump with one target dump, stage by stage: load both (``load/``), align
their calls (``align/``), judge every value pair (``judge/``), name the first divergence
(``explain/``); the result (``model.py``) is what ``report/`` writes."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Tuple

from .. import headstart
from .align.calls import align_calls, same_program
from .align.crossframework import is_cross, prepare
from .align.dataflow import Facts
from .align.matching import default_normalise
from .align import msprobe_pairs
from .align.pairs import CallPair, pair_values
from .explain import compiled_region
from .explain.diagnosis import CHECK_FAILED, diagnose
from .explain.divergence import find_first_divergence
from .chunks import current_gate
from .judge.readahead import PlannedRead, reading_ahead
from .judge.verdict import judge_value, one_sided, planned_read, recorded_stats
from .load.loader import OUTPUT, PARAMETER, Dump, DumpUnit, Entry
from .model import PairResult, Row, count_rows


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


def compare_entries(g: Optional[Entry], t: Optional[Entry], base: dict, gd: Dump, td: Dump,
                    opts: Options, exact_shape: bool = True) -> Optional[Row]:
    """One row for one recorded value of a call pair (judged by ``judge.verdict``), or None
    when there is nothing to say (equal non-tensor arguments, None on both sides)."""
    gl = g.leaf if g else None
    tl = t.leaf if t else None
    if gl is None and tl is None:
        return None
    row = Row(**base, mode="missing")
    return row if judge_value(gl, tl, row, gd, td, opts, exact_shape) else None


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
        verdict, reason = one_sided(side, other, cp.harmless)
        rows = []
        for e in present.entries:
            if e.leaf is None or not (e.is_tensor or e.role == OUTPUT):
                continue
            r = Row(**base, role=e.role, arg=e.arg, name=f"{present.key}.{e.arg}", mode="unmatched",
                    verdict=verdict, reason=reason)
            if e.is_tensor:
                setattr(r, f"{side}_dtype", e.leaf.get("dtype"))
                setattr(r, f"{side}_shape", _shape(e.leaf.get("shape")))
                recorded_stats(r, side, e.leaf)
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
        if msprobe_pairs.unreached(cp, role, ge, te, gd, td):
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


def _planned_reads(seqs: List[List[CallPair]], gd: Dump, td: Dump, opts: Options) -> Iterator[PlannedRead]:
    """The tensor pairs the judge is expected to read, in its order: the read-ahead's plan."""
    for seq in seqs:
        for cp in seq:
            if cp.golden is None or cp.target is None:
                continue
            for _, _, ge, te, _ in pair_values(cp):
                read = planned_read(ge.leaf, te.leaf, gd, td, opts) if ge is not None and te is not None else None
                if read is not None:
                    yield read


def compare_pair(golden: DumpUnit, target: DumpUnit, opts: Options,
                 progress: Optional[bool] = None) -> PairResult:
    """Compare one step/rank: every call aligned, every value a row, then the first divergence."""
    gd, td = Dump(golden), Dump(target)
    notes: List[str] = msprobe_pairs.prepare(gd, td)      # one side msprobe's: its recording conventions
    gcalls, tcalls = gd.calls(), td.calls()
    names: Tuple = (None, None)
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
    not_recorded, line = msprobe_pairs.mark_not_recorded(seqs, gd, td)
    notes += [line] if line else []
    optimizer_internal, line = msprobe_pairs.mark_optimizer_internals(seqs, gd, td)
    notes += [line] if line else []
    step = golden.step if golden.step is not None else target.step
    rank = golden.rank or target.rank
    bar = Progress(sum(len(s) for s in seqs), f"compare {golden.label}", progress)
    order = 0
    headstart.stop()          # the judge starts: compare's head start (ts_core/headstart.py) ends
    # a chunk unit reads only its share of the pairs: it plans none
    with reading_ahead(_planned_reads(seqs, gd, td, opts) if current_gate() is None else iter(())):
        for seq in seqs:
            for cp in seq:
                cp.rows = compare_calls(cp, order, step, rank, gd, td, opts, not cross)
                order += 1
                bar.advance()
    rows = [r for seq in seqs for cp in seq for r in cp.rows]
    notes += msprobe_pairs.unreached_note(gd, td)
    fd, note = find_first_divergence(seqs, gd, td, step, rank, facts)
    region = compiled_region.region_name(gd.notes, td.notes)     # a model compiled as a whole
    compiled_region.localise(fd, region)
    programs = same_program(compiled_region.without_lone_boundaries(seqs, region))
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
    # calls msprobe does not record are counted apart, not as "only in" the other side
    # and so are the calls inside torch's optimizer that only msprobe records
    only_g = sum(1 for s in seqs for cp in s if cp.target is None) - (not_recorded if td.msprobe else 0) \
        - (optimizer_internal if gd.msprobe else 0)
    only_t = sum(1 for s in seqs for cp in s if cp.golden is None) - (not_recorded if gd.msprobe else 0) \
        - (optimizer_internal if td.msprobe else 0)
    counts = {"records_golden": len(gcalls), "records_target": len(tcalls), "matched": matched,
              "unmatched_golden": only_g, "unmatched_target": only_t,
              **({"not_recorded_by_msprobe": not_recorded} if not_recorded else {}),
              **({"optimizer_internal_msprobe": optimizer_internal} if optimizer_internal else {}),
              "rows": len(rows), **count_rows(rows)}
    modes = sorted({r.mode for r in rows if r.mode in ("tensor", "statistics", "md5")})
    notes += [f"{side} dump: {n}" for side, d in (("golden", gd), ("target", td)) for n in d.notes]
    if gd.notes or td.notes:
        note += "; one dump could not see inside part of its model (its note is in the warnings): a " \
                "divergence may lie inside that region"
    warnings = notes + [f"{side} dump is marked incomplete (the run stopped early): {d.path}"
                for side, d in (("golden", gd), ("target", td)) if d.incomplete]
    warnings += [f"diagnosis: {h['title']}: {h['evidence']}" for h in diagnosis if h["cause"] == CHECK_FAILED]
    return PairResult(step, rank, str(golden.json_path), str(target.json_path), rows, fd, note, counts, modes,
                      warnings, programs=programs, diagnosis=diagnosis)
