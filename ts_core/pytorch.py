"""msprobe.pytorch's names, so an msprobe script runs by changing its import line only::

    from msprobe.pytorch import PrecisionDebugger, seed_all     # before
    from ts_core.pytorch import PrecisionDebugger, seed_all     # after

PrecisionDebugger, module_dump, module_dump_end and seed_all behave as msprobe documents them
(docs/migrating.md lists what differs). Importing this module does not import torch; seed_all
imports it when called. msprobe names with no counterpart here (its Ascend graph dumps, its
TrainerMon monitor) raise an ImportError that says what to use instead.
"""
from __future__ import annotations

from typing import Any

from . import PrecisionDebugger, module_dump, module_dump_end

__all__ = ["PrecisionDebugger", "seed_all", "module_dump", "module_dump_end"]


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False) -> None:
    """msprobe.pytorch.seed_all: fix Python, numpy and torch randomness; `mode` turns on
    deterministic kernels; `rm_dropout` turns dropout off."""
    from .backends.torch.seed import seed_all as _seed_all

    _seed_all(seed, mode, rm_dropout)


# msprobe.pytorch names that tsprobe does not have, and what to use instead
ABSENT = {
    "TrainerMon": "tsprobe's monitor is PrecisionDebugger(monitor={...}) (docs/monitor.md)",
    "random_save": "seed_all() makes runs reproducible; save() at level 'debug' records chosen values",
    "set_fx_dump_config": "torchair (Ascend graph) dumps are not supported",
    "set_ge_dump_config": "torchair (Ascend graph) dumps are not supported",
    "acl_save": "ACL graph dumps (Ascend) are not supported",
    "AclGraphDumper": "ACL graph dumps (Ascend) are not supported",
}


def __getattr__(name: str) -> Any:
    if name in ABSENT:
        raise ImportError(f"msprobe.pytorch.{name} has no tsprobe counterpart: {ABSENT[name]}")
    raise AttributeError(f"module 'ts_core.pytorch' has no attribute {name!r}")
