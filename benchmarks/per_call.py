"""Cost of one recorded API call: tsprobe against the minimal recorder (minimal_recorder.py).

Three calls on 8x8 float32 tensors, 2,000 of them per measure, statistics at L1: ``torch.add``
with no input requiring grad, an in-place ``mul_`` under ``no_grad`` (what an optimizer's step
calls) and ``torch.add`` with an input requiring grad (a forward call of training). Each
(recorder, call) runs in its own process, recorders alternating over rounds; the figure is the
median process CPU time per call, and the same call with no recorder is the baseline.

    python benchmarks/per_call.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CASES = ("no grad", "in-place, no_grad", "input requires grad")
RECORDERS = ("none", "tsprobe", "minimal")

_WORKER = r'''
import json, os, statistics, sys, tempfile, time
import torch
here = sys.argv[3]
sys.path.insert(0, here)
sys.path.insert(0, os.path.dirname(here))
os.environ["TSPROBE_QUIET"] = "1"
torch.set_num_threads(1)
recorder, case = sys.argv[1], sys.argv[2]
folder = tempfile.mkdtemp(prefix="tspercall_")
if recorder == "minimal":
    from minimal_recorder import MinimalRecorder
    rec = MinimalRecorder(folder)
elif recorder == "tsprobe":
    from ts_core import PrecisionDebugger
    rec = PrecisionDebugger(dump_path=folder, level="L1", step=[])
a = torch.randn(8, 8, requires_grad=case == "input requires grad")
b, x = torch.randn(8, 8), torch.randn(8, 8)


def calls(n):
    if case == "in-place, no_grad":
        with torch.no_grad():
            for _ in range(n):
                x.mul_(0.999)
    elif case == "input requires grad":
        for _ in range(n):
            torch.add(a, b)
    else:
        for _ in range(n):
            torch.add(x, b)


per_call = []
for _ in range(5):
    if recorder != "none":
        rec.start()
    t0 = time.process_time()
    calls(2000)
    per_call.append((time.process_time() - t0) / 2000 * 1e6)
    if recorder != "none":
        rec.stop()
        rec.step()
print(json.dumps(statistics.median(per_call)))
if recorder == "tsprobe":
    rec.close()
import shutil
shutil.rmtree(folder, ignore_errors=True)
'''


def measure(recorder: str, case: str) -> float:
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", _WORKER, recorder, case, here], check=True, capture_output=True,
                         text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    results = {(r, c): [] for r in RECORDERS for c in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            for recorder in RECORDERS:
                results[recorder, case].append(measure(recorder, case))
    print("| call | no recorder us | tsprobe us (x no recorder) | minimal us (x no recorder) | tsprobe - minimal us |")
    print("|---|---|---|---|---|")
    for case in CASES:
        base, ts, mini = (statistics.median(results[r, case]) for r in RECORDERS)
        print(f"| {case} | {base:.2f} | {ts:.2f} ({ts / base:.1f}x) | {mini:.2f} ({mini / base:.1f}x) | {ts - mini:+.2f} |")


if __name__ == "__main__":
    main()
