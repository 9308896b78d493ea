"""Write a file so that readers see the old content or the new, never half of it."""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Optional


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


def json_by_line(head: Dict[str, Any], field: Optional[str] = None, items: Optional[Dict[str, Any]] = None) -> str:
    """JSON text of `head` (plus `field`: `items`) with one entry of `items` per line.

    Each entry is encoded by the C encoder (``json.dumps`` without indent), which is ~10x
    faster than ``json.dump(..., indent=...)``; one line per record keeps the file readable.
    """
    dumps = json.dumps
    parts = [f"{dumps(k)}: {dumps(v)}" for k, v in head.items()]
    if field is not None:
        body = ",\n".join(f"{dumps(k)}: {dumps(v)}" for k, v in (items or {}).items())
        parts.append(f"{dumps(field)}: {{\n{body}\n}}" if body else f"{dumps(field)}: {{}}")
    return "{" + ",\n".join(parts) + "}\n"


def write_text_atomic(path: str, text: str) -> None:
    write_atomic(path, lambda f: f.write(text))
