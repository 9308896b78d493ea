"""Monitor mode in a plain PyTorch loop, alone or under DDP: a NaN injected at a known module,
step and rank is caught at that step, named, and dumped; training stops on every rank.

    python recipes/monitor_ddp_recipe.py [--dump-path DIR] [--nan-step 3] [--nan-rank 1]
    python -m torch.distributed.run --nproc_per_node 2 recipes/monitor_ddp_recipe.py ...   (gloo, CPU)

Each rank trains a small MLP (``Poison`` makes its output NaN at `--nan-step` on `--nan-rank`
only) under ``PrecisionDebugger(monitor={"on_trigger": "stop", ...})``. What each rank sees:

* the poisoned rank: a module output holding NaN -- it names ``Module.module.poison...forward``;
* the other ranks: their forward is clean, but DDP averages the poisoned rank's NaN gradients
  into theirs during backward. ``debugger.record_param_grads()`` after ``backward()`` reads the
  averaged gradients, so every rank triggers at the same step (its first NaN: a parameter
  gradient) and ``on_trigger: stop`` stops every rank there. The monitor makes no collective
  call of its own; without ``record_param_grads()`` the other ranks would see only their local
  gradients and trigger one step later (NaN parameters), after the poisoned rank stopped --
  a hang in the next all-reduce.
"""
from __future__ import annotations

import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ts_core import PrecisionDebugger


class Poison(nn.Module):
    """Identity, except when `armed` is set: then its output is NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * math.nan if self.armed else x


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.poison = Poison()
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.poison(torch.relu(self.fc1(x))))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump-path", default=os.path.join("dump_output", "monitor_ddp"))
    p.add_argument("--nan-step", type=int, default=3)
    p.add_argument("--nan-rank", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=8)
    args = p.parse_args(argv)

    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        import datetime

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    inner = MLP()
    model = nn.parallel.DistributedDataParallel(inner) if distributed else inner
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)                 # each rank its own data shard
    batches = [(torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)) for _ in range(args.max_steps)]

    debugger = PrecisionDebugger(dump_path=args.dump_path,
                                 monitor={"keep_steps": 2, "on_trigger": "stop", "loss_spike": None})
    steps = 0
    for step, (x, y) in enumerate(batches):
        inner.poison.armed = step == args.nan_step and rank == args.nan_rank
        debugger.start(model)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        debugger.record_param_grads()          # the all-reduced gradients (DDP averaged them in backward)
        debugger.stop()
        optimizer.step()
        optimizer.zero_grad()
        debugger.step(loss=loss)
        steps += 1
        if debugger.should_stop:
            break
    debugger.close()
    print(f"rank {rank}: {steps} steps, captures at {[c['step'] for c in debugger.monitor.captures]}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
