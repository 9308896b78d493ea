"""``troubleshooter.migrator`` look-alike."""
from __future__ import annotations

from ..compare.npy_dir import compare_npy_dir, get_name_map_list_by_name

__all__ = ["compare_npy_dir", "get_name_map_list_by_name"]
