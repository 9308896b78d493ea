"""A small torch training run dumped with the default config (fingerprint on), as a user runs
it: its own process, its own command line and environment.

    python tests/configcheck/run_train.py DUMP [--lr 0.1] [--bs 4] [--perturb] [--data-seed N]
                                               [--every-step]
"""
import argparse

import torch
import torch.nn as nn

from ts_core import PrecisionDebugger
from ts_core.configcheck import record_hyperparameters


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dump")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--bs", type=int, default=4)
    p.add_argument("--perturb", action="store_true", help="nudge one weight (a checkpoint that differs)")
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--every-step", action="store_true", help="fingerprint: every_step (weights at each step)")
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    if args.perturb:
        with torch.no_grad():
            model[2].bias[1] += 1e-3
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    dbg = PrecisionDebugger(dump_path=args.dump, level="L1", step=[0, 1],
                            fingerprint="every_step" if args.every_step else True)
    record_hyperparameters(args)                  # the parsed command line, defaults included
    record_hyperparameters({"optimizer": {"momentum": 0.9, "name": "SGD"}})
    gen = torch.Generator().manual_seed(args.data_seed)
    for _ in range(2):
        x = torch.randn(args.bs, 8, generator=gen)
        dbg.start(model)
        model(x).pow(2).mean().backward()
        dbg.stop()
        opt.step()
        opt.zero_grad()
        dbg.step()
    dbg.close()


if __name__ == "__main__":
    main()
