"""acc-check of a MindSpore dump (in a child process: MindSpore and torch apart)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ..conftest import require

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.slow, require("mindspore")]


def _run(tmp_path, *extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "tests.acccheck.ms_run", str(tmp_path / "dump"), *extra],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_mindspore_clean_run(tmp_path):
    out = _run(tmp_path)
    calls = out["calls"]
    assert calls["Functional.gelu.0.forward"][0] == "pass"
    assert calls["Mint.matmul.0.forward"][0] == "pass"
    assert calls["Functional.softmax.0.forward"][0] == "pass"
    assert out["summary"]["counts"]["error"] == 0
    # Dense runs through Primitives (MatMul, BiasAdd): listed, with the reason
    prims = {k: v for k, v in calls.items() if k.startswith("Primitive.")}
    assert prims and all(v[0] == "skip" and "Primitive" in v[2] for v in prims.values())
    assert all(v[1] in ("", "skip") for v in calls.values())             # backward: said, not graded


def test_mindspore_inaccurate_gelu(tmp_path):
    out = _run(tmp_path, "bad")
    failed = [f["key"] for f in out["summary"]["failed"]]
    assert failed == ["Functional.gelu.0.forward"]
