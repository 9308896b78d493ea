"""MindSpore process-level quirks tsprobe must absorb before touching a tensor."""
from __future__ import annotations

import mindspore as ms

__all__ = ["no_grad", "warm_up", "grad_recording", "is_pynative"]

try:     # PyNative: a context that stops ops being recorded for autodiff
    from mindspore import _no_grad as no_grad
except ImportError:      # pragma: no cover - older MindSpore
    from mindspore.common.api import _no_grad as no_grad   # type: ignore

try:
    from mindspore.graph.api import _pynative_executor as _executor
except ImportError:      # pragma: no cover - MindSpore < 2.9
    try:
        from mindspore.common.api import _pynative_executor as _executor
    except ImportError:
        _executor = None

_warmed = False


def warm_up() -> None:
    """With numpy 2, MindSpore 2.10's first op mixing a Tensor and a Python float raises
    SystemError once (its numpy C-API init fails, printing NumPy's 1.x notice), then works.
    Absorb that once here, quietly, so neither tsprobe's statistics nor the user's first op
    meet it (see numpy_init)."""
    global _warmed
    if _warmed:
        return
    _warmed = True
    from .numpy_init import init_numpy_quietly

    init_numpy_quietly()


def grad_recording() -> bool:
    """True while PyNative is recording ops for a gradient (inside ms.grad/value_and_grad/
    GradOperation); hooks for backward are only placed then."""
    if _executor is None:
        return True
    try:
        return bool(_executor.requires_grad())
    except Exception:      # pragma: no cover
        return True


def is_pynative() -> bool:
    try:
        return ms.get_context("mode") == ms.PYNATIVE_MODE
    except Exception:      # pragma: no cover
        return True
