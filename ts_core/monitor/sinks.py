"""Where monitor mode's per-step signals go: ``dump_path/monitor.jsonl`` and, when asked and
importable, TensorBoard.

monitor.jsonl gets one JSON object per step and rank, appended with a single ``write()`` on a
file opened with O_APPEND (the dump journal's writer), so lines of several ranks sharing the
file never interleave on a local file system, and a killed run loses at most its last line.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, Iterator, Optional, Tuple

from ..dumpfmt import json_safe, rank_dir_name
from ..writer.journal import Journal


class JsonlSink:
    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path
        self._journal = Journal(path)

    def write(self, row: Dict[str, Any]) -> None:
        self._journal.append(json_safe(row))
        self._journal.flush()

    def close(self) -> None:
        self._journal.close()


class TensorBoardSink:
    """Scalars through ``torch.utils.tensorboard`` (tensorboard must be installed), one event
    folder per rank: ``loss``, ``grad_norm``, ``nonfinite/<part>`` and, with module gradient
    norms on, ``grad_norm/<module>``."""

    def __init__(self, log_dir: str, rank: Optional[int]):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=os.path.join(log_dir, rank_dir_name(rank)))

    def write(self, row: Dict[str, Any]) -> None:
        for tag, value in scalars(row):
            self._writer.add_scalar(tag, value, row["step"])

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def scalars(row: Dict[str, Any]) -> Iterator[Tuple[str, float]]:
    """(tag, value) of every number in a monitor.jsonl row worth a curve."""
    for name in ("loss", "grad_norm"):
        if row.get(name) is not None:
            yield name, row[name]
    for part, n in (row.get("nonfinite") or {}).items():
        yield f"nonfinite/{part}", n
    for module, norm in (row.get("module_grad_norms") or {}).items():
        yield f"grad_norm/{module}", norm


def open_tensorboard(log_dir: str, rank: Optional[int]) -> Optional[TensorBoardSink]:
    """A TensorBoard sink, or None (with a warning) when torch.utils.tensorboard cannot be imported."""
    try:
        return TensorBoardSink(log_dir, rank)
    except ImportError as exc:
        warnings.warn(f"tsprobe monitor: tensorboard is on but torch.utils.tensorboard cannot be imported "
                      f"({exc}); install tensorboard (pip install tensorboard) or set monitor.tensorboard: "
                      "false. monitor.jsonl is written as usual.", RuntimeWarning, stacklevel=2)
        return None
