"""mindstudio-probe (msprobe) as the reference: a script run in a fresh interpreter (msprobe
patches torch for good; our debugger must not meet it), on the test's own models."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PRELUDE = ("import sys, json, torch\n"
            f"sys.path.insert(0, {ROOT!r})\n"
            "from msprobe.pytorch import PrecisionDebugger, module_dump, module_dump_end\n")


def run_msprobe(config: dict, body: str, workdir: "os.PathLike | str", args: Sequence[str] = (),
                name: str = "msprobe") -> str:
    """Write `config` (its ``dump_path`` defaults to ``workdir/name``), run `body` with ``d`` the
    msprobe debugger made from it (``sys.argv[1:]`` = `args`); returns the dump_path."""
    workdir = os.fspath(workdir)
    config = dict(config)
    config.setdefault("dump_path", os.path.join(workdir, name))
    path = os.path.join(workdir, f"{name}_config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    script = _PRELUDE + f"d = PrecisionDebugger(config_path={path!r})\n" + body
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return config["dump_path"]


def msprobe_rank_dir(dump_path: str, step: int = 0) -> str:
    """The one rank folder of a step (msprobe names it proc{PID} when not distributed)."""
    found = glob.glob(os.path.join(dump_path, f"step{step}", "*", "dump.json"))
    assert len(found) == 1, found
    return os.path.dirname(found[0])


def msprobe_json(dump_path: str, name: str = "dump.json", step: int = 0) -> dict:
    with open(os.path.join(msprobe_rank_dir(dump_path, step), name), encoding="utf-8") as f:
        return json.load(f)
