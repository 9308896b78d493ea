"""Model-tree recipe: where in the model did it diverge? report.html's tree shows it.

A 3-block model is dumped twice at level mix; in the target, block 1's GELU uses the tanh
approximation (a classic port difference). `compare` writes report.html: its model tree opens
on layers.1 > layers.1.act > Functional.gelu.1 (the first divergence, highlighted), with each
module's worst error. Runs on CPU.

    python recipes/report_tree_recipe.py [--dump-path DIR]
    chromium --headless --screenshot=tree.png --window-size=1400,1800 file://$PWD/DIR/compare/report.html
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn as nn

from ts_core import PrecisionDebugger
from ts_core.compare import compare
from ts_core.compare.report.tree import build_tree


class Block(nn.Module):
    def __init__(self, d=16, approximate="none"):
        super().__init__()
        self.fc1, self.act, self.fc2, self.norm = nn.Linear(d, d), nn.GELU(approximate), nn.Linear(d, d), nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.fc2(self.act(self.fc1(x))))


class Net(nn.Module):
    def __init__(self, bug=False):
        super().__init__()
        self.layers = nn.ModuleList([Block(approximate="tanh" if bug and i == 1 else "none") for i in range(3)])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def dump(path: str, bug: bool) -> None:
    torch.manual_seed(0)
    model, x = Net(bug), torch.randn(8, 16)
    debugger = PrecisionDebugger(dump_path=path, level="mix", step=[0])
    debugger.start(model)
    model(x).pow(2).mean().backward()
    debugger.stop()
    debugger.step()
    debugger.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump-path", default=os.path.join("dump_output", "report_tree"))
    args = p.parse_args(argv)
    golden, target = os.path.join(args.dump_path, "golden"), os.path.join(args.dump_path, "target")
    dump(golden, False)
    dump(target, True)
    result = compare(golden, target, os.path.join(args.dump_path, "compare"), verbose=False)
    tree = build_tree(result.pairs[0])
    nodes, i, path = tree["nodes"], tree["first"], []
    while i is not None and i >= 0:
        path.append(nodes[i][0])
        i = nodes[i][1]
    print("first divergence in the tree: " + " > ".join(reversed(path)))
    print(f"open {result.report_path}")


if __name__ == "__main__":
    main()
