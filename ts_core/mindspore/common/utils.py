"""``msprobe.mindspore.common.utils``, the path msprobe's docs import ``MsprobeStep`` from: the
same names as ``ts_core.mindspore``, fetched on first access (see its docstring for why lazily)."""
from __future__ import annotations

from typing import Any

__all__ = ["MsprobeStep", "MsprobeInitStep", "seed_all"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ... import mindspore

        return getattr(mindspore, name)
    raise AttributeError(f"module 'ts_core.mindspore.common.utils' has no attribute {name!r}")
