"""Step-time overhead of tsprobe under real parallel stacks: FSDP2 (``fully_shard`` per block) and
tensor parallel (``parallelize_module``), 2 gloo processes on CPU.

Each rank trains the same model once per mode, modes interleaved over rounds, and measures the
*process CPU time* of each step (wall time is noisy on a shared 2-core machine; collectives
wait in wall time, not CPU); rank 0 prints the mean step of each mode and its ratio to the
no-tool mode of the same run.

    python -m torch.distributed.run --nproc_per_node 2 benchmarks/stacks_overhead.py \
        [--stack fsdp2|tp] [--steps 6] [--rounds 2] [--size 4x256]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TSPROBE_QUIET", "1")       # no "step N dumped" line per step

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests", "distributed"))
from stack_worker import TinyLM, batch, build  # noqa: E402

MODES = {"no tool": None, "statistics L0": ("L0", "statistics"), "statistics L1": ("L1", "statistics"),
         "statistics mix": ("mix", "statistics"), "md5 mix": ("mix", "md5")}
WARMUP = 1


def measure(stack: str, mode, steps: int, size: str, root: str) -> list:
    from ts_core import PrecisionDebugger

    layers, width = (int(x) for x in size.split("x"))
    model, same = build(stack, dist.get_world_size(), TinyLM(width, 4 * width, 4096, layers))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    debugger = None
    if mode is not None:
        level, summary = mode
        debugger = PrecisionDebugger(dump_path=os.path.join(root, f"{level}-{summary}"), task="statistics",
                                     level=level, step=list(range(WARMUP + steps)),
                                     **({"summary_mode": "md5"} if summary == "md5" else {}))
    times = []
    for step in range(WARMUP + steps):
        tokens, labels = batch(step, dist.get_rank(), same)
        tokens = tokens.repeat(2, 16)         # [8, 128]
        labels = labels.repeat(2, 16)
        start = time.process_time()
        if debugger is not None:
            debugger.start(model)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
        loss.backward()
        if debugger is not None:
            debugger.stop()
        opt.step()
        opt.zero_grad()
        if debugger is not None:
            debugger.step()
        if step >= WARMUP:
            times.append(time.process_time() - start)
    if debugger is not None:
        debugger.close()
    dist.barrier()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stack", default="fsdp2", choices=["fsdp2", "tp"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--size", default="4x256", help="LAYERSxWIDTH")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="tsprobe-stacks-bench-")
    results = {name: [] for name in MODES}
    for _ in range(args.rounds):
        for name, mode in MODES.items():
            results[name] += measure(args.stack, mode, args.steps, args.size, root)
    if dist.get_rank() == 0:
        base = statistics.mean(results["no tool"])
        print(f"{args.stack}, {args.size}, 2 ranks, {args.rounds} x {args.steps} steps (process CPU per step, rank 0)")
        for name, times in results.items():
            mean = statistics.mean(times)
            print(f"  {name:16s} {mean * 1e3:8.1f} ms   {mean / base:5.2f}x")
        shutil.rmtree(root, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
