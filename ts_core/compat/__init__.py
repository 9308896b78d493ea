"""TroubleShooter-compatible face of tsprobe: ``migrator.api_dump_*``, ``save``/``save_grad``,
``migrator.compare_npy_dir``. Built on PrecisionDebugger and ts_core.compare (no second engine)."""
from . import migrator
from .npy_dir import compare_npy_dir, get_name_map_list_by_name
from .save import save, save_grad

__all__ = ["migrator", "save", "save_grad", "compare_npy_dir", "get_name_map_list_by_name"]
