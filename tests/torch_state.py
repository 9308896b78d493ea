"""What tsprobe may change in a torch process while it collects, and must give back on close()."""
from __future__ import annotations

import types


def torch_surface() -> dict:
    """Every attribute of torch, torch.nn.functional, torch.Tensor and torch.distributed, plus
    the global module hooks, by identity: a patch left behind shows as a changed value."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.modules import module as nn_module

    surface = {("torch", k): v for k, v in vars(torch).items()} | \
        {("F", k): v for k, v in vars(F).items()} | \
        {("Tensor", k): v for k, v in vars(torch.Tensor).items()} | \
        {("dist", k): v for k, v in vars(dist).items()}
    for name in dir(nn_module):
        if name.startswith("_global_") and name.endswith("hooks"):
            surface[("global", name)] = len(getattr(nn_module, name))
    return surface


def surface_changes(before: dict, after: dict) -> list:
    """Keys whose value differs; a submodule imported in between (torch imports lazily) is not a change."""
    changed = []
    for k in set(before) | set(after):
        if k[0] == "global":
            if before.get(k) != after.get(k):
                changed.append(str(k))
        elif k not in before and isinstance(after[k], types.ModuleType):
            continue
        elif before.get(k) is not after.get(k):
            changed.append(str(k))
    return sorted(changed)


def hook_count(model) -> int:
    """Hooks on `model`'s modules and parameters (tsprobe's or anyone's)."""
    n = 0
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) + \
            len(m._backward_pre_hooks)
        for p in m.parameters(recurse=False):
            n += len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
            n += len(getattr(p, "_backward_hooks", None) or {})
    return n
