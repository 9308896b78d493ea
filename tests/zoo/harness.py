"""One AdamW training step of a zoo model, with or without the tool, and what to compare after it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch

from .models import build


@dataclass
class StepResult:
    loss: torch.Tensor
    grads: Dict[str, torch.Tensor]
    params: Dict[str, torch.Tensor]
    model: torch.nn.Module
    calls: Dict[str, List[bool]] = field(default_factory=dict)   # leaf path -> got a gradient, per call


def train_step(name: str, debugger=None, seed: int = 0, watch_leaves: bool = False,
               save_all: bool = False) -> StepResult:
    """Build `name`, run forward, backward and ``AdamW.step()`` (inside the debugger's window
    when one is given: start, step, stop, step()). ``watch_leaves``: also note, with plain torch
    hooks, which leaf modules ran and whether each call's output received a gradient.
    ``save_all`` (level debug): ``debugger.save`` every leaf module's output, gradient included."""
    model, batch = build(name, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    calls: Dict[str, List[bool]] = {}
    handles = watch_leaves_of(model, calls) if watch_leaves else []
    if save_all:
        handles += [m.register_forward_hook(lambda mod, a, out, p=p: debugger.save(out, p))
                    for p, m in leaf_modules(model)]
    torch.manual_seed(seed + 1)                       # the same dropout masks in every run
    if debugger is not None:
        debugger.start(model)
    loss = model(**batch).loss
    loss.backward()
    opt.step()
    if debugger is not None:
        debugger.stop()
        debugger.step()
    for h in handles:
        h.remove()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    params = {n: p.detach() for n, p in model.named_parameters()}
    return StepResult(loss.detach(), grads, params, model, calls)


def leaf_modules(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Module]]:
    return [(p, m) for p, m in model.named_modules() if p and next(m.children(), None) is None]


def watch_leaves_of(model: torch.nn.Module, calls: Dict[str, List[bool]]) -> list:
    """Plain torch hooks noting, per leaf module, each call and whether its output got a gradient."""
    handles = []
    for path, module in leaf_modules(model):
        def post(mod, args, output, path=path):
            flags = calls.setdefault(path, [])
            i = len(flags)
            flags.append(False)
            outs = output if isinstance(output, (tuple, list)) else (output,)
            for t in outs:
                if isinstance(t, torch.Tensor) and t.requires_grad:     # removed with the others:
                    handles.append(t.register_hook(lambda g, i=i: flags.__setitem__(i, True)))  # t may be a parameter
        handles.append(module.register_forward_hook(post))
    return handles


def differences(ref: StepResult, got: StepResult) -> List[Tuple[str, float]]:
    """(what, max |diff|) for every loss, gradient or parameter that is not bit-identical."""
    out = []
    if not torch.equal(ref.loss, got.loss):
        out.append(("loss", (ref.loss - got.loss).abs().max().item()))
    for kind, a, b in (("grad", ref.grads, got.grads), ("param", ref.params, got.params)):
        if a.keys() != b.keys():
            out.append((f"{kind} names", float("inf")))
        for k in a.keys() & b.keys():
            if not torch.equal(a[k], b[k]):
                out.append((f"{kind} {k}", (a[k] - b[k]).abs().max().item()))
    return out
