"""Run one torch program of a case (forward, backward, optional optimizer step) under
tsprobe's PrecisionDebugger and return its rank folder plus the numbers the harness checks
the bug against (loss, output, parameters, gradients)."""
from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .spec import WeightEdit
from .torch_zoo import FAMILIES, Family
from .arrays import apply_edit, edit_array, mse_target

GOLDEN = "clean_same"


class Harness(nn.Module):
    """The root handed to ``debugger.start``: the family model is its child ``net``, so every
    call the model makes has a recorded parent module (the root itself is not recorded)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, *xs):
        return self.net(*xs)


def golden_state(family: Family) -> Dict[str, np.ndarray]:
    """The family's weights (seed 0), as numpy, shared by every variant and by the port."""
    torch.manual_seed(0)
    model = family.make(GOLDEN)
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def module_classes(family: Family) -> Dict[str, str]:
    """{module path: class name} of the family model (for renaming parameters for the port)."""
    torch.manual_seed(0)
    return {path: type(m).__name__ for path, m in family.make(GOLDEN).named_modules()}


def build(family: Family, variant: str, state: Dict[str, np.ndarray], edit: Optional[WeightEdit]) -> nn.Module:
    torch.manual_seed(0)
    model = family.make(variant)
    weights = apply_edit(state, edit)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()}, strict=True)
    model.train()
    return model


def loss_of(family: Family, model: nn.Module, inputs) -> Tuple[torch.Tensor, torch.Tensor]:
    if family.loss == "ce":
        out = model(inputs[0])
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), inputs[1].reshape(-1)), out
    out = model(*inputs)
    if family.loss == "output":
        return out, out
    return (out - torch.from_numpy(mse_target(tuple(out.shape)))).pow(2).mean(), out



def make_optimizer(name: str, model: nn.Module):
    """The optimizer stepped inside the dumped step (its ops are recorded at L1/mix, as in a
    user's loop): sgd = SGD with momentum and weight decay (3 recorded ops per parameter),
    adamw = AdamW (about 10 per parameter: slower to dump and compare), none."""
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, weight_decay=0.01)
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3)
    if name == "none":
        return None
    raise ValueError(f"optimizer {name!r}: choose sgd, adamw or none")


def run(family_name: str, variant: str, level: str, task: str, dump_path: str, optimizer: str = "sgd",
        edit: Optional[WeightEdit] = None, state: Optional[Dict[str, np.ndarray]] = None) -> Tuple[str, Dict[str, np.ndarray]]:
    """Dump one step of ``variant`` of a family; returns (rank dir, signature)."""
    from ts_core import PrecisionDebugger

    family = FAMILIES[family_name]
    state = state if state is not None else golden_state(family)
    net = build(family, variant, state, edit)
    model = Harness(net)
    arrays = list(family.inputs())
    if variant == "perturbed_input":          # one element of the first model input changed
        arrays[0] = edit_array(arrays[0], "perturb")
    inputs = [torch.from_numpy(a) for a in arrays]
    opt = make_optimizer(optimizer, model)
    sig = {f"param:{k}": v.detach().numpy().copy() for k, v in net.state_dict().items()}
    dbg = PrecisionDebugger(dump_path=dump_path, task=task, level=level, step=[0], framework="pytorch")
    try:
        dbg.start(model)
        loss, out = loss_of(family, model, inputs)
        if family.backward is not None:     # the training loop's own gradient work (loss scale, clipping)
            family.backward(net, variant, loss)
        else:
            loss.backward()
        dbg.set_collecting(False)     # the harness's own reads must not be recorded
        sig["loss:"] = np.array(loss.detach().float().numpy())
        sig["out:"] = out.detach().float().numpy().copy()
        sig.update({f"grad:{k}": p.grad.detach().float().numpy().copy()
                    for k, p in net.named_parameters() if p.grad is not None})
        dbg.set_collecting(True)
        if opt is not None:
            opt.step()
            opt.zero_grad()
        dbg.stop()
        dbg.step()
    finally:
        dbg.close()
    return os.path.join(dump_path, "step0", "rank"), sig
