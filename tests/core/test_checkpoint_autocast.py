"""Activation checkpointing (reentrant and not) under bf16 autocast with the tool on: loss,
gradients and AdamW-updated parameters bit-identical to the run without it, modules recorded."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ts_core import PrecisionDebugger

from ..conftest import load_dump


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.ln = nn.LayerNorm(16)
        self.act = nn.GELU()

    def forward(self, x):
        return x + self.act(self.ln(self.fc(x)))


class Net(nn.Module):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, 4)
        self.reentrant = reentrant

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=self.reentrant)
        return self.head(h)


def train(reentrant: bool, dump=None, level="mix", task="statistics"):
    torch.manual_seed(0)
    model = Net(reentrant)
    x, y = torch.randn(6, 8, requires_grad=reentrant), torch.randn(6, 4)    # reentrant: an input needing grad
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dbg = PrecisionDebugger(dump_path=dump, task=task, level=level, step=[0, 1]) if dump else None
    losses, grads = [], []
    for _ in range(2):
        if dbg:
            dbg.start(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        loss = F.mse_loss(out.float(), y)
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
        if dbg:
            dbg.stop()
            dbg.step()
    if dbg:
        dbg.close()
    return losses, grads, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("reentrant,level,task", [(True, "mix", "statistics"), (False, "mix", "statistics"),
                                                  (False, "L0", "tensor"), (True, "L1", "statistics")])
def test_checkpointing_under_bf16_autocast_is_bit_identical_and_recorded(dump_root, reentrant, level, task):
    ref = train(reentrant)
    got = train(reentrant, dump_root, level, task)
    for a, b in zip(ref[0], got[0]):
        assert torch.equal(a, b)
    for ga, gb in zip(ref[1], got[1]):
        assert all(torch.equal(u, v) for u, v in zip(ga, gb))
    assert all(torch.equal(u, v) for u, v in zip(ref[2], got[2]))
    data = load_dump(os.path.join(dump_root, "step0", "rank"))["data"]
    if level == "L1":
        assert "Functional.linear.0.forward" in data and not any(k.startswith("Module.") for k in data)
        return
    for m in ("Module.blocks.0.fc.Linear", "Module.blocks.1.ln.LayerNorm", "Module.head.Linear"):
        # A checkpointed module's forward runs again in backward (its call 1): the backward
        # record carries the number of the call whose graph autograd ran.
        assert f"{m}.forward.0" in data and any(k.startswith(f"{m}.backward.") for k in data), m
        assert set(data[f"{m}.parameters_grad.0"]) == {"weight", "bias"}
    assert data["Module.blocks.0.fc.Linear.forward.0"]["output"][0]["dtype"] == "torch.bfloat16"
    # The reentrant recomputation is recorded (autograd runs its graph: the backward records come
    # from it); the non-reentrant one only rebuilds saved tensors of the first call's graph: it
    # repeats recorded calls and is not recorded again (a plain run and a checkpointed one then
    # hold the same records, test_wrapped_names.py).
    assert ("Module.blocks.0.fc.Linear.forward.1" in data) == reentrant
