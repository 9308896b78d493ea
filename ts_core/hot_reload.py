"""msprobe's ``dump_enable`` hot switch: a long job starts or stops dumping, or changes what it
dumps, by editing its config file; no restart.

Active when the config file given to ``PrecisionDebugger`` sets ``dump_enable`` (true or false).
The debugger asks ``poll()`` at step boundaries only (``start()`` and ``step()``), and ``poll``
costs one ``os.stat`` unless the file changed (modification time, size or inode); only then is
the file read and validated again. A file that no longer validates turns dumping off (msprobe
fails closed the same way) with a warning naming the error; fixing the file turns it back on.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple, Union

from .config import DebuggerConfig, build_config, check_paths
from .errors import ConfigError

Signature = Tuple[int, int, int]


def _signature(path: str) -> Optional[Signature]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class ConfigWatcher:
    """The config file of a running debugger and the keyword overrides that keep winning."""

    def __init__(self, path: str, overrides: Dict[str, Any]):
        self.path = os.fspath(path)
        self.overrides = {k: v for k, v in overrides.items() if k != "dump_enable"}   # the file decides
        self.signature = _signature(self.path)
        self.reads = 0                      # times the file was read again (tests, diagnostics)

    def poll(self) -> Union[None, DebuggerConfig, ConfigError]:
        """None while the file is unchanged (or gone); else the new config, or why it is invalid."""
        sig = _signature(self.path)
        if sig is None or sig == self.signature:
            return None
        self.signature = sig
        self.reads += 1
        try:
            cfg = build_config(self.path, **self.overrides)
            check_paths(cfg)
            return cfg
        except ConfigError as exc:
            return exc
