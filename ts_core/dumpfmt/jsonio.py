"""Reading and writing the JSON files of a dump.

Writes are atomic (readers see the old file or the new one, never half of one). Reads turn
every failure into one DumpFormatError naming the file. ``json_safe`` is the one encoder of
NaN/Inf for JSON, which has no such numbers.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from .errors import DumpFormatError

try:        # optional (extra "fast"): the same JSON ~10x faster than the stdlib encoder
    from msgspec.json import Encoder as _MsgspecEncoder
    from msgspec.json import format as _fast_format
    _fast_encode: Optional[Callable[[Any], bytes]] = _MsgspecEncoder().encode
except ImportError:
    _fast_encode = _fast_format = None
_std_record_encode = json.JSONEncoder(separators=(", ", ": ")).encode


def fast_json() -> bool:
    """Is msgspec encoding the dump records (``tsprobe --version``)?"""
    return _fast_encode is not None


def write_atomic(path: "os.PathLike | str", write: Callable[[Any], None], mode: str = "w",
                 fsync: bool = True) -> None:
    """Write through `write(file)` into a temporary file, rename it over `path`. ``fsync``
    also makes the content durable against a power loss before the rename (a killed process
    loses nothing either way: its writes are in the OS's cache). The dump's own per-step files
    skip it (``write_rank_files``, tensor files, the fingerprint): four fsyncs were a tenth of
    an L0 step's overhead, msprobe does none, and ``tsprobe recover`` rebuilds a step from its
    journal."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:
            write(f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_text_atomic(path: "os.PathLike | str", text: str, fsync: bool = True) -> None:
    write_atomic(path, lambda f: f.write(text), fsync=fsync)


def write_json_atomic(path: "os.PathLike | str", obj: Any, indent: Optional[int] = 1,
                      fsync: bool = True) -> None:
    """Any JSON document (NaN/Inf made strings first), atomically."""
    if _fast_format is None:
        text = json.dumps(json_safe(obj), indent=indent)
    else:       # ~20x the stdlib's indenting encoder, which is pure Python
        try:    # the C encoder refuses NaN/Inf: only then is the document walked by json_safe
            compact = json.dumps(obj, allow_nan=False)
        except ValueError:
            compact = json.dumps(json_safe(obj))
        text = _fast_format(compact, indent=indent) if indent else compact
    write_text_atomic(path, text + "\n", fsync=fsync)


def record_json(record: Any) -> str:
    """JSON text of one dump record: the one place that picks the encoder. msgspec (extra
    ``fast``; ~10x the stdlib on records: 1.3 vs 12.9 ms for a GPT-2 mix step) writes the same
    values but NaN/Inf as ``null``; so when its text holds a ``null`` and the record holds a
    non-finite float (``has_nonfinite``, a full scan), the stdlib encodes it (``NaN``,
    ``-Infinity``, as msprobe writes them). ~2% of GPT-2's records hold a ``null`` at all. An
    object msgspec refuses also falls back, to the stdlib's behaviour."""
    if _fast_encode is not None:
        try:
            text = _fast_encode(record)
        except Exception:       # a type or key msgspec refuses: the stdlib decides
            text = None
        if text is not None and (b"null" not in text or not has_nonfinite(record)):
            return text.decode()
    return _std_record_encode(record)


def has_nonfinite(v: Any) -> bool:
    """Does `v` (dicts, lists and tuples of JSON values) hold a NaN or an infinite float?"""
    if isinstance(v, float):
        return v - v != 0
    if isinstance(v, dict):
        v = v.values()
    elif not isinstance(v, (list, tuple)):
        return False
    return any(has_nonfinite(x) for x in v)


def json_string(text: str) -> str:
    """``json.dumps(text)``, without the encoder for the usual key: printable ASCII with no
    quote or backslash needs no escape (three C-level string tests, cheaper than a regex)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return json.dumps(text)


def _json_value(v: Any) -> str:
    return json_string(v) if type(v) is str else json.dumps(v)


def json_by_line(head: Dict[str, Any], field: Optional[str] = None, items: Optional[Dict[str, Any]] = None,
                 encoded: bool = False) -> str:
    """JSON text of `head` (plus `field`: `items`) with one entry per line.

    Each entry is encoded by the C encoder (``json.dumps`` without indent), which is ~10x
    faster than ``json.dump(..., indent=...)``; one line per record keeps the file readable.
    ``encoded``: the values of `items` are JSON text already (the live writer encodes each
    record once, for its journal line and for dump.json).
    """
    key, value = json_string, _json_value        # keys are str; most values are str or None
    parts = [f"{key(k)}: {value(v)}" for k, v in head.items()]
    if field is not None:
        pairs = (items or {}).items()
        body = ",\n".join(f"{key(k)}: {v}" for k, v in pairs) if encoded else \
            ",\n".join(f"{key(k)}: {value(v)}" for k, v in pairs)
        parts.append(f"{key(field)}: {{\n{body}\n}}" if body else f"{key(field)}: {{}}")
    return "{" + ",\n".join(parts) + "}\n"


def read_json(path: "os.PathLike | str") -> Any:
    """Parse a JSON file; any failure becomes one DumpFormatError naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DumpFormatError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DumpFormatError(f"{path}: cannot be read ({e})") from None
    if not text.strip():
        raise DumpFormatError(f"{path}: file is empty (the run may have stopped before it was written)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DumpFormatError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} ({e.msg}); "
                              f"the file may be truncated") from None


def read_json_optional(path: "os.PathLike | str", default: Any) -> Any:
    """A side file that may be absent (stack.json, construct.json): `default` when missing."""
    return read_json(path) if os.path.isfile(path) else default


def json_safe(v: Any) -> Any:
    """`v` with every non-finite float written as "nan", "inf" or "-inf" (so json.loads never
    trips and other tools read the file)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def csv_value(v: Any) -> Any:
    """A CSV cell (compare.csv, acc-check's CSVs): numbers stay numbers at full precision;
    NaN/Inf as JSON writes them ("nan", "inf"); lists and dicts as JSON."""
    if v is None:
        return ""
    kind = type(v)
    if kind is float:           # the common cells first: a compare.csv has ~50 a row
        return repr(v) if math.isfinite(v) else json_safe(v)
    if kind is str or kind is int or kind is bool:
        return v
    v = json_safe(v)
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v)
    return repr(v) if isinstance(v, float) else v
