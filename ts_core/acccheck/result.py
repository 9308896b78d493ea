"""What acc-check found: one row per graded value, one per API call, and the whole result
(its verdict, counts and summary). Apart from check.py so that the report reads results
without importing the checker."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional, Tuple

from ..dumpfmt import json_safe
from ..verdicts import ERROR, PASS, WARNING, worse
from .standards import STANDARDS_YAML

SKIP = "skip"
NOTHING_CHECKED = "nothing checked"


@dataclass
class DetailRow:
    """One graded value (a row of accuracy_checking_details.csv)."""

    step: Optional[int]
    rank: str
    api_name: str              # Functional.linear.0 (msprobe's "API name": key without direction)
    name: str                  # Functional.linear.0.forward.output.0
    direction: str
    status: str
    message: str = ""
    standard: str = ""
    dtype: Optional[str] = None
    bench_dtype: Optional[str] = None
    shape: Optional[list] = None
    cosine: Optional[float] = None
    max_abs_err: Optional[float] = None
    rel_err_hundredth: Optional[float] = None
    rel_err_thousandth: Optional[float] = None
    rel_err_ten_thousandth: Optional[float] = None
    error_rate: Optional[float] = None
    eb: Optional[float] = None
    rmse: Optional[float] = None
    small_value_err_ratio: Optional[float] = None
    max_rel_err: Optional[float] = None
    mean_rel_err: Optional[float] = None
    inf_nan_err_ratio: Optional[float] = None
    max_ulp_err: Optional[float] = None
    mean_ulp_err: Optional[float] = None
    ulp_err_proportion: Optional[float] = None
    peer_max_rel_err: Optional[float] = None
    peer_mean_rel_err: Optional[float] = None
    peer_rmse: Optional[float] = None
    peer_eb: Optional[float] = None
    max_rel_err_ratio: Optional[float] = None
    mean_rel_err_ratio: Optional[float] = None
    rmse_ratio: Optional[float] = None
    small_value_err_ratio_ratio: Optional[float] = None
    eb_ratio: Optional[float] = None


DETAIL_COLUMNS = [f.name for f in fields(DetailRow)]


@dataclass
class CallResult:
    """One API call (a row of accuracy_checking_result.csv)."""

    step: Optional[int]
    rank: str
    api_name: str
    key: str
    forward: str               # pass / warning / error / skip
    backward: str              # same, or "" when the dump holds no backward for it
    message: str = ""
    source: Optional[str] = None

    @property
    def status(self) -> str:
        if self.forward == SKIP:
            return SKIP
        return worse(self.forward, self.backward) if self.backward in (PASS, WARNING, ERROR) else self.forward


RESULT_COLUMNS = ["step", "rank", "api_name", "key", "forward", "backward", "message", "source"]


@dataclass
class AccCheckResult:
    dump: str
    calls: List[CallResult] = field(default_factory=list)
    details: List[DetailRow] = field(default_factory=list)
    other_records: Dict[str, int] = field(default_factory=dict)
    standards: str = STANDARDS_YAML
    files: Dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> List[CallResult]:
        return [c for c in self.calls if c.status == ERROR]

    @property
    def skipped(self) -> List[CallResult]:
        return [c for c in self.calls if c.status == SKIP]

    @property
    def counts(self) -> Dict[str, int]:
        c = {"calls": len(self.calls), PASS: 0, WARNING: 0, ERROR: 0, SKIP: 0}
        for call in self.calls:
            c[call.status] += 1
        return c

    @property
    def checked(self) -> Dict[str, int]:
        """How much was actually graded: API calls replayed, values graded (forward, backward)."""
        graded = [r for r in self.details if r.status in (PASS, WARNING, ERROR)]
        return {"calls": sum(1 for c in self.calls if c.status != SKIP), "of_calls": len(self.calls),
                "values": len(graded), "forward_values": sum(1 for r in graded if r.direction == "forward"),
                "backward_values": sum(1 for r in graded if r.direction == "backward")}

    @property
    def verdict(self) -> str:
        """The worst graded call; NOTHING_CHECKED when no value was graded (never a pass)."""
        c = self.counts
        if not self.checked["values"]:
            return NOTHING_CHECKED
        return ERROR if c[ERROR] else WARNING if c[WARNING] else PASS

    def nothing_checked(self) -> Optional[Tuple[str, str]]:
        """(reason, fix) when nothing was graded, else None."""
        if self.checked["values"]:
            return None
        if not self.calls:
            return ("the dump holds no API call" + (f" (only {', '.join(f'{v} {k}' for k, v in self.other_records.items() if v)})"
                                                    if any(self.other_records.values()) else ""),
                    "re-dump with level: L1 or mix and task: tensor")
        messages = [c.message for c in self.calls]
        if all("no tensor data" in m for m in messages):
            return ("the dump holds statistics only: no saved inputs to replay",
                    "re-dump with task: tensor (level L1 or mix)")
        if all("not installed here" in m or "has no replayer" in m for m in messages):
            return messages[0], "run acc-check where the dump's framework is installed"
        common = max({_reason_class(m) for m in messages}, key=lambda r: sum(_reason_class(m) == r for m in messages))
        return (f"no API call could be replayed (most often: {common})",
                "see why each was not replayed; a dump made with task: tensor at level L1 or mix replays")

    def summary(self) -> dict:
        reasons: Dict[str, List[str]] = {}
        examples: Dict[str, str] = {}
        for c in self.skipped:
            reasons.setdefault(_reason_class(c.message), []).append(c.key)
            examples.setdefault(_reason_class(c.message), c.message)
        why = self.nothing_checked()
        return json_safe({
            "verdict": self.verdict, "checked": self.checked,
            **({"nothing_checked": {"reason": why[0], "fix": why[1]}} if why else {}),
            "dump": self.dump, "counts": self.counts, "other_records": self.other_records,
            "standards": self.standards,
            "failed": [{"key": c.key, "api_name": c.api_name, "step": c.step, "rank": c.rank,
                        "forward": c.forward, "backward": c.backward, "message": c.message, "source": c.source}
                       for c in self.failed],
            "skipped": [{"reason": r, "count": len(keys), "keys": keys, "example": examples[r]}
                        for r, keys in sorted(reasons.items())],
            "files": self.files,
        })


def _reason_class(message: str) -> str:
    """Skip reasons grouped: the message up to its first ':' or '('."""
    for sep in (":", "("):
        if sep in message:
            message = message.split(sep, 1)[0]
    return message.strip()
