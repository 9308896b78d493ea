"""One folder per framework. A backend is chosen from the object the user hands over
(an ``nn.Module``, a ``Cell``), never from what happens to be installed."""
from __future__ import annotations

import sys
from typing import Any

FRAMEWORKS = ("pytorch", "mindspore", "mindtorch")


def framework_of(model: Any, configured: str = "") -> str:
    """'pytorch', 'mindspore' or 'mindtorch' for `model` (or the config's `framework` when no model).

    mindtorch (mindnlp's torch API on MindSpore, msprobe's "MSAdapter scenario") is recognised
    by its module classes (``mindtorch.nn.Module``); its tensors are MindSpore's own ``Tensor``
    class with torch methods, so a MindSpore tensor counts as mindtorch while mindtorch is loaded.
    Nothing is imported here: a framework is only looked up in ``sys.modules``."""
    if model is not None:
        for cls in type(model).__mro__:
            mod = cls.__module__ or ""
            if mod.startswith("mindtorch"):
                return "mindtorch"
            if mod.startswith("torch"):
                return "pytorch"
            if mod.startswith("mindspore"):
                return "mindtorch" if _is_mindtorch_tensor(model) else "mindspore"
        if isinstance(model, (list, tuple)) and model:
            return framework_of(model[0], configured)
        raise TypeError(f"start(model=...) takes a torch.nn.Module, mindspore.nn.Cell or mindtorch "
                        f"nn.Module, got {type(model).__name__}")
    if configured:
        return configured
    if "mindtorch" in sys.modules:       # `import torch` then resolves to mindtorch
        return "mindtorch"
    loaded = [name for name, mod in (("pytorch", "torch"), ("mindspore", "mindspore")) if mod in sys.modules]
    if len(loaded) == 1:
        return loaded[0]
    raise RuntimeError("tsprobe cannot tell which framework to hook: pass the model to "
                       "start(model=...) or set framework: pytorch|mindspore|mindtorch in the config.")


def _is_mindtorch_tensor(value: Any) -> bool:
    """A MindSpore Tensor while mindtorch is loaded (mindtorch's tensors are that class)."""
    if "mindtorch" not in sys.modules:
        return False
    ms = sys.modules.get("mindspore")
    return ms is not None and isinstance(value, ms.Tensor)


def load_backend(framework: str):
    if framework == "pytorch":
        from .torch import TorchBackend

        return TorchBackend
    if framework == "mindspore":
        from .mindspore import MindSporeBackend

        return MindSporeBackend
    if framework == "mindtorch":
        try:
            import mindtorch  # noqa: F401  -- first: mindspore must not load when it is missing
        except ImportError as e:
            raise ImportError("framework 'mindtorch' needs mindnlp's mindtorch package (mindnlp 0.5.1 on "
                              "MindSpore 2.7.0, in a venv of its own): see docs/mindtorch.md") from e
        from .mindtorch import MindtorchBackend

        return MindtorchBackend
    raise ValueError(f"unknown framework {framework!r}; use one of {', '.join(FRAMEWORKS)}")
