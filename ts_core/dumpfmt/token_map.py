"""``token_map.json``: which rows of the records of a token-range dump are which request and token.

Written next to dump.json by the token-range captures (vLLM, Hugging Face ``generate``; see
docs/inference.md)::

    {"format": "tsprobe.token_map/1", "source": "vllm", "token_range": [s, e], "forwards_seen": N,
     "requests": {ID: {"index", "prompt_len", "tokens", "first_position"}},
     "iterations": [{"iteration", "layout", "num_rows", "num_reqs", "seq_len"?, ...,
                     "segments": [{"request", "token", "rows", "positions", "in_range", ...}],
                     "records": [KEY, ...]}]}

The dump itself stays an ordinary dump; this file is enough to cut any row-shaped tensor into
"request r, token k" (:mod:`.by_request`).
"""
from __future__ import annotations

import os
from typing import Any, Dict

from .errors import DumpFormatError
from .jsonio import read_json, write_json_atomic
from .layout import TOKEN_MAP

FORMAT = "tsprobe.token_map/1"

__all__ = ["FORMAT", "TOKEN_MAP", "merge_token_maps", "read_token_map", "write_token_map"]


def read_token_map(rank_dir: str) -> Dict[str, Any]:
    """The token map of a rank folder; DumpFormatError naming the file when it is not one."""
    path = os.path.join(rank_dir, TOKEN_MAP)
    tmap = read_json(path)
    if not isinstance(tmap, dict) or not isinstance(tmap.get("requests"), dict) \
            or not isinstance(tmap.get("iterations"), list):
        raise DumpFormatError(f"{path}: not a token map (expected \"requests\" and \"iterations\")")
    return tmap


def merge_token_maps(old: Dict[str, Any], new: Dict[str, Any]) -> Dict[str, Any]:
    """A second window in the same step folder: its requests come after the first's; an id
    used already (HF batch rows restart at "0") gets the next free number. Returns `old`, extended."""
    reqs = old.setdefault("requests", {})
    used = set(reqs)
    base = len(reqs)
    rename: Dict[str, str] = {}
    nxt = base
    for rid, info in sorted(new["requests"].items(), key=lambda kv: kv[1]["index"]):
        new_id = rid
        while new_id in used:
            while str(nxt) in used:
                nxt += 1
            new_id = str(nxt)
        used.add(new_id)
        rename[rid] = new_id
        info["index"] += base
        reqs[new_id] = info
    for it in new["iterations"]:
        for seg in it["segments"]:
            seg["request"] = rename.get(seg["request"], seg["request"])
    old.setdefault("iterations", []).extend(new["iterations"])
    old["forwards_seen"] = old.get("forwards_seen", 0) + new["forwards_seen"]
    return old


def write_token_map(rank_dir: str, tmap: Dict[str, Any]) -> str:
    """Write `tmap` into `rank_dir` atomically, appended to the map already there (a second
    window in the same step); an unreadable old map is replaced. Returns the file's path."""
    path = os.path.join(rank_dir, TOKEN_MAP)
    if os.path.isfile(path):
        try:
            tmap = merge_token_maps(read_token_map(rank_dir), tmap)
        except DumpFormatError:
            pass
    write_json_atomic(path, tmap)
    return path
