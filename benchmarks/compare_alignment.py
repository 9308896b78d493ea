"""How compare's alignment scales with the number of calls (issue 12: alignment by data flow
must stay near-linear on long sequences).

Builds two statistics dumps of N forward calls each (a transformer-like stream of
layer_norm / linear / gelu / silu / add calls; the target inserts one-sided no-op calls
(``contiguous``, ``view``) and writes every SiLU as ``sigmoid`` + ``mul``, so a gap has to be
resolved by data flow every few calls), runs ``compare()`` on them in this process and reports
seconds per 1000 calls, against a baseline measured in the same process: reading both
dump.json files and running the name-only ``matching.align`` on the two key lists.

    python benchmarks/compare_alignment.py [--calls 5000,10000,20000,40000]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ts_core.compare import compare  # noqa: E402
from ts_core.compare.align.matching import align  # noqa: E402
from ts_core.dumpfmt import reference_stats  # noqa: E402

LAYER = ("layer_norm", "linear", "silu", "linear", "__add__")


def _summary(a: np.ndarray) -> dict:
    return dict(type="torch.Tensor", dtype="torch.float32", shape=list(a.shape), requires_grad=False,
                **reference_stats(a))


def build(root: str, n_calls: int, target: bool) -> None:
    rng = np.random.default_rng(0)
    data, count = {}, {}

    def call(prefix: str, name: str, ins, out) -> None:
        k = count.get(name, 0)
        count[name] = k + 1
        data[f"{prefix}.{name}.{k}.forward"] = {"input_args": [_summary(x) for x in ins], "input_kwargs": {},
                                               "output": [_summary(out)]}

    x = rng.standard_normal((4, 8)).astype(np.float32)
    n = 0
    while n < n_calls:
        for op in LAYER:
            if op == "silu":
                if target:
                    s = 1 / (1 + np.exp(-x))
                    call("Torch", "sigmoid", [x], s)
                    y = (x * s).astype(np.float32)
                    call("Tensor", "__mul__", [x, s], y)
                    n += 1
                else:
                    y = (x / (1 + np.exp(-x))).astype(np.float32)
                    call("Functional", "silu", [x], y)
            elif op == "linear":
                w = rng.standard_normal((8, 8)).astype(np.float32) * 0.3
                y = (x @ w.T).astype(np.float32)
                call("Functional", "linear", [x, w], y)
            elif op == "layer_norm":
                y = ((x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)).astype(np.float32)
                call("Functional", "layer_norm", [x], y)
            else:
                y = (x + 0.1).astype(np.float32)
                call("Tensor", op, [x], y)
            x = y
            n += 1
            if target and n % 7 == 0:               # a one-sided no-op call
                call("Tensor", "contiguous" if n % 2 else "view", [x], x)
                n += 1
    rank = os.path.join(root, "step0", "rank")
    os.makedirs(rank)
    with open(os.path.join(rank, "dump.json"), "w") as f:
        json.dump({"task": "statistics", "level": "L1", "framework": "pytorch", "data": data}, f)


def baseline(g: str, t: str) -> float:
    t0 = time.perf_counter()
    keys = []
    for root in (g, t):
        with open(os.path.join(root, "step0", "rank", "dump.json")) as f:
            keys.append(list(json.load(f)["data"]))
    align(keys[0], keys[1])
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", default="5000,10000,20000,40000")
    args = p.parse_args()
    print(f"{'calls':>8} {'compare s':>10} {'s/1k calls':>11} {'baseline s':>11} {'ratio':>7}  first divergence")
    for n in (int(v) for v in args.calls.split(",")):
        work = tempfile.mkdtemp(prefix="tsalign_")
        try:
            g, t = os.path.join(work, "g"), os.path.join(work, "t")
            build(g, n, False)
            build(t, n, True)
            base = baseline(g, t)
            t0 = time.perf_counter()
            r = compare(g, t, verbose=False, html=False, workers=1)
            wall = time.perf_counter() - t0
            fd = r.first_divergence.key if r.first_divergence else "none"
            print(f"{n:>8} {wall:>10.2f} {1000 * wall / n:>11.3f} {base:>11.2f} {wall / base:>7.1f}  {fd}")
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
