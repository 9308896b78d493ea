"""accelerate recipe: dump steps of a hand-written accelerate loop with `collect`.

A tiny MLP trains for 4 optimizer steps with gradient accumulation 2 (8 micro-batches); the
steps listed in configs/statistics_mix.yaml (0 and 1) are dumped, each with both
micro-batches' forward and backward and one parameters_grad per module. Runs on CPU.

    python recipes/accelerate_recipe.py [--dump-path DIR] [--mixed-precision bf16]
    accelerate launch --multi_gpu --num_processes 2 recipes/accelerate_recipe.py   # rank0 + rank1

On a machine without GPUs the second line starts two CPU processes (torchrun, gloo). Note that
in accelerate 1.15 `accelerate launch --num_processes 2 --cpu` starts ONE process unless MPI is
set up (`--mpirun_hostfile`); this script asks for the CPU itself (`Accelerator(cpu=True)`).

The three lines a user adds are marked (1) (2) (3).
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from ts_core.compare import summarize, summary_text  # `tsprobe summary`
from ts_core import PrecisionDebugger
from ts_integrations.accelerate import collect                                # (1)

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, os.pardir, "configs", "statistics_mix.yaml")


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump-path", default=os.path.join("dump_output", "accelerate"))
    p.add_argument("--mixed-precision", default=None, choices=["no", "bf16"])
    p.add_argument("--max-steps", type=int, default=4)
    args = p.parse_args(argv)

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2, mixed_precision=args.mixed_precision)
    torch.manual_seed(0)
    model = TinyMLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    debugger = PrecisionDebugger(config_path=CONFIG, dump_path=args.dump_path)  # (2)
    steps = 0
    model.train()
    for x, y in loader:
        with accelerator.accumulate(model), collect(accelerator, debugger, model):  # (3)
            loss = F.mse_loss(model(x), y)
            accelerator.backward(loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()                  # accelerate skips these until the last micro-batch
        optimizer.zero_grad()
        if accelerator.sync_gradients:
            steps += 1
            if steps >= args.max_steps:
                break
    debugger.close()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        backend = accelerator.state.backend or "no process group"
        print(f"accelerate recipe: {steps} optimizer steps on {accelerator.num_processes} process(es) "
              f"({backend}); dumped to {args.dump_path}")
        print(summary_text(summarize(args.dump_path)))
    accelerator.end_training()


if __name__ == "__main__":
    main()
