"""Helpers for the integration tests: a logging (real) debugger, dump readers, subprocesses."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Dict, List, Optional

from ts_core import PrecisionDebugger

from ..conftest import load_dump

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = os.path.join(ROOT, "recipes")


class SpyDebugger(PrecisionDebugger):
    """A real PrecisionDebugger that also appends ``start{N}``, ``stop`` and ``step{N}`` to
    `events` (a list shared with a recording callback), to check the exact hook order."""

    def __init__(self, events: list, **kwargs):
        super().__init__(**kwargs)
        self.events = events
        self._inside_step = False

    def start(self, model=None, token_range=None):
        self.events.append(f"start{self.current_step}")
        super().start(model, token_range=token_range)

    def stop(self):
        if not self._inside_step:          # step() calls stop() itself
            self.events.append("stop")
        super().stop()

    def step(self):
        self.events.append(f"step{self.current_step}")
        self._inside_step = True
        try:
            super().step()
        finally:
            self._inside_step = False


def step_dirs(dump_root: str) -> List[str]:
    return sorted(os.listdir(dump_root)) if os.path.isdir(dump_root) else []


def records(dump_root: str, step: int, rank: str = "rank") -> Dict[str, dict]:
    return load_dump(os.path.join(dump_root, f"step{step}", rank))["data"]


def keys_like(data: dict, prefix: str) -> List[str]:
    return [k for k in data if k.startswith(prefix)]


def param_grad_keys(data: dict) -> List[str]:
    return sorted(k for k in data if ".parameters_grad." in k)


def grad_norm(data: dict, key: str, name: str = "weight") -> float:
    return data[key][name][0]["Norm"]


def run(cmd: List[str], timeout: float, cwd: str, quiet: bool = True,
        env_extra: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run `cmd` in its own process group; on timeout kill the whole group (DDP children too)."""
    env = dict(os.environ)
    env.pop("TSPROBE_QUIET", None)
    if quiet:
        env["TSPROBE_QUIET"] = "1"
    env.update({"PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.update(env_extra or {})
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(cmd)} timed out after {timeout}s\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        _kill_tree(proc.pid)                # leftovers (a DDP worker) never outlive the test
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert result.returncode == 0, f"{' '.join(cmd)} failed ({result.returncode})\n{out[-3000:]}\n{err[-5000:]}"
    return result


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s process group and every descendant (torchrun starts its workers in
    sessions of their own, out of reach of killpg)."""
    try:
        import psutil

        kids = psutil.Process(pid).children(recursive=True)
    except Exception:
        kids = []
    for kid in kids:
        try:
            kid.kill()
        except Exception:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python() -> str:
    return sys.executable
