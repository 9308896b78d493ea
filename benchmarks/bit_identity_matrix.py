"""Bit-identity matrix: architecture x level x task -> identical, or the largest |diff|.

One AdamW step of each tiny transformers model (tests/zoo/models.py) without the tool, then
with the tool at each level/task; loss, gradients and updated parameters are compared with
``torch.equal``. Prints a table (and writes it as JSON with ``--json``).

    python benchmarks/bit_identity_matrix.py [--archs llama,bert] [--levels L0,L1,mix,debug]
                                             [--tasks statistics,tensor,md5] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TSPROBE_QUIET", "1")

LEVELS = ("L0", "L1", "mix", "debug")
TASKS = ("statistics", "tensor", "md5")


def debugger_for(dump_path: str, level: str, task: str):
    from ts_core import PrecisionDebugger

    extra = {"summary_mode": "md5"} if task == "md5" else {}
    return PrecisionDebugger(dump_path=dump_path, task="statistics" if task == "md5" else task,
                             level=level, step=[0], **extra)


def main() -> None:
    from tests.zoo.harness import differences, train_step
    from tests.zoo.models import ARCHS

    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--levels", default=",".join(LEVELS))
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--json")
    a = ap.parse_args()
    archs, levels, tasks = a.archs.split(","), a.levels.split(","), a.tasks.split(",")
    cols = [(lv, tk) for lv in levels for tk in tasks]
    print(f"{'arch':12s} " + " ".join(f"{lv + '/' + tk:>16s}" for lv, tk in cols), flush=True)
    table = {}
    for arch in archs:
        ref = train_step(arch)
        row = {}
        for lv, tk in cols:
            tmp = tempfile.mkdtemp(prefix="tsprobe_matrix_")
            t0 = time.perf_counter()
            try:
                dbg = debugger_for(tmp, lv, tk)
                got = train_step(arch, dbg, save_all=lv == "debug")
                dbg.close()
                diffs = differences(ref, got)
                row[f"{lv}/{tk}"] = {"identical": not diffs, "max_abs_diff": max((d for _, d in diffs), default=0.0),
                                     "different": len(diffs), "seconds": round(time.perf_counter() - t0, 2)}
            except Exception as e:                                  # a crash is a result too
                row[f"{lv}/{tk}"] = {"identical": False, "error": f"{type(e).__name__}: {e}"[:200]}
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        table[arch] = row
        print(f"{arch:12s} " + " ".join(f"{_cell(row[f'{lv}/{tk}']):>16s}" for lv, tk in cols), flush=True)
    bad = sum(not c["identical"] for r in table.values() for c in r.values())
    print(f"{len(archs) * len(cols) - bad}/{len(archs) * len(cols)} identical")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=1)


def _cell(c: dict) -> str:
    if "error" in c:
        return "CRASH"
    return "identical" if c["identical"] else f"{c['max_abs_diff']:.1e}"


if __name__ == "__main__":
    main()
