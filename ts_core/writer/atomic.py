"""Write a file so that readers see the old content or the new, never half of it."""
from __future__ import annotations

import json
import os
from typing import Any, Callable


def write_atomic(path: str, write: Callable[[Any], None], mode: str = "w") -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path: str, obj: Any, indent: int | None = 1) -> None:
    write_atomic(path, lambda f: json.dump(obj, f, indent=indent))
