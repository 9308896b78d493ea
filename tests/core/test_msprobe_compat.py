"""Our dump.json loads in msprobe's own compare (mindstudio-probe 26.2.0)."""
import csv
import glob
import os
import shutil
import subprocess

import pytest

from ts_core import PrecisionDebugger

from ..conftest import load_dump, require
from .models import train_steps


def _count_tensors(obj):
    if isinstance(obj, dict):
        if obj.get("type") == "torch.Tensor":
            return 1
        return sum(_count_tensors(v) for v in obj.values())
    if isinstance(obj, list):
        return sum(_count_tensors(v) for v in obj)
    return 0


@require("msprobe")
def test_msprobe_compare_reads_our_statistics_dump(tmp_path):
    msprobe = shutil.which("msprobe") or os.path.join(os.path.dirname(os.sys.executable), "msprobe")
    roots = []
    for run in ("a", "b"):
        root = str(tmp_path / run)
        dbg = PrecisionDebugger(dump_path=root, task="statistics", level="mix", step=[0])
        train_steps("cnn", dbg, steps=1)
        dbg.close()
        roots.append(root)
    out = str(tmp_path / "out")
    proc = subprocess.run([msprobe, "compare", "-tp", os.path.join(roots[1], "step0"),
                           "-gp", os.path.join(roots[0], "step0"), "-o", out],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result, = glob.glob(os.path.join(out, "*.csv"))
    rows = list(csv.DictReader(open(result, encoding="utf-8")))
    expected = _count_tensors(load_dump(os.path.join(roots[0], "step0", "rank"))["data"])
    tensor_rows = [r for r in rows if r["NPU Dtype"].startswith("torch.")]
    assert len(tensor_rows) == expected > 50
    assert {r["Result"] for r in rows} == {"pass"}
    assert any(r["NPU Name"].startswith("Module.conv.Conv2d.parameters_grad.0.weight") for r in rows)
