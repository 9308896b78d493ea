"""Checks on a zoo dump: which leaf-module calls have records."""
from __future__ import annotations

import os
from typing import Dict, List

import torch

from ts_core.dumpfmt import module_base, module_key

from ..conftest import load_dump


def rank_data(dump_path: str, step: int = 0) -> dict:
    return load_dump(os.path.join(dump_path, f"step{step}", "rank"))["data"]


def missing_leaf_records(data: dict, model: torch.nn.Module, calls: Dict[str, List[bool]]) -> List[str]:
    """Keys that should be in `data` and are not: a forward record for every call of every leaf
    module that ran, a backward record for every such call whose output received a gradient
    (`calls`: what plain torch hooks saw, see harness.train_step(watch_leaves=True))."""
    modules = dict(model.named_modules())
    missing = []
    for path, got_grad in calls.items():
        base = module_base(path, type(modules[path]).__name__)
        for i, grad in enumerate(got_grad):
            wanted = [module_key(base, i, "forward")] + ([module_key(base, i, "backward")] if grad else [])
            missing += [k for k in wanted if k not in data]
    return missing
