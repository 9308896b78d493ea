"""msprobe.mindspore's names, so an msprobe script runs by changing its import lines only::

    from msprobe.mindspore import PrecisionDebugger, MsprobeStep, seed_all     # before
    from ts_core.mindspore import PrecisionDebugger, MsprobeStep, seed_all     # after
    from ts_core.mindspore.common.utils import MsprobeStep                     # msprobe's other path

This also serves msprobe's MSAdapter scenario (PyTorch code on MindSpore through mindtorch),
which imports from ``msprobe.mindspore`` too.

``MsprobeStep`` and ``MsprobeInitStep`` are MindSpore ``Callback`` classes: they live in
``ts_integrations.mindspore`` and are fetched on first access (module ``__getattr__``) rather
than imported here, because ``import ts_core`` must work with numpy and pyyaml alone and ts_core
never imports ts_integrations at import time (the layers import downwards only: an integration
imports the core). Neither MindSpore nor ts_integrations is imported until a script asks for a
callback; ``seed_all`` imports MindSpore when called.
"""
from __future__ import annotations

from typing import Any

from .. import PrecisionDebugger

__all__ = ["PrecisionDebugger", "seed_all", "MsprobeStep", "MsprobeInitStep"]


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False) -> None:
    """msprobe.mindspore.seed_all: fix Python, numpy and MindSpore randomness; `mode` turns on
    deterministic kernels; `rm_dropout` turns MindSpore's dropouts off (call it before the
    network is built)."""
    from ..backends.mindspore.seed import seed_all as _seed_all

    _seed_all(seed, mode, rm_dropout)


_CALLBACKS = ("MsprobeStep", "MsprobeInitStep")
# msprobe.mindspore names that tsprobe does not have, and what to use instead
ABSENT = {
    "TrainerMon": "tsprobe's monitor is PrecisionDebugger(monitor={...}) (docs/monitor.md)",
    "save": "msprobe.mindspore.save(dir, name, data) dumps inside GRAPH_MODE through ops.TensorDump, which "
            "MindSpore does not run on CPU; in PyNative use debugger.save(variable, name) at level 'debug'",
    "save_grad": "msprobe.mindspore.save_grad dumps inside GRAPH_MODE; in PyNative debugger.save(variable, name) "
                 "at level 'debug' records the gradient too (save_backward=True)",
    "step": "msprobe.mindspore.step() advances GRAPH_MODE TensorDump folders; use debugger.step()",
}


def __getattr__(name: str) -> Any:
    if name in _CALLBACKS:
        import importlib

        return getattr(importlib.import_module("ts_integrations.mindspore"), name)
    if name in ABSENT:
        raise ImportError(f"msprobe.mindspore.{name} has no tsprobe counterpart: {ABSENT[name]}")
    raise AttributeError(f"module 'ts_core.mindspore' has no attribute {name!r}")
