"""acc-check recipe: API precision without a golden run.

A small bfloat16 model runs one training step with a tensor dump at level L1. One of its ops
is a "fused kernel" of our own (`fast_gelu`, registered with `register_custom_api`) whose tanh
constant is slightly off. `acc_check` replays every recorded API call from its saved inputs
in float64 and in bfloat16, and grades each recorded output: the kernel is named (graded
against its reference, torch's tanh GELU), every torch op passes. Runs on CPU.

    python recipes/acc_check_recipe.py [--dump-path DIR] [--out DIR]

The same from the command line:
    tsprobe acc-check DIR -o OUT --reference MyKernels.fast_gelu=torch.nn.functional.gelu
(for a reference that takes other arguments, pass a function of your own, as below).
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from ts_core import PrecisionDebugger
from ts_core.acccheck import acc_check


def fast_gelu(x):
    """A 'fused' tanh GELU computed in float32 inside, with 0.75 where sqrt(2/pi) = 0.7979 belongs."""
    y = x.float()
    return (0.5 * y * (1.0 + torch.tanh(0.75 * (y + 0.044715 * y ** 3)))).to(x.dtype)


class Block(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        kernels = sys.modules[__name__]
        return x + self.down(kernels.fast_gelu(self.up(self.norm(x))))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump-path", default=os.path.join("dump_output", "acc_check"))
    p.add_argument("--out", default=os.path.join("dump_output", "acc_check_result"))
    args = p.parse_args(argv)

    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block()).to(torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16)

    debugger = PrecisionDebugger(task="tensor", level="L1", dump_path=args.dump_path, step=[0])
    debugger.register_custom_api(sys.modules[__name__], "fast_gelu", "MyKernels")   # key MyKernels.fast_gelu
    debugger.start(model)
    model(x).float().pow(2).mean().backward()
    debugger.stop()
    debugger.step()
    debugger.close()

    tanh_gelu = functools.partial(F.gelu, approximate="tanh")
    result = acc_check(args.dump_path, args.out, references={"MyKernels.fast_gelu": tanh_gelu})
    bad = sorted({c.api_name.rsplit(".", 1)[0] for c in result.failed})
    print(f"APIs that fail: {bad}")


if __name__ == "__main__":
    main()
