"""``compare_npy_dir``: TroubleShooter's batch comparison of two folders of .npy files."""
from __future__ import annotations

import csv
import math
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..dumpfmt import DumpFormatError
from ..compare.judge.metrics import compare_arrays


@dataclass
class NpyCompareRow:
    orig_name: Optional[str]
    target_name: Optional[str]
    orig_shape: Optional[tuple]
    target_shape: Optional[tuple]
    allclose: bool
    allclose_ratio: float
    cosine: float
    mean_diff: float
    max_diff: float
    note: str = ""

    @property
    def result(self) -> str:
        """The 'result of allclose' cell: True/False, or why nothing was compared."""
        return self.note or str(self.allclose)


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _npy_names(d: Path) -> List[str]:
    return sorted((p.name for p in d.iterdir() if p.is_file() and p.suffix == ".npy"), key=_natural)


def get_name_map_list_by_name(orig_dir: str, target_dir: str) -> List[Tuple[Optional[str], Optional[str]]]:
    """Pair files whose names are identical; the others are paired with None."""
    orig, target = _npy_names(Path(orig_dir)), _npy_names(Path(target_dir))
    tset = set(target)
    pairs = [(n, n if n in tset else None) for n in orig]
    oset = set(orig)
    pairs += [(None, n) for n in target if n not in oset]
    return pairs


def _load(d: Path, name: Optional[str]):
    if name is None:
        return None, ""
    p = d / name
    if not p.is_file():
        return None, f"missing file {p}"
    try:
        return np.load(p, mmap_mode="r", allow_pickle=False), ""
    except Exception as e:  # corrupt file or pickled objects: reported in the row
        return None, f"cannot read {p} ({type(e).__name__})"


def _compare_one(args) -> NpyCompareRow:
    orig_dir, target_dir, (on, tn), rtol, atol, equal_nan = args
    a, ea = _load(Path(orig_dir), on)
    b, eb = _load(Path(target_dir), tn)
    nan = math.nan
    shapes = (tuple(a.shape) if a is not None else None, tuple(b.shape) if b is not None else None)
    if a is None or b is None:
        return NpyCompareRow(on, tn, *shapes, False, 0.0, nan, nan, nan, ea or eb or "")
    if a.shape != b.shape:
        return NpyCompareRow(on, tn, *shapes, False, 0.0, nan, nan, nan, "Shape is inconsistent")
    m = compare_arrays(a, b, rtol, atol, equal_nan=equal_nan)
    ok = m.allclose_ratio >= 1.0
    cos = m.cosine if m.cosine is not None else nan
    return NpyCompareRow(on, tn, *shapes, ok, m.allclose_ratio, cos, m.mean_abs_err, m.max_abs_err)


def compare_npy_dir(orig_dir: str, target_dir: str, rtol: float = 1e-4, atol: float = 1e-4,
                    equal_nan: bool = False, *, name_map_list: Optional[Sequence[Tuple[Optional[str], Optional[str]]]] = None,
                    compare_shape: bool = False, output_file: Optional[str] = None,
                    num_processes: Optional[int] = None) -> List[NpyCompareRow]:
    """Compare every .npy in ``orig_dir`` with its partner in ``target_dir`` (TroubleShooter contract).

    Files pair by identical name unless ``name_map_list`` ([(orig_file, target_file), ...],
    either may be None) says otherwise. Prints a table (allclose, its ratio, cosine,
    mean/max absolute difference; shapes with ``compare_shape``) and, with
    ``output_file``, writes it as CSV with numeric columns. Returns the rows.
    """
    for d, what in ((orig_dir, "orig_dir"), (target_dir, "target_dir")):
        if d is None or not Path(d).is_dir():
            raise DumpFormatError(f"{what} {d!r} is not a directory")
    if name_map_list is None:
        name_map_list = get_name_map_list_by_name(orig_dir, target_dir)
        if not name_map_list:
            raise DumpFormatError(f"no .npy files in {orig_dir} or {target_dir}")
    jobs = [(str(orig_dir), str(target_dir), tuple(p), rtol, atol, equal_nan) for p in name_map_list]
    if num_processes and num_processes > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=num_processes) as pool:
            rows = list(pool.map(_compare_one, jobs))
    else:
        rows = [_compare_one(j) for j in jobs]
    print(f"The orig dir: {orig_dir}\nThe target dir: {target_dir}")
    print(format_table(rows, compare_shape))
    if output_file:
        write_npy_csv(rows, output_file, compare_shape)
    return rows


def _headers(compare_shape: bool) -> List[str]:
    h = ["orig array name", "target array name"]
    if compare_shape:
        h += ["shape of orig", "shape of target"]
    return h + ["result of allclose", "ratio of allclose", "cosine similarity", "mean & max diffs"]


def format_table(rows: List[NpyCompareRow], compare_shape: bool = False) -> str:
    head = _headers(compare_shape)
    body = []
    for r in rows:
        cells = [str(r.orig_name), str(r.target_name)]
        if compare_shape:
            cells += [str(r.orig_shape), str(r.target_shape)]
        cells += [r.result, f"{100 * r.allclose_ratio:.2f}%", f"{r.cosine:.5f}", f"{r.mean_diff:.5f}, {r.max_diff:.5f}"]
        body.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in body)) if body else len(h) for i, h in enumerate(head)]
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    line = lambda cells: "|" + "|".join(f" {c:^{w}} " for c, w in zip(cells, widths)) + "|"
    title = "The list of comparison results"
    inner = len(sep) - 2
    return "\n".join(["+" + "-" * inner + "+", "|" + f"{title:^{inner}}" + "|", sep, line(head), sep]
                     + [line(c) for c in body] + [sep])


def write_npy_csv(rows: List[NpyCompareRow], path: str, compare_shape: bool = False) -> None:
    """CSV with numbers as numbers: the 'mean & max diffs' cell is split into two columns."""
    head = _headers(compare_shape)[:-1] + ["mean diff", "max diff"]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(head)
        for r in rows:
            cells = [r.orig_name or "", r.target_name or ""]
            if compare_shape:
                cells += [list(r.orig_shape) if r.orig_shape is not None else "",
                          list(r.target_shape) if r.target_shape is not None else ""]
            cells += [r.result, r.allclose_ratio, r.cosine, r.mean_diff, r.max_diff]
            w.writerow(cells)
