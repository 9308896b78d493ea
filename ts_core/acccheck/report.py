"""acc-check outputs: accuracy_checking_result.csv (one row per API call, msprobe's summary
file), accuracy_checking_details.csv (one row per graded value), acc_check_summary.json, and
the terminal summary: counts, the failing APIs with their source lines, why calls were skipped."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..dumpfmt import write_text_atomic
from ..dumpfmt.jsonio import csv_value
from .result import DETAIL_COLUMNS, RESULT_COLUMNS, SKIP, AccCheckResult
from ..verdicts import ERROR, PASS, WARNING

RESULT_CSV = "accuracy_checking_result.csv"
DETAILS_CSV = "accuracy_checking_details.csv"
SUMMARY_JSON = "acc_check_summary.json"


def _csv(rows, columns) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(columns)
    for r in rows:
        w.writerow([csv_value(getattr(r, c)) for c in columns])
    return buf.getvalue()


def write_outputs(result: AccCheckResult, output_dir: "os.PathLike | str") -> None:
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    result.files = {"result": str(out / RESULT_CSV), "details": str(out / DETAILS_CSV),
                    "summary": str(out / SUMMARY_JSON)}
    write_text_atomic(out / RESULT_CSV, _csv(result.calls, RESULT_COLUMNS))
    write_text_atomic(out / DETAILS_CSV, _csv(result.details, DETAIL_COLUMNS))
    write_text_atomic(out / SUMMARY_JSON, json.dumps(result.summary(), indent=2) + "\n")


def summary_text(result: AccCheckResult, max_rows: int = 15) -> str:
    c, done = result.counts, result.checked
    lines = [f"tsprobe acc-check: {result.verdict.upper()}  (checked {done['calls']} of {c['calls']} API calls, "
             f"{done['values']} values: {c[PASS]} pass, {c[WARNING]} warning, {c[ERROR]} error, "
             f"{c[SKIP]} not replayed)"]
    why = result.nothing_checked()
    if why:
        lines.append(f"nothing was checked: {why[0]}; {why[1]}")
    other = {k: v for k, v in result.other_records.items() if v}
    if other:
        lines.append("not API calls (not checked): " + ", ".join(f"{v} {k}" for k, v in other.items()))
    failed = result.failed
    if failed:
        lines.append("")
        lines.append("APIs that fail against the float64 reference:")
        for call in failed[:max_rows]:
            where = "/".join(x for x in (f"step{call.step}" if call.step is not None else "", call.rank) if x)
            lines.append(f"  {call.key} (forward {call.forward}, backward {call.backward or '-'})"
                         + (f" [{where}]" if where else ""))
            lines.append(f"    {call.message[:400]}")
            if call.source:
                lines.append(f"    at {call.source}")
        if len(failed) > max_rows:
            lines.append(f"  ... {len(failed) - max_rows} more (see {result.files.get('result', 'the result CSV')})")
    skipped = result.summary()["skipped"]
    if skipped:
        lines.append("")
        lines.append("not replayed:")
        for s in skipped:
            keys = ", ".join(s["keys"][:3]) + (" ..." if s["count"] > 3 else "")
            lines.append(f"  {s['count']:>4} x {s['reason']}: {keys}")
    if result.files:
        lines.append("")
        lines.append(f"written: {result.files['result']}, {result.files['details']}, {result.files['summary']}")
    return "\n".join(lines)
