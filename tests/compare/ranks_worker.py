"""A data-parallel step on WORLD gloo CPU processes, dumped: each rank computes a first layer,
the activations are summed across ranks (all_reduce, as tensor parallelism does), then the rest;
after backward the gradients are all-reduced. With BAD >= 0, that rank's F.linear is 1% off
(a faulty kernel on one device).

    python tests/compare/ranks_worker.py DUMP WORLD BAD PORT
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from ts_core import PrecisionDebugger


def worker(rank: int, world: int, root: str, bad: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(8, 16), nn.Linear(16, 4)
    model = nn.Sequential(fc1, nn.GELU(), fc2)
    torch.manual_seed(100 + rank)                    # each rank its own data shard
    x = torch.randn(4, 8)
    if rank == bad:
        linear = F.linear
        F.linear = lambda i, w, b=None: linear(i, w, b) * 1.01
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=root, step=[0])
    dbg.start(model)
    h = fc1(x)
    with torch.no_grad():                            # summed in place; autograd sees the identity
        dist.all_reduce(h)
    y = fc2(F.gelu(h))
    y.pow(2).mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    dbg.stop()
    dbg.step()
    dbg.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    dump, world, bad, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    mp.spawn(worker, args=(world, dump, bad, port), nprocs=world)
