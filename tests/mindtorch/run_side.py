"""One side of the mindtorch tests, run as a child process:

    <python> -m tests.mindtorch.run_side {torch|mindtorch} ROOT JOBS_JSON

``torch``: real PyTorch (the main venv's python). ``mindtorch``: the same models on mindtorch
(``.venv-mindtorch/bin/python``; MindSpore on CPU, ``workarounds.fix_move_to_cpu`` applied).
Each job trains `steps` steps of one model (tests/mindtorch/models.py) from ROOT/weights_<model>.npz
(written by the test process, models.write_weights), optionally under a PrecisionDebugger (level
``debug`` saves the toy's output with ``debugger.save``), optionally with a bug injected into one
framework function. Training is what each framework offers: torch
``loss.backward()``; mindtorch ``torch.autograd.value_and_grad`` (its ``backward()`` computes
nothing on CPU); both update the parameters by hand (SGD; mindtorch's optimizers fail on CPU).
Prints one line ``RESULT {job id: {"losses": [...], "state": npz of final parameters and
last gradients}}``.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable, Dict

import numpy as np

LR = 0.05


def setup(framework: str):
    if framework == "mindtorch":
        import mindspore as ms

        ms.set_device("CPU")
        ms.set_context(mode=ms.PYNATIVE_MODE)
        import mindtorch  # noqa: F401  -- from here on, `import torch` is mindtorch

        from .workarounds import fix_move_to_cpu

        fix_move_to_cpu()
    import torch

    return torch


# bug name -> (module path under torch, function name, wrapper factory): the bug is put in before
# the debugger wraps the function, as a bug of the framework itself would be.
def _scaled(factor: float) -> Callable[[Callable], Callable]:
    return lambda orig: (lambda *a, **k: orig(*a, **k) * factor)


def _gelu_tanh(orig: Callable) -> Callable:
    return lambda x, approximate="none": orig(x, approximate="tanh")


BUGS: Dict[str, tuple] = {
    "gelu_tanh": ("nn.functional", "gelu", _gelu_tanh),
    "tanh_scaled": ("", "tanh", _scaled(1.01)),
    "rsqrt_scaled": ("", "rsqrt", _scaled(1.01)),
}


def inject(framework: str, torch: Any, bug: str) -> Callable[[], None]:
    """Put `bug` into the framework; returns the undo. Under mindtorch the function is replaced
    in mindtorch's own module (``torch`` there is a proxy that forwards reads only)."""
    path, name, make = BUGS[bug]
    if framework == "mindtorch":
        import importlib

        owner = importlib.import_module("mindtorch" + ("." + path if path else ""))
    else:
        owner = torch
        for part in filter(None, path.split(".")):
            owner = getattr(owner, part)
    orig = getattr(owner, name)
    setattr(owner, name, make(orig))
    return lambda: setattr(owner, name, orig)


def run_job(framework: str, torch: Any, root: str, job: dict) -> dict:
    from . import models

    model = models.build(job["model"])
    models.import_weights(model, os.path.join(root, f"weights_{job['model']}.npz"))
    params = list(model.parameters())
    undo = inject(framework, torch, job["bug"]) if job.get("bug") else None
    dbg = None
    if job.get("level"):
        from ts_core import PrecisionDebugger

        extra = {"data_mode": job["data_mode"]} if "data_mode" in job else {}
        dbg = PrecisionDebugger(dump_path=job["out"], task=job.get("task", "statistics"), level=job["level"],
                                step=list(range(job.get("steps", 1))), **extra)
    save = dbg.save if dbg is not None and job["level"] == "debug" else (lambda value, name: None)

    def loss_fn(x, y):
        return models.loss_of(job["model"], model, x, y, save)

    def update() -> None:
        with torch.no_grad():
            for p in params:
                p.sub_(LR * p.grad)

    update_in_window = job.get("update_in_window", False)     # the SGD step between start and stop
    losses = []
    try:
        for step in range(job.get("steps", 1)):
            x, y = (torch.tensor(a) for a in models.batch(job["model"], step))
            if dbg is not None:
                dbg.start(model)
            if framework == "torch":
                loss = loss_fn(x, y)
                loss.backward()
            else:
                loss = torch.autograd.value_and_grad(loss_fn, params)(x, y)
            grads = {f"grad.{n}": p.grad.numpy().copy() for n, p in model.named_parameters()}
            if update_in_window:
                update()
            if dbg is not None:
                dbg.stop()
                dbg.step()
            losses.append(float(loss.detach().numpy()))
            if not update_in_window:
                update()
            for p in params:
                p.grad = None
    finally:
        if dbg is not None:
            dbg.close()
        if undo is not None:
            undo()
    state = os.path.join(root, f"state_{framework}_{job['id']}.npz")
    np.savez(state, **grads, **{f"param.{n}": p.detach().numpy().copy() for n, p in model.named_parameters()})
    return {"losses": losses, "state": state}


def detect(torch: Any, root: str) -> dict:
    """What tsprobe sees in this process: the framework of a module, of a tensor and of no model
    at all; the error for a model of no framework; whether a no-model debugger records here."""
    from ts_core import PrecisionDebugger
    from ts_core.backends import framework_of

    from . import models

    model = models.build("toy")
    out = {"module": framework_of(model), "tensor": framework_of(torch.ones(2)), "none": framework_of(None),
           "list": framework_of([model])}
    try:
        PrecisionDebugger(dump_path=os.path.join(root, "detect_bad"), level="L0").start(model=object())
    except TypeError as e:
        out["bad_model_error"] = str(e)
    path = os.path.join(root, "detect_L1")
    with PrecisionDebugger(dump_path=path, level="L1", step=[0]) as dbg:     # no model, no framework set
        dbg.start()
        torch.matmul(torch.ones(2, 3), torch.ones(3, 1))
        dbg.stop()
    out["no_model_dump"] = os.path.join(path, "step0", "rank")
    return out


def accumulate(torch: Any, out: str) -> dict:
    """Two value_and_grad calls per step (gradient accumulation into p.grad), at L0: step 0 as
    the parameter hooks see it, step 1 re-read with ``record_param_grads()``."""
    from ts_core import PrecisionDebugger

    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    x = torch.tensor(np.ones((4, 3), np.float32))
    step_fn = torch.autograd.value_and_grad(lambda x: net(x).sum(), list(net.parameters()))
    with PrecisionDebugger(dump_path=out, level="L0", step=[0, 1]) as dbg:
        for step in range(2):
            dbg.start(net)
            step_fn(x)
            step_fn(x)
            if step == 1:
                dbg.record_param_grads()
            dbg.stop()
            dbg.step()
            for p in net.parameters():
                p.grad = None
    return {"dump": out}


def seed002(out: str) -> dict:
    """Seed 002's example script as written (msprobe's MSAdapter scenario), tsprobe's import in
    place of msprobe's: a torch Net trained through ``mindspore.value_and_grad(grad_position=0)``,
    three batches, start/stop/step around each. Inputs come from numpy instead of torch.randn."""
    import mindspore as ms
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from ts_core import PrecisionDebugger

    debugger = PrecisionDebugger(dump_path=out, task="statistics", level="mix")

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear1 = nn.Linear(in_features=8, out_features=4)
            self.linear2 = nn.Linear(in_features=4, out_features=2)

        def forward(self, x):
            x1 = self.linear1(x)
            x2 = self.linear2(x1)
            logits = F.relu(x2)
            return logits

    net = Net()

    def train_step(inputs):
        return net(inputs)

    rng = np.random.default_rng(2)
    data = [torch.tensor(rng.standard_normal((10, 8)).astype(np.float32)) for _ in range(3)]
    grad_fn = ms.value_and_grad(train_step, grad_position=0)
    for inputs in data:
        debugger.start(model=net)
        out_, grad = grad_fn(inputs)
        debugger.stop()
        debugger.step()
    debugger.close()
    return {"dump": out}


def main(framework: str, root: str, jobs: list) -> dict:
    torch = setup(framework)
    kinds = {"detect": lambda job: detect(torch, root),
             "seed002": lambda job: seed002(os.path.join(root, framework, job["id"])),
             "accumulate": lambda job: accumulate(torch, os.path.join(root, framework, job["id"])),
             None: lambda job: run_job(framework, torch, root, job)}
    return {job["id"]: kinds[job.get("kind")](job) for job in jobs}


if __name__ == "__main__":
    result = main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
    print("RESULT " + json.dumps(result))
