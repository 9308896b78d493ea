"""Module names as the plain model has them, in dumps of a wrapped one.

Wrappers put the user's module one level down, under a name of their own: FSDP1
(``FullyShardedDataParallel._fsdp_wrapped_module``), activation checkpointing
(``CheckpointWrapper._checkpoint_wrapped_module``) and torch.compile (``OptimizedModule._orig_mod``).
tsprobe names modules without them since issue 37; dumps written by msprobe or an older tsprobe
carry ``Module._fsdp_wrapped_module.blocks.0._fsdp_wrapped_module.attn...`` and a record of each
wrapper itself, and then nothing pairs with a plain run's ``Module.blocks.0.attn...``. Here the
wrapper segments are removed from module keys, and the wrappers' own records (the same call as
the module they wrap, one level up) and the root model's (a plain run has none) are dropped.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

from ...dumpfmt import parse_key

SEGMENTS = frozenset(("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"))
WRAPPER_CLASSES = frozenset(("FullyShardedDataParallel", "CheckpointWrapper", "OffloadWrapper", "OptimizedModule"))


def unwrap_keys(data: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(`data` with plain module keys, {old key: new key}); `data` itself when no key holds a
    wrapper segment. A dropped record maps to ""."""
    if not any(seg in key for key in data for seg in SEGMENTS if key.startswith("Module.")):
        return data, {}
    out: Dict[str, Any] = {}
    renamed: Dict[str, str] = {}
    for key, rec in data.items():
        parts = key.split(".")
        if parts[0] != "Module" or not SEGMENTS.intersection(parts):
            out[key] = rec
            continue
        info = parse_key(key)
        path = [p for p in info.name.split(".")[1:-1] if p not in SEGMENTS]
        cls = info.name.rsplit(".", 1)[-1]
        if not path or cls in WRAPPER_CLASSES:
            renamed[key] = ""
            continue
        new = ".".join(["Module"] + path + [cls]) + key[len(info.name):]
        if new in out or new in data:
            renamed[key] = ""
            continue
        out[new] = rec
        renamed[key] = new
    # a record not renamed whose key is a wrapper's (no segment left in it: the outermost wrapper)
    for key in [k for k in out if k.startswith("Module.") and parse_key(k).name.rsplit(".", 1)[-1] in WRAPPER_CLASSES]:
        del out[key]
        renamed[key] = ""
    return out, renamed
