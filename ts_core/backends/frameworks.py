"""Which framework a model belongs to, decided from the object itself (nothing is imported)."""
from __future__ import annotations

import importlib
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


def require_mindtorch() -> None:
    """Import mindtorch first (mindspore must not load when it is missing), with a clear error."""
    try:
        importlib.import_module("mindtorch")
    except ImportError as e:
        raise ImportError("framework 'mindtorch' needs mindnlp's mindtorch package (mindnlp 0.5.1 on "
                          "MindSpore 2.7.0, in a venv of its own): see docs/mindtorch.md") from e


def load_access(framework: str) -> Any:
    """The ``ModelAccess`` of `framework` (what its models look like, how a hook goes on them)."""
    if framework == "pytorch":
        from .torch.access import TorchAccess

        return TorchAccess()
    if framework == "mindspore":
        from .mindspore.access import MindSporeAccess

        return MindSporeAccess()
    if framework == "mindtorch":
        require_mindtorch()
        from .mindtorch.access import MindtorchAccess

        return MindtorchAccess()
    raise ValueError(f"unknown framework {framework!r}")
