"""``fingerprint.json``: what a run was given (packages, environment, framework settings,
hyperparameters, weight and first-batch checksums), written by the debugger into each dumped
step/rank folder next to dump.json, read by ``tsprobe config-check``.

```
{"version": 1, "step": 0, "rank": 0, "python": "3.11.7", "platform": {...},
 "packages": {"torch": "2.13.0+cpu", ...}, "environment": {"OMP_NUM_THREADS": "1", ...},
 "framework": {"torch": {"deterministic_algorithms": false, ...}},
 "argv": [...], "hyperparameters": {"lr": "0.1", ...}, "tsprobe_config": {...},
 "weights": {"fc1.weight": {"dtype", "shape", "Max", "Min", "Mean", "Norm", "crc32"?}},
 "data": {"args.0": {"dtype", "shape", "Max", "Min", "Mean", "Norm", "crc32"}}}
```
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from .jsonio import read_json, write_json_atomic

FINGERPRINT_JSON = "fingerprint.json"
FINGERPRINT_VERSION = 1


def write_fingerprint(folder: str, doc: Dict[str, Any]) -> str:
    path = os.path.join(folder, FINGERPRINT_JSON)
    write_json_atomic(path, doc, fsync=False)       # a per-step file: see write_atomic
    return path


def read_fingerprint(folder: str) -> Optional[Dict[str, Any]]:
    """The fingerprint of a step/rank folder, or None when it has none."""
    path = os.path.join(folder, FINGERPRINT_JSON)
    return read_json(path) if os.path.isfile(path) else None
