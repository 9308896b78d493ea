"""Parallel-compare recipe: a single-device run against its DDP twin, faithful and with a bug on
one rank.

The same small model and the same data run once on one process (the whole batch) and once
under DDP on WORLD gloo CPU processes (each rank its 1/WORLD of the batch: split batch). Then
``compare(SINGLE, DDP)`` pairs the 1-rank dump with the WORLD-rank one through a rank layout:
the ranks' batch shards are merged, the replicated parameters and reduced gradients are compared
rank by rank, and the verdict says whether the runs differ only by reduction order. With
``--bad-rank R`` rank R's copy of the first layer's weight is scaled by 1.01 after DDP was set up
(replicas drift apart): the compare names the op and the rank, and the replica check names the
parameter. With ``--against-world M`` the same global batch also runs under DDP on M ranks and
``compare(DDP_WORLD, DDP_M)`` compares N ranks against M: both dumps are reduced to the global
(single-run) view and compared; a bad rank is named with its side ("golden rank1"). Runs on CPU.

    python recipes/parallel_compare_recipe.py [--world 2] [--bad-rank 1] [--against-world 4] [--dump-path DIR]
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from ts_core import PrecisionDebugger
from ts_core.compare import compare

PER_RANK = 4


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def shard(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(PER_RANK, 8, generator=g), torch.randn(PER_RANK, 4, generator=g)


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dump: str) -> None:
    debugger = PrecisionDebugger(dump_path=dump, task="statistics", level="mix", step=[0])
    debugger.start(model)
    F.mse_loss(model(x), y).backward()
    debugger.record_param_grads()          # .grad as the optimizer sees it: reduced across ranks
    debugger.stop()
    debugger.step()
    debugger.close()


def global_batch(shards: int):
    """The whole batch: `shards` blocks of PER_RANK samples (what the single run sees)."""
    parts = [shard(r) for r in range(shards)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def worker(rank: int, world: int, dump: str, bad: int, port: int, shards: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TSPROBE_QUIET="1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(make_model())
    if rank == bad:                         # this rank's replica drifts apart
        with torch.no_grad():
            model.module[0].weight.mul_(1.01)
    x, y = global_batch(shards)
    rows = len(x) // world                  # this rank's part of the global batch
    train_step(model, x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows], dump)
    dist.destroy_process_group()


def launch(world: int, dump: str, bad: int, shards: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world, dump, bad, port, shards), nprocs=world)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--bad-rank", type=int, default=-1, help="the rank whose replica is perturbed (-1: none)")
    ap.add_argument("--against-world", type=int, default=0,
                    help="also run DDP on M ranks (M divides the global batch) and compare WORLD ranks against M")
    ap.add_argument("--dump-path", default="parallel_compare_dump")
    args = ap.parse_args()
    os.environ["TSPROBE_QUIET"] = "1"
    single, ddp = os.path.join(args.dump_path, "single"), os.path.join(args.dump_path, "ddp")
    train_step(make_model(), *global_batch(args.world), single)    # the single run sees every rank's shard
    launch(args.world, ddp, args.bad_rank, args.world)
    compare(single, ddp, os.path.join(args.dump_path, "compare"), html=False, workers=1)
    if args.against_world:
        other = os.path.join(args.dump_path, f"ddp{args.against_world}")
        launch(args.against_world, other, -1, args.world)
        compare(ddp, other, os.path.join(args.dump_path, "compare_n_vs_m"), html=False, workers=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
