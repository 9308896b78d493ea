"""tsprobe core: dump what every module and API call saw, compare two dumps.

``import ts_core`` needs only numpy and pyyaml; framework backends load when first used.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import AnomalyError, ConfigError, DumpWriteError

if TYPE_CHECKING:
    from .config import DebuggerConfig, build_config
    from .debugger import PrecisionDebugger

__all__ = ["PrecisionDebugger", "seed_all", "compare", "compare_npy_dir", "AnomalyError", "ConfigError",
           "DumpWriteError", "DebuggerConfig", "build_config", "migrator", "save", "save_grad",
           "module_dump", "module_dump_end"]


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False) -> None:
    """Fix Python, numpy and framework randomness (torch and/or MindSpore, whichever is
    imported; torch when neither is); `mode` enables deterministic kernels; `rm_dropout` turns
    dropout off (msprobe seed_all)."""
    import sys

    seeded = False
    if "mindspore" in sys.modules:
        from .backends.mindspore.seed import seed_all as _ms_seed_all

        _ms_seed_all(seed, mode, rm_dropout)
        seeded = True
    if "torch" in sys.modules or not seeded:
        from .backends.torch.seed import seed_all as _torch_seed_all

        _torch_seed_all(seed, mode, rm_dropout)


def module_dump(module: Any, dump_name: str) -> None:
    """msprobe's ``module_dump(module, name)``: the current debugger records only `module`, as
    one module record, until ``module_dump_end()`` (see ``PrecisionDebugger.module_dump``)."""
    _current_debugger("module_dump").module_dump(module, dump_name)


def module_dump_end() -> None:
    """msprobe's ``module_dump_end()``: end ``module_dump``."""
    _current_debugger("module_dump_end").module_dump_end()


def _current_debugger(fn: str) -> PrecisionDebugger:
    from .debugger import PrecisionDebugger

    dbg = PrecisionDebugger.current()
    if dbg is None:
        raise RuntimeError(f"{fn}() needs a PrecisionDebugger: create one first "
                           "(debugger = PrecisionDebugger(config_path=...))")
    return dbg


# Loaded on first use, so that `tsprobe compare` and other offline commands do not pay for the
# dump side (config, debugger, backends): about a tenth of a second at every start.
_LAZY = {"PrecisionDebugger": ".debugger", "DebuggerConfig": ".config", "build_config": ".config"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    if name == "compare":
        import importlib

        pkg = importlib.import_module(".compare", __name__)   # callable package: ts_core.compare(...)
        return getattr(pkg, name)
    if name in ("migrator", "save", "save_grad", "compare_npy_dir"):   # TroubleShooter's face (ts_core.compat)
        import importlib

        return getattr(importlib.import_module(".compat", __name__), name)
    raise AttributeError(f"module 'ts_core' has no attribute {name!r}")
