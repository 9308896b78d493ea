"""Plain PyTorch loop recipe: `PrecisionDebugger.start / stop / step` placed by hand.

A tiny CNN trains for 4 optimizer steps with gradient accumulation 2; the steps listed in
configs/statistics_mix.yaml (0 and 1) are dumped. `start()` before each micro-batch's forward
and `stop()` after its backward keep the data loading and the optimizer out of the dump;
`step()` after the optimizer step closes the step folder. Runs on CPU.

    python recipes/torch_loop_recipe.py [--dump-path DIR]

The three lines a user adds (besides the import) are marked (1) (2) (3); `stop()` is optional
when nothing runs between backward and `step()`.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from ts_core.compare import summarize, summary_text  # `tsprobe summary`
from ts_core import PrecisionDebugger

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, os.pardir, "configs", "statistics_mix.yaml")


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 8 * 8, 5)

    def forward(self, x):
        return self.head(F.relu(self.bn(self.conv(x))).flatten(1))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump-path", default=os.path.join("dump_output", "torch_loop"))
    p.add_argument("--max-steps", type=int, default=4)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model = TinyCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    accumulation = 2
    batches = [(torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))) for _ in range(args.max_steps * accumulation)]

    debugger = PrecisionDebugger(config_path=CONFIG, dump_path=args.dump_path)
    for i, (x, y) in enumerate(batches):
        debugger.start(model)                                                  # (1)
        loss = F.cross_entropy(model(x), y) / accumulation
        loss.backward()
        debugger.stop()                                                        # (2)
        if (i + 1) % accumulation == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            debugger.step()                                                    # (3)
    debugger.close()
    print(f"torch loop recipe: {len(batches) // accumulation} optimizer steps; dumped to {args.dump_path}")
    print(summary_text(summarize(args.dump_path)))


if __name__ == "__main__":
    main()
