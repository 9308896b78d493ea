"""One folder per framework. A backend is chosen from the object the user hands over
(an ``nn.Module``, a ``Cell``), never from what happens to be installed."""
from __future__ import annotations

from .frameworks import FRAMEWORKS, framework_of, require_mindtorch

__all__ = ["FRAMEWORKS", "framework_of", "load_backend"]


def load_backend(framework: str):
    if framework == "pytorch":
        from .torch import TorchBackend

        return TorchBackend
    if framework == "mindspore":
        from .mindspore import MindSporeBackend

        return MindSporeBackend
    if framework == "mindtorch":
        require_mindtorch()
        from .mindtorch import MindtorchBackend

        return MindtorchBackend
    raise ValueError(f"unknown framework {framework!r}; use one of {', '.join(FRAMEWORKS)}")

