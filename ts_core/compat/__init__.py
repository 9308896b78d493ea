"""TroubleShooter-compatible face of tsprobe: ``migrator.api_dump_*``, ``save``/``save_grad``,
``migrator.compare_npy_dir``. Built on PrecisionDebugger and ts_core.compare (no second engine)."""
from . import migrator
from .save import save, save_grad

__all__ = ["migrator", "save", "save_grad"]
