"""Many-ranks recipe: compare an N-rank run, find the rank that diverged first and the
collective that carried its difference to the others; merge per-rank results.

WORLD gloo CPU processes (torch.multiprocessing) run one step each: a first layer on the
rank's own data, an all_reduce of its activations (as tensor parallelism does), the rest,
then an all_reduce of the gradients. The target run has a faulty F.linear (1% off) on one
rank. `compare` of the two dumps compares every rank in parallel and says which rank
diverged first and through which collective the others received it; report.html's model tree
has a step/rank selector. Then the same from per-rank compares (one per node, as on a cluster)
merged with `tsprobe merge`. Runs on CPU.

    python recipes/many_ranks_recipe.py [--world 4] [--bad-rank 2] [--dump-path DIR]
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from ts_core import PrecisionDebugger
from ts_core.compare import compare


def worker(rank: int, world: int, root: str, bad: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TSPROBE_QUIET="1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(8, 16), nn.Linear(16, 4)
    model = nn.Sequential(fc1, nn.GELU(), fc2)
    torch.manual_seed(100 + rank)
    x = torch.randn(4, 8)
    if rank == bad:                                   # the faulty kernel on one device
        linear = F.linear
        F.linear = lambda i, w, b=None: linear(i, w, b) * 1.01
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=root, step=[0])
    debugger.start(model)
    h = fc1(x)
    with torch.no_grad():                            # summed in place; autograd sees the identity
        dist.all_reduce(h)
    y = fc2(F.gelu(h))
    y.pow(2).mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    debugger.stop()
    debugger.step()
    debugger.close()
    dist.barrier()
    dist.destroy_process_group()


def run(root: str, world: int, bad: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world, root, bad, port), nprocs=world)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--bad-rank", type=int, default=2)
    p.add_argument("--dump-path", default=os.path.join("dump_output", "many_ranks"))
    args = p.parse_args(argv)
    golden, target = os.path.join(args.dump_path, "golden"), os.path.join(args.dump_path, "target")
    run(golden, args.world, -1)
    run(target, args.world, args.bad_rank)

    out = os.path.join(args.dump_path, "compare")
    result = compare(golden, target, out, verbose=False)
    step = result.ranks["steps"][0]
    print(f"diverged first: {step['diverged_first']} -- {step['explanation']}")
    print(f"report with the model tree and a step/rank selector: {result.report_path}")

    # one compare per rank (as on separate nodes), then merged
    per_rank = os.path.join(args.dump_path, "per_rank")
    for r in range(args.world):
        compare(os.path.join(golden, "step0", f"rank{r}"), os.path.join(target, "step0", f"rank{r}"),
                os.path.join(per_rank, f"rank{r}"), verbose=False, html=False)
    merged = os.path.join(args.dump_path, "merged")
    subprocess.run([sys.executable, "-m", "ts_core.cli", "merge", per_rank, "-o", merged, "--api",
                    "Distributed.all_reduce", "--index", "Max diff", "MaxRelativeErr"], check=True)
    print(f"merged: {os.path.join(merged, 'ranks.json')}, {os.path.join(merged, 'merged.csv')}")


if __name__ == "__main__":
    main()
