"""The mindtorch tests (seed 002's MSAdapter scenario): the same models train on real PyTorch
(this venv) and on mindtorch (``.venv-mindtorch``, built by ``make mindtorch-venv``), each under
a PrecisionDebugger, each side in a child process (run_side.py), both at once; the compare runs
here. The mindtorch venv missing is a failure, not a skip: ``make test`` builds it. The one skip:
requirements/install_mindtorch.sh found that pip cannot get a pinned wheel on this machine and
said why in ``.venv-mindtorch/UNBUILDABLE``; the skip quotes it."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List

import pytest

from .jobs import both_sides_jobs, mindtorch_only_jobs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MT_VENV = os.path.join(ROOT, ".venv-mindtorch")
MT_PYTHON = os.path.join(MT_VENV, "bin", "python")


@dataclass
class Runs:
    root: str
    results: Dict[str, Dict[str, dict]] = field(default_factory=dict)     # side -> job id -> result

    def rank_dir(self, side: str, job_id: str, step: int = 0) -> str:
        return os.path.join(self.root, side, job_id, f"step{step}", "rank")

    def step_dir(self, side: str, job_id: str, step: int = 0) -> str:
        return os.path.join(self.root, side, job_id, f"step{step}")

    def result(self, side: str, job_id: str) -> dict:
        return self.results[side][job_id]


def mindtorch_python() -> str:
    """The mindtorch venv's python; skips only where the install script recorded that the venv
    cannot be built on this machine, fails when it was not built or not completed."""
    unbuildable = os.path.join(MT_VENV, "UNBUILDABLE")
    if os.path.isfile(unbuildable):
        with open(unbuildable, encoding="utf-8") as f:
            pytest.skip(f"{unbuildable}: " + " ".join(f.read().split()))
    build = "build it with `make mindtorch-venv` (requirements/install_mindtorch.sh, needs the package index)"
    if not os.access(MT_PYTHON, os.X_OK):
        pytest.fail(f"{MT_PYTHON} is missing: the mindtorch tests need the mindtorch venv; {build}.", pytrace=False)
    if not glob.glob(os.path.join(MT_VENV, ".mindtorch-*.ok")):
        pytest.fail(f"{MT_VENV} is not completely installed (no .mindtorch-*.ok stamp): {build}.", pytrace=False)
    return MT_PYTHON


def _start(python: str, side: str, root: str, jobs: List[dict]) -> subprocess.Popen:
    for job in jobs:
        if "model" in job and job.get("level"):
            job["out"] = os.path.join(root, side, job["id"])
    env = dict(os.environ, TSPROBE_QUIET="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    return subprocess.Popen([python, "-m", "tests.mindtorch.run_side", side, root, json.dumps(jobs)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, side: str) -> Dict[str, dict]:
    try:
        out, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, f"{side} side failed (rc {proc.returncode}):\n{out[-3000:]}\n{err[-6000:]}"
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    """Every dump of the mindtorch tests, made once: the torch side and the mindtorch side run in
    parallel from the same weights (written here with real torch)."""
    python = mindtorch_python()
    from . import models

    root = str(tmp_path_factory.mktemp("mindtorch"))
    models.write_weights(root)
    procs = {"torch": _start(sys.executable, "torch", root, both_sides_jobs()),
             "mindtorch": _start(python, "mindtorch", root, both_sides_jobs() + mindtorch_only_jobs())}
    return Runs(root, {side: _finish(proc, side) for side, proc in procs.items()})
