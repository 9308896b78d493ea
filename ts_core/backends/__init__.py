"""One folder per framework. A backend is chosen from the object the user hands over
(an ``nn.Module``, a ``Cell``), never from what happens to be installed."""
from __future__ import annotations

import sys
from typing import Any


def framework_of(model: Any, configured: str = "") -> str:
    """'pytorch' or 'mindspore' for `model` (or the config's `framework` when no model)."""
    if model is not None:
        for cls in type(model).__mro__:
            mod = cls.__module__ or ""
            if mod.startswith("torch"):
                return "pytorch"
            if mod.startswith("mindspore"):
                return "mindspore"
        if isinstance(model, (list, tuple)) and model:
            return framework_of(model[0], configured)
        raise TypeError(f"start(model=...) takes a torch.nn.Module or mindspore.nn.Cell, "
                        f"got {type(model).__name__}")
    if configured:
        return configured
    loaded = [name for name, mod in (("pytorch", "torch"), ("mindspore", "mindspore")) if mod in sys.modules]
    if len(loaded) == 1:
        return loaded[0]
    raise RuntimeError("tsprobe cannot tell which framework to hook: pass the model to "
                       "start(model=...) or set framework: pytorch|mindspore in the config.")


def load_backend(framework: str):
    if framework == "pytorch":
        from .torch import TorchBackend

        return TorchBackend
    if framework == "mindspore":
        from .mindspore import MindSporeBackend

        return MindSporeBackend
    raise ValueError(f"unknown framework {framework!r}")
