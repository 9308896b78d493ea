"""Step-time overhead of tsprobe on a torch.compile'd model (inductor on CPU), per compile mode
(``TSPROBE_COMPILE``: boundaries, modules, shadow) and level; ``eager``: the same model uncompiled.

Workload: 4 blocks of Linear(256)/LayerNorm/GELU + a head, batch 64, AdamW, one thread, process
CPU time. As in monitor_overhead.py, each worker process trains two identical models and
alternates their steps A B B A ...: A without the tool, B under ``PrecisionDebugger`` (start /
stop / step around every step; every step recorded, task statistics). A and B are instances of
two identical classes, so dynamo compiles each with its own hooks (it does not guard on hooks).
The first steps (compiling) are left out. Prints the median per-step CPU time B/A.

    python benchmarks/compile_overhead.py [--steps 20] [--modes eager,boundaries,modules] [--levels L0,mix]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

WARMUP = 3


def _models():
    import torch.nn as nn

    def block():
        return nn.Sequential(nn.Linear(256, 256), nn.LayerNorm(256), nn.GELU())

    class NetA(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([block() for _ in range(4)])
            self.head = nn.Linear(256, 16)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    class NetB(nn.Module):        # the same model, its own code: compiled separately
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([block() for _ in range(4)])
            self.head = nn.Linear(256, 16)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    return NetA, NetB


def _worker(mode: str, level: str, steps: int, out: str) -> None:
    os.environ["TSPROBE_QUIET"] = "1"
    os.environ["TSPROBE_COMPILE"] = "boundaries" if mode == "eager" else mode
    import torch
    import torch.nn.functional as F

    from ts_core import PrecisionDebugger

    torch.set_num_threads(1)
    NetA, NetB = _models()
    torch.manual_seed(0)
    a = NetA()
    b = NetB()
    b.load_state_dict(a.state_dict())
    ca, cb = (a, b) if mode == "eager" else (torch.compile(a), torch.compile(b))
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-3)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 16)
    dump = tempfile.mkdtemp(prefix="tscompile_")
    dbg = PrecisionDebugger(dump_path=dump, task="statistics", level=level)

    def plain() -> float:
        t0 = time.process_time()
        F.mse_loss(ca(x), y).backward()
        opt_a.step()
        opt_a.zero_grad()
        return time.process_time() - t0

    def tool() -> float:
        t0 = time.process_time()
        dbg.start(b)
        F.mse_loss(cb(x), y).backward()
        opt_b.step()
        opt_b.zero_grad()
        dbg.stop()
        dbg.step()
        return time.process_time() - t0

    ta, tb = [], []
    for i in range(steps + WARMUP):
        first, second = (plain, tool) if i % 2 == 0 else (tool, plain)
        r1, r2 = first(), second()
        if i >= WARMUP:
            (ta if first is plain else tb).append(r1)
            (tb if first is plain else ta).append(r2)
    dbg.close()
    shutil.rmtree(dump, ignore_errors=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"a": ta, "b": tb}, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--modes", default="eager,boundaries,modules")
    ap.add_argument("--levels", default="L0,mix")
    ap.add_argument("--worker", nargs=3, metavar=("MODE", "LEVEL", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker[0], args.worker[1], args.steps, args.worker[2])
        return
    print(f"{'mode':<11} {'level':<5} {'no tool ms':>10} {'tool ms':>8} {'ratio':>6}")
    for mode in args.modes.split(","):
        for level in args.levels.split(","):
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                out = f.name
            env = dict(os.environ, OMP_NUM_THREADS="1",
                       PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # this checkout
            subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--worker", mode, level, out],
                           check=True, env=env)
            with open(out, encoding="utf-8") as f:
                r = json.load(f)
            os.unlink(out)
            ma, mb = statistics.median(r["a"]), statistics.median(r["b"])
            print(f"{mode:<11} {level:<5} {ma * 1e3:>10.2f} {mb * 1e3:>8.2f} {mb / ma:>6.2f}")


if __name__ == "__main__":
    main()
