"""The data model of a comparison, shared by every stage: one compared value (``Row``), the
call that introduced an error (``FirstDivergence``), one step/rank pair (``PairResult``) and
the whole result (``CompareResult``); each serialises to plain JSON."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional

from ..dumpfmt import json_safe as _clean
from ..verdicts import ERROR, PASS, WARNING


@dataclass
class Row:
    """One compared value of a call pair (a row of compare.csv)."""

    step: Optional[int]
    rank: str
    order: int                 # position in execution order: forward calls, then backward
    direction: str
    golden_key: Optional[str]
    target_key: Optional[str]
    role: str                  # input / output / parameter
    arg: str                   # input.0, output.0, parameters.weight, weight ...
    name: str                  # full tensor name, msprobe style: KEY.input.0
    mode: str                  # tensor / statistics / md5 / value / unmatched / missing
    verdict: str = PASS
    reason: str = ""
    golden_dtype: Optional[str] = None
    target_dtype: Optional[str] = None
    golden_shape: Optional[list] = None
    target_shape: Optional[list] = None
    rtol: Optional[float] = None
    atol: Optional[float] = None
    stat_rtol: Optional[float] = None
    cosine: Optional[float] = None
    max_abs_err: Optional[float] = None
    mean_abs_err: Optional[float] = None
    max_rel_err: Optional[float] = None
    allclose_ratio: Optional[float] = None
    within_0_1pct: Optional[float] = None
    within_0_5pct: Optional[float] = None
    euclidean: Optional[float] = None
    worst_index: Optional[list] = None
    worst_golden: Optional[float] = None
    worst_target: Optional[float] = None
    golden_nan: Optional[int] = None
    target_nan: Optional[int] = None
    golden_inf: Optional[int] = None
    target_inf: Optional[int] = None
    max_diff: Optional[float] = None
    min_diff: Optional[float] = None
    mean_diff: Optional[float] = None
    norm_diff: Optional[float] = None
    max_rel_diff: Optional[float] = None
    min_rel_diff: Optional[float] = None
    mean_rel_diff: Optional[float] = None
    norm_rel_diff: Optional[float] = None
    md5_equal: Optional[bool] = None
    golden_value: Any = None
    target_value: Any = None
    # each side's recorded statistics (msprobe's Bench max/min/mean/l2norm, NPU max/...): appended
    # after the older columns so readers of compare.csv by position keep working
    golden_max: Optional[float] = None
    golden_min: Optional[float] = None
    golden_mean: Optional[float] = None
    golden_norm: Optional[float] = None
    target_max: Optional[float] = None
    target_min: Optional[float] = None
    target_mean: Optional[float] = None
    target_norm: Optional[float] = None

    @property
    def error_measure(self) -> Optional[float]:
        """One number for "how far off": max relative error, or the worst statistic's relative diff."""
        if self.max_rel_err is not None:
            return self.max_rel_err
        rels = [v for v in (self.max_rel_diff, self.min_rel_diff, self.mean_rel_diff, self.norm_rel_diff)
                if v is not None]
        return max(rels) if rels else None

    @property
    def failed(self) -> bool:
        """A numerical (or argument-value) difference, as opposed to a structural one."""
        return self.verdict != PASS and self.mode in ("tensor", "statistics", "md5", "value")

    def metrics(self) -> Dict[str, Any]:
        skip = {"step", "rank", "order", "direction", "golden_key", "target_key", "role", "arg", "name",
                "verdict", "reason"}
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in skip and getattr(self, f.name) is not None}

    def to_dict(self) -> dict:
        return _clean(asdict(self))


CSV_COLUMNS = [f.name for f in fields(Row)]


@dataclass
class FirstDivergence:
    """The call that introduced the error: its outputs fail while what it consumed from
    earlier calls passes."""

    key: str
    target_key: Optional[str]
    direction: str
    tensor: str                # the worst failing output, e.g. KEY.output.0
    verdict: str
    reason: str
    cause: str                 # why this call and not a later one, in words
    metrics: Dict[str, Any]
    stack: List[str]
    source: Optional[str]      # the user's source line, picked from the stack
    module: Optional[str]      # enclosing module/cell (construct.json)
    step: Optional[int] = None
    rank: str = ""
    statistics_based: bool = False
    golden_key: Optional[str] = None      # None: the call runs in target only (``key`` is then target's)

    @property
    def calls(self) -> str:
        """Both sides' calls: ``golden <-> target`` (``-`` for a side that has none)."""
        golden = self.golden_key if self.golden_key is not None or self.target_key is None else None
        if golden is None and self.target_key is not None and self.key != self.target_key:
            golden = self.key           # a result saved before golden_key existed
        return f"{golden or '-'} <-> {self.target_key or '-'}"

    def to_dict(self) -> dict:
        return _clean(dict(asdict(self), calls=self.calls))

    def describe(self) -> str:
        where = f" (in {self.module})" if self.module else ""
        lines = [f"First divergence: {self.calls} [{self.direction}]{where}",
                 f"  {self.tensor}: {self.verdict} - {self.reason}",
                 f"  cause: {self.cause}"]
        if self.source:
            lines.append(f"  source: {self.source}")
        return "\n".join(lines)


@dataclass
class PairResult:
    """Comparison of one step/rank of golden with the matching one of target."""

    step: Optional[int]
    rank: str
    golden: str
    target: str
    rows: List[Row]
    first_divergence: Optional[FirstDivergence]
    note: str
    counts: Dict[str, int] = field(default_factory=dict)
    modes: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    timeline: Dict[str, Any] = field(default_factory=dict)   # many ranks: see ranks.timeline
    programs: Dict[str, Any] = field(default_factory=dict)   # align.calls.same_program: do the dumps match?
    diagnosis: List[Dict[str, Any]] = field(default_factory=list)   # explain/diagnosis.py, best first

    @property
    def same_program(self) -> bool:
        return self.programs.get("same", True)

    def to_dict(self, with_rows: bool = False) -> dict:
        d = {"step": self.step, "rank": self.rank, "golden": self.golden, "target": self.target,
             "counts": self.counts, "modes": self.modes, "note": self.note, "warnings": self.warnings,
             "programs": self.programs,
             "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
             "diagnosis": self.diagnosis}
        if self.timeline:
            d["timeline"] = self.timeline
        if with_rows:
            d["rows"] = [r.to_dict() for r in self.rows]
        return d


def count_rows(rows: List[Row]) -> Dict[str, int]:
    c = {PASS: 0, WARNING: 0, ERROR: 0}
    for r in rows:
        c[r.verdict] += 1
    return c


@dataclass
class CompareResult:
    """Everything a comparison found. Data only: ``first_divergence`` (the earliest over step/rank
    pairs) and ``verdict`` (the headline) are decided once, after the pairs and the many-rank
    summary are in, by ``explain.precedence.conclude``; ``str()`` hands it to ``report.text``."""

    golden: str
    target: str
    pairs: List[PairResult]
    unpaired_golden: List[str]
    unpaired_target: List[str]
    tolerances: Dict[str, Any]
    options: Dict[str, Any]
    output_dir: Optional[str] = None
    report_path: Optional[str] = None
    files: Dict[str, str] = field(default_factory=dict)
    ranks: Dict[str, Any] = field(default_factory=dict)      # many ranks: see ranks.rank_summary
    unreadable: List[str] = field(default_factory=list)      # why each step/rank not compared could not be read
    first_divergence: Optional[FirstDivergence] = None        # set by explain.precedence.conclude
    verdict: Optional[str] = None                             # likewise: judge.verdict.result_verdict's

    @property
    def rows(self) -> List[Row]:
        return [r for p in self.pairs for r in p.rows]

    @property
    def diagnosis(self) -> List[Dict[str, Any]]:
        """Cause hypotheses of the first divergence, best first (explain/diagnosis.py): dicts
        {cause, title, confidence, evidence, needs_tensors}; empty when nothing diverged."""
        fd = self.first_divergence
        return next((p.diagnosis for p in self.pairs if fd is not None and p.first_divergence is fd), [])

    @property
    def counts(self) -> Dict[str, int]:
        total: Dict[str, int] = {}
        for p in self.pairs:
            for k, v in p.counts.items():
                total[k] = total.get(k, 0) + v
        return total

    @property
    def different_programs(self) -> List["PairResult"]:
        """The step/rank pairs whose dumps do not describe the same program."""
        return [p for p in self.pairs if not p.same_program]

    def summary(self) -> dict:
        fd = self.first_divergence
        note = None
        if fd is None:
            notes = [p.note for p in self.pairs if p.note]
            note = "; ".join(dict.fromkeys(notes)) if notes else "no call introduced an error"
        return _clean({
            "verdict": self.verdict, "different_programs": bool(self.different_programs),
            "golden": self.golden, "target": self.target,
            "counts": self.counts, "tolerances": self.tolerances, "options": self.options,
            "first_divergence": fd.to_dict() if fd else None, "first_divergence_note": note,
            "diagnosis": self.diagnosis,
            "pairs": [p.to_dict() for p in self.pairs],
            "unpaired_golden": self.unpaired_golden, "unpaired_target": self.unpaired_target,
            "unreadable": self.unreadable, "files": self.files, **({"ranks": self.ranks} if self.ranks.get("steps") else {}),
        })

    def to_json(self, with_rows: bool = False, **kw) -> str:
        d = self.summary()
        if with_rows:
            d["rows"] = [r.to_dict() for r in self.rows]
        return json.dumps(d, **kw)

    def __str__(self) -> str:
        """``print(result)``: the terminal summary, rendered by report/text.py. The one import of a
        later stage in model.py, at render time only (tests/compare/test_stages.py names it)."""
        from .report.text import terminal_text

        return terminal_text(self)
