"""Write compare.csv and summary.json (the terminal summary is ``text.terminal_text``)."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, List, Sequence

from ...dumpfmt import json_safe
from ...dumpfmt.jsonio import csv_value
from ..model import CSV_COLUMNS, CompareResult, Row
from .heatmap import heatmap
from .tree import trees

__all__ = ["write_csv", "write_summary", "csv_value"]


FIRST_DIVERGENCE_COLUMN = "first_divergence"


def write_csv(rows: List[Row], path: Path, first: Sequence[Any] = ()) -> None:
    """One row per compared value; numbers stay numbers (full precision, not formatted). The
    last column names both sides' calls (``golden <-> target``) on the row of each step/rank's
    first divergence (`first`: FirstDivergence objects)."""
    marks = {(fd.step, fd.rank, fd.tensor): fd.calls for fd in first if fd is not None}
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS + [FIRST_DIVERGENCE_COLUMN])
        for r in rows:
            mark = marks.pop((r.step, r.rank, r.name), "")
            w.writerow([csv_value(getattr(r, c)) for c in CSV_COLUMNS] + [mark])


def write_summary(result: CompareResult, path: Path) -> None:
    """summary.json: the result's summary, the diagnosis, and with several steps or ranks the
    step x rank x module grid report.html draws (``modules``)."""
    d = result.summary()
    d.setdefault("diagnosis", json_safe(list(getattr(result, "diagnosis", None) or [])))
    grid = heatmap(trees(result.pairs)) if len(result.pairs) > 1 else None
    if grid:
        d["modules"] = json_safe(grid)
    path.write_text(json.dumps(d, indent=2), encoding="utf-8")
