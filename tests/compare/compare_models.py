"""Tiny torch models with a bug that can be placed in one known layer (no hub downloads)."""
import json

import torch
import torch.nn as nn


class TanhGate(torch.autograd.Function):
    """tanh with a hand-written backward; ``wrong`` makes it use 1 - y instead of 1 - y^2."""

    @staticmethod
    def forward(ctx, x, wrong):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        ctx.wrong = wrong
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        d = 1 - y * y
        if ctx.wrong:
            d = 1 - y          # the bug
        return g * d, None


class Gate(nn.Module):
    def __init__(self, wrong=False):
        super().__init__()
        self.wrong = wrong

    def forward(self, x):
        return TanhGate.apply(x, self.wrong)


class Block(nn.Module):
    def __init__(self, d, eps=1e-5, approximate="none", wrong=False, extra=False):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(d, d), nn.GELU(approximate=approximate), nn.Linear(d, d)
        self.gate, self.norm = Gate(wrong), nn.LayerNorm(d, eps=eps)
        self.extra = extra

    def forward(self, x):
        h = self.fc2(self.act(self.fc1(x)))
        if self.extra:
            h = h * 1.0          # one more call, same values
        return self.norm(x + self.gate(h))


class Net(nn.Module):
    """3 blocks and a head; ``bug`` = {"eps": .., "approximate": .., "wrong": .., "extra": ..} goes to block 1."""

    def __init__(self, d=16, n=3, bug=None):
        super().__init__()
        self.layers = nn.ModuleList([Block(d, **(bug or {})) if i == 1 else Block(d) for i in range(n)])
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build(bug=None, perturb=False):
    torch.manual_seed(0)
    model = Net(bug=bug)
    if perturb:
        with torch.no_grad():
            model.layers[1].fc1.weight[0, 0] += 0.05
    x = torch.randn(8, 16)
    return model, x


def train_step(model, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss


def dump_mix(path, task="statistics", **kw):
    """One training step of ``build(**kw)`` dumped by tsprobe (`task`, mix) into `path`."""
    from ts_core import PrecisionDebugger

    model, x = build(**kw)
    dbg = PrecisionDebugger(dump_path=str(path), task=task, level="mix", step=[0])
    dbg.start(model)
    train_step(model, x)
    dbg.stop()
    dbg.step()
    dbg.close()
    return str(path)


def run_msprobe(out, task="tensor", level="mix"):
    """Dump two steps with msprobe's own PrecisionDebugger (run this in a subprocess): step 0 is
    the clean model, step 1 the same model with one weight of layers.1.fc1 perturbed."""
    from msprobe.pytorch import PrecisionDebugger

    cfg = {"task": task, "dump_path": str(out), "rank": [], "step": [0, 1], "level": level, "async_dump": False,
           task: {"scope": [], "list": [], "data_mode": ["all"]}}
    with open(str(out) + ".json", "w") as f:
        json.dump(cfg, f)
    model, x = build()
    debugger = PrecisionDebugger(config_path=str(out) + ".json")
    for step in range(2):
        if step == 1:
            model.zero_grad()
            with torch.no_grad():
                model.layers[1].fc1.weight[0, 0] += 0.05
        debugger.start(model)
        train_step(model, x)
        debugger.stop()
        debugger.step()
