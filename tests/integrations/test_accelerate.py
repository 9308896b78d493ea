"""accelerate `collect` on real hand-written accelerate loops (single process; two processes
are in test_multiprocess.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

accelerate = pytest.importorskip("accelerate")
from accelerate import Accelerator  # noqa: E402

from ts_core import PrecisionDebugger  # noqa: E402
from ts_integrations.accelerate import collect  # noqa: E402

from ._helpers import SpyDebugger, grad_norm, keys_like, param_grad_keys, records, step_dirs  # noqa: E402


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def train(debugger, steps: int = 4, accumulation: int = 2, mixed_precision: str = "no", clip: float = 0.0,
          events=None, start_step=None, grads=None):
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation, mixed_precision=mixed_precision)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data, batch_size=4))
    done = start_step or 0
    for x, y in loader:
        kw = {"step": done} if start_step is not None else {}
        with accelerator.accumulate(model), collect(accelerator, debugger, model, **kw):
            if events is not None:
                events.append("forward")
            loss = F.mse_loss(model(x), y)
            accelerator.backward(loss)
            if events is not None:
                events.append("backward")
        if accelerator.sync_gradients:
            if grads is not None:
                grads[done] = model.fc1.weight.grad.norm().item()
            if clip:
                accelerator.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        if accelerator.sync_gradients:
            done += 1
            if events is not None:
                events.append("optimizer_step")
            if done >= (start_step or 0) + steps:
                break
    return model


def test_exact_order_and_steps(dump_root):
    events: list = []
    dbg = SpyDebugger(events, dump_path=dump_root, level="mix", step=[1, 3])
    train(dbg, events=events)

    def idle(n):        # not configured: nothing collected, the debugger only counts the step
        return ["forward", "backward", "forward", "backward", f"step{n}", "optimizer_step"]

    def dumped(n):
        return [f"start{n}", "forward", "backward", "stop", f"start{n}", "forward", "backward", "stop",
                f"step{n}", "optimizer_step"]

    assert events == idle(0) + dumped(1) + idle(2) + dumped(3)
    assert step_dirs(dump_root) == ["step1", "step3"]
    dbg.close()


def test_accumulation_two_forwards_one_parameters_grad_before_clipping(dump_root):
    grads: dict = {}
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[1, 3])
    train(dbg, clip=1e-4, grads=grads)
    for step in (1, 3):
        data = records(dump_root, step)
        assert keys_like(data, "Module.fc1.Linear.forward.") == ["Module.fc1.Linear.forward.0",
                                                                 "Module.fc1.Linear.forward.1"]
        assert param_grad_keys(data) == ["Module.fc1.Linear.parameters_grad.0", "Module.fc2.Linear.parameters_grad.0"]
        assert grad_norm(data, "Module.fc1.Linear.parameters_grad.0") == pytest.approx(grads[step], rel=1e-5)
        assert grads[step] > 1e-2               # i.e. far from the clipped norm
        apis = {k.split(".")[1] for k in data if not k.startswith("Module.")}
        assert not apis & {"_foreach_norm", "stack", "add_", "mul_"}, apis
    dbg.close()


def test_model_names_are_unwrapped_and_every_patch_restored(dump_root):
    linear = F.linear
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[0])
    model = train(dbg, steps=2)
    assert "Module.fc1.Linear.forward.0" in records(dump_root, 0)
    assert F.linear is linear                   # restored after the last configured step
    assert not model.fc1._forward_pre_hooks
    dbg.close()


def test_bf16_mixed_precision(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0])
    train(dbg, steps=1, mixed_precision="bf16")
    data = records(dump_root, 0)
    assert data["Functional.linear.0.forward"]["output"][0]["dtype"] == "torch.bfloat16"
    assert len(keys_like(data, "Module.fc2.Linear.forward.")) == 2
    dbg.close()


def test_without_accumulation_every_block_is_a_step(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[2])
    train(dbg, steps=3, accumulation=1)
    assert step_dirs(dump_root) == ["step2"]
    assert len(keys_like(records(dump_root, 2), "Module.fc1.Linear.forward.")) == 1
    assert dbg.current_step == 3
    dbg.close()


def test_resume_with_explicit_step(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[5])
    train(dbg, steps=2, start_step=4)           # a resumed loop: optimizer steps 4 and 5
    assert step_dirs(dump_root) == ["step5"]
    assert len(keys_like(records(dump_root, 5), "Module.fc1.Linear.forward.")) == 2
    dbg.close()


def test_arguments_are_checked(dump_root):
    accelerator = Accelerator(cpu=True)
    with pytest.raises(TypeError, match="PrecisionDebugger"):
        with collect(accelerator, object()):
            pass
    dbg = PrecisionDebugger(dump_path=dump_root, step=[0])
    with pytest.raises(ValueError, match="0-based"):
        with collect(accelerator, dbg, step=-1):
            pass
    dbg.close()
