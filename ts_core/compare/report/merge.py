"""``tsprobe merge RESULT... -o OUT``: per-rank compare results (each the output folder of a
``tsprobe compare``, e.g. one per node) merged into one: compare.csv, summary.json with the
many-rank summary (ranks.json), report.html, and merged.csv, msprobe's merge table: one row per
compared value of the chosen APIs, one column per rank and metric (msprobe ``merge_result``'s
``api`` and ``compare_index``; its config yaml is read as is). The writing is ``api.write_merged``'s:
a report stage never imports the API above it.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ...dumpfmt import DumpFormatError, read_json
from ..explain.precedence import conclude
from ..explain.ranks import is_collective, rank_summary
from ..model import CSV_COLUMNS, CompareResult, FirstDivergence, PairResult, Row
from .files import csv_value

SUMMARY_JSON, COMPARE_CSV, MERGED_CSV = "summary.json", "compare.csv", "merged.csv"

# msprobe compare_index names -> compare.csv columns
MSPROBE_INDEX = {"Cosine": "cosine", "EucDist": "euclidean", "MaxAbsErr": "max_abs_err",
                 "MaxRelativeErr": "max_rel_err", "One Thousandth Err Ratio": "within_0_1pct",
                 "Five Thousandths Err Ratio": "within_0_5pct", "Max diff": "max_diff", "Min diff": "min_diff",
                 "Mean diff": "mean_diff", "L2norm diff": "norm_diff", "MinRelativeErr": "min_rel_diff",
                 "MeanRelativeErr": "mean_rel_diff", "NormRelativeErr": "norm_rel_diff", "Result": "verdict",
                 "Bench max": "golden_max", "Bench min": "golden_min", "Bench mean": "golden_mean",
                 "Bench l2norm": "golden_norm", "NPU max": "target_max", "NPU min": "target_min",
                 "NPU mean": "target_mean", "NPU l2norm": "target_norm"}
_STATS_FALLBACK = {"max_rel_err": "max_rel_diff"}       # statistics-mode spelling of MaxRelativeErr
_INT = {"step", "order", "golden_nan", "target_nan", "golden_inf", "target_inf"}
_LIST, _BOOL = {"golden_shape", "target_shape", "worst_index"}, {"md5_equal"}
_TEXT = {"rank", "direction", "golden_key", "target_key", "role", "arg", "name", "mode", "verdict", "reason",
         "golden_dtype", "target_dtype"}


def find_results(paths: Sequence["os.PathLike | str"]) -> List[Path]:
    """Compare output folders: each path is one (holds summary.json) or holds some below it."""
    found: List[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise DumpFormatError(f"{p}: no such file or directory")
        if (p / SUMMARY_JSON).is_file():
            found.append(p)
            continue
        below = sorted(d.parent for d in p.rglob(SUMMARY_JSON))
        if not below:
            raise DumpFormatError(f"{p}: holds no compare result (no {SUMMARY_JSON}; run tsprobe compare ... -o DIR)")
        found.extend(below)
    return found


def _cell(column: str, text: str) -> Any:
    if text == "":
        return None
    if column in _TEXT:
        return text
    if column in _INT:
        return int(text)
    if column in _BOOL:
        return text == "True"
    if column in _LIST:
        return json.loads(text)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return json.loads(text)
    except ValueError:
        return text


def load_result(folder: "os.PathLike | str") -> CompareResult:
    """A compare output folder (summary.json + compare.csv) back as a CompareResult."""
    folder = Path(folder)
    summary = read_json(folder / SUMMARY_JSON)
    if not isinstance(summary, dict) or "pairs" not in summary:
        raise DumpFormatError(f"{folder / SUMMARY_JSON}: not a tsprobe compare summary (no \"pairs\")")
    rows: List[Row] = []
    csv_path = folder / COMPARE_CSV
    if csv_path.is_file():
        with open(csv_path, newline="", encoding="utf-8") as f:
            for rec in csv.DictReader(f):
                rows.append(Row(**{c: _cell(c, rec.get(c, "")) for c in CSV_COLUMNS if c in rec}))
    fd_fields = {f.name for f in fields(FirstDivergence)}
    pairs = []
    for p in summary["pairs"]:
        fd = p.get("first_divergence")
        pairs.append(PairResult(
            step=p.get("step"), rank=p.get("rank", ""), golden=p.get("golden", ""), target=p.get("target", ""),
            rows=[r for r in rows if r.step == p.get("step") and r.rank == p.get("rank", "")],
            first_divergence=FirstDivergence(**{k: v for k, v in fd.items() if k in fd_fields}) if fd else None,
            note=p.get("note", ""), counts=p.get("counts", {}), modes=p.get("modes", []),
            warnings=p.get("warnings", []), timeline=p.get("timeline", {}), programs=p.get("programs", {}),
            diagnosis=p.get("diagnosis", [])))
    return conclude(CompareResult(golden=summary.get("golden", ""), target=summary.get("target", ""), pairs=pairs,
                                  unpaired_golden=summary.get("unpaired_golden", []),
                                  unpaired_target=summary.get("unpaired_target", []),
                                  tolerances=summary.get("tolerances", {}), options=summary.get("options", {})))


def merge_results(folders: Sequence["os.PathLike | str"]) -> CompareResult:
    """One CompareResult of several; a step/rank found in two results is an error."""
    found = find_results(folders)
    results = [load_result(f) for f in found]
    seen: Dict[tuple, str] = {}
    pairs: List[PairResult] = []
    for f, r in zip(found, results):
        for p in r.pairs:
            label = (p.step, p.rank)
            if label in seen:
                raise DumpFormatError(f"step {p.step} {p.rank or '(no rank)'} is in both {seen[label]} and {f}: "
                                      f"merge each rank's result once")
            seen[label] = str(f)
            pairs.append(p)
    pairs.sort(key=lambda p: (p.step if p.step is not None else -1, _rank_no(p.rank)))
    merged = CompareResult(
        golden=", ".join(sorted({r.golden for r in results})), target=", ".join(sorted({r.target for r in results})),
        pairs=pairs, unpaired_golden=[u for r in results for u in r.unpaired_golden],
        unpaired_target=[u for r in results for u in r.unpaired_target],
        tolerances=results[0].tolerances if results else {}, options=results[0].options if results else {})
    merged.ranks = rank_summary(merged)
    return conclude(merged)


def _rank_no(rank: str):
    digits = "".join(ch for ch in rank if ch.isdigit())
    return (int(digits) if digits else -1, rank)


def index_columns(names: Optional[Sequence[str]]) -> List[str]:
    """compare.csv columns for msprobe ``compare_index`` names or our own column names."""
    if not names:
        return ["verdict", "max_rel_err", "cosine", "max_rel_diff"]
    out = []
    for n in names:
        col = MSPROBE_INDEX.get(n, n)
        if col not in CSV_COLUMNS:
            raise ValueError(f"compare index {n!r}: use a compare.csv column ({', '.join(CSV_COLUMNS)}) or an "
                             f"msprobe name ({', '.join(MSPROBE_INDEX)})")
        out.append(col)
    return out


def merged_table(result: CompareResult, apis: Optional[Sequence[str]] = None,
                 index: Optional[Sequence[str]] = None) -> str:
    """merged.csv: rows are compared values of the listed APIs (``Distributed.all_reduce``;
    default: the collectives and each rank's first divergence), columns ``{rank}.{index}``."""
    cols = index_columns(index)
    ranks = sorted({p.rank for p in result.pairs}, key=_rank_no)
    wanted = set()
    if not apis:
        wanted = {p.first_divergence.key for p in result.pairs if p.first_divergence}
    table: Dict[tuple, Dict[str, Row]] = {}
    for p in result.pairs:
        for r in p.rows:
            key = r.golden_key or r.target_key or ""
            keep = any(f"{a}." in r.name for a in apis) if apis else (is_collective(key) or key in wanted)
            if keep:
                table.setdefault((r.step, r.name), {})[p.rank] = r
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["step", "name"] + [f"{rank}.{c}" for rank in ranks for c in cols])
    for (step, name), per_rank in table.items():
        w.writerow([csv_value(step), name] + [csv_value(_metric(per_rank[rank], c)) if rank in per_rank else ""
                                              for rank in ranks for c in cols])
    return buf.getvalue()


def _metric(row: Row, column: str) -> Any:
    v = getattr(row, column)
    if v is None and column in _STATS_FALLBACK:
        v = getattr(row, _STATS_FALLBACK[column])
    return v


def read_merge_config(path: "os.PathLike | str") -> Dict[str, List[str]]:
    """msprobe's merge_result config: ``api: [...]`` (required there) and ``compare_index: [...]``."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise DumpFormatError(f"{path}: cannot be read as yaml ({e})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("api", []), list) \
            or not isinstance(cfg.get("compare_index") or [], list):
        raise DumpFormatError(f"{path}: expected 'api: [API names]' and optionally 'compare_index: [metrics]'")
    return {"api": [str(a) for a in cfg.get("api") or []], "compare_index": [str(c) for c in cfg.get("compare_index") or []]}


__all__ = ["find_results", "load_result", "merge_results", "merged_table", "read_merge_config", "MSPROBE_INDEX",
           "MERGED_CSV", "SUMMARY_JSON"]
