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


def hooks_on(model) -> list:
    """``(module path, kind, hook)`` for every hook on `model`'s modules and parameters."""
    found = []
    for path, m in model.named_modules():
        for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            found += [(path, kind, h) for h in getattr(m, kind).values()]
        for name, p in m.named_parameters(recurse=False):
            for kind in ("_post_accumulate_grad_hooks", "_backward_hooks"):
                where = f"{path}.{name}" if path else name
                found += [(where, kind, h) for h in (getattr(p, kind, None) or {}).values()]
    return found


def hook_count(model) -> int:
    """Hooks on `model`'s modules and parameters (tsprobe's or anyone's)."""
    return len(hooks_on(model))
