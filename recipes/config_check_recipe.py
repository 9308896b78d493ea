"""config-check recipe: before comparing numerics, compare what two runs were given.

Two short training runs of the same model, dumped with the default config (the debugger then
writes a fingerprint.json into each dumped step folder). The second run differs the way real
migrations do: a determinism switch in the environment, another learning rate, a checkpoint
with one weight changed. `config_check` names each difference; the first batch is the same.
Runs on CPU.

    python recipes/config_check_recipe.py [--dump-path DIR]

From the command line:  tsprobe config-check DIR/golden DIR/target -o OUT
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn as nn

from ts_core import PrecisionDebugger
from ts_core.configcheck import config_check, record_hyperparameters


def train(dump_path: str, lr: float, nudge: float = 0.0) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    if nudge:
        with torch.no_grad():
            model[2].weight[0, 0] += nudge          # a checkpoint that is not quite the same
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    debugger = PrecisionDebugger(dump_path=dump_path, level="L1", step=[0, 1])
    record_hyperparameters({"lr": lr, "optimizer": "AdamW", "batch_size": 8})
    data = torch.Generator().manual_seed(1)
    for _ in range(2):
        x = torch.randn(8, 16, generator=data)
        debugger.start(model)
        model(x).pow(2).mean().backward()
        debugger.stop()
        optimizer.step()
        optimizer.zero_grad()
        debugger.step()
    debugger.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump-path", default=os.path.join("dump_output", "config_check"))
    args = p.parse_args(argv)
    golden, target = os.path.join(args.dump_path, "golden"), os.path.join(args.dump_path, "target")

    train(golden, lr=1e-3)
    saved = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    try:
        train(target, lr=2e-3, nudge=1e-4)
    finally:
        if saved is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG")
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved

    result = config_check(golden, target, os.path.join(args.dump_path, "config_check"))
    first = result.pairs[0]
    print("differences at step 0: " + ", ".join(f"{f.section}:{f.name}" for f in first.findings if f.level == "error"))


if __name__ == "__main__":
    main()
