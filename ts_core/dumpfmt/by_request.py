"""Offline: cut a token-range dump into one dump per request with one step per token position.

A batched inference engine computes several requests (and several tokens of a prompt) in one
forward, so a record holds rows of several requests. With the ``token_map.json`` written beside
it (:mod:`.token_map`), every row-shaped tensor is cut to one request's rows; the result is an
ordinary dump tree ``req{i}/step{k}/rank{R}/`` that the ordinary compare pairs token k with token
k, whatever the batching of either run.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .checksum import XOR, checksum_kind, xor_of_array
from .jsonio import write_json_atomic
from .keys import parse_key
from .layout import DUMP_JSON, TENSOR_DIR, TOKEN_MAP, step_dir_name
from .rankdir import RankFiles, StackGroup, read_rank_files, write_rank_files
from .records import PARAMETERS, map_summaries
from ..native import crc32_hex
from .refstats import reference_stats
from .token_map import FORMAT, read_token_map

__all__ = ["split_by_request"]

Part = Tuple[dict, dict]          # (iteration entry of the token map, one of its segments)


def split_by_request(dump_path: str, out_dir: str) -> List[str]:
    """Write ``out_dir/req{index}/step{k}/{rank}/`` for every rank folder under `dump_path` that
    has a token_map.json: the records of the forwards that computed token k of that request,
    with every tensor cut to that request's rows (statistics recomputed from the cut data).
    When several step folders have token maps, each gets its own ``out_dir/step{N}/`` level.

    Needs ``task: tensor`` when several requests share a forward (statistics of a whole batch
    cannot be divided); a forward holding one request only is copied as it is. Returns the
    folders written. ``compare(out_a/req0, out_b/req0)`` then pairs token k with token k.
    """
    rank_dirs = list(_rank_dirs_with_map(dump_path))
    if not rank_dirs:
        raise FileNotFoundError(f"no {TOKEN_MAP} under {dump_path}: was it dumped with TokenRangeDump "
                                "or generate_with_dump?")
    steps = {_step_of(d) for d in rank_dirs}
    written: List[str] = []
    for rank_dir in rank_dirs:
        target = os.path.join(out_dir, _step_of(rank_dir)) if len(steps) > 1 else out_dir
        written.extend(_split_rank_dir(rank_dir, target))
    return written


def _step_of(rank_dir: str) -> str:
    return os.path.basename(os.path.dirname(os.path.normpath(rank_dir)))


def _rank_dirs_with_map(root: str) -> Iterator[str]:
    if os.path.isfile(os.path.join(root, TOKEN_MAP)):
        yield root
        return
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        if TOKEN_MAP in filenames and DUMP_JSON in filenames:
            yield dirpath


def _split_rank_dir(rank_dir: str, out_dir: str) -> List[str]:
    tmap = read_token_map(rank_dir)
    files = read_rank_files(rank_dir)
    rank_name = os.path.basename(os.path.normpath(rank_dir))
    requests = tmap["requests"]
    groups: Dict[Tuple[str, int], List[Part]] = {}        # (request, token) -> its parts
    for it in tmap["iterations"]:
        for seg in it["segments"]:
            if seg.get("in_range"):
                groups.setdefault((seg["request"], seg["token"]), []).append((it, seg))
    written = []
    for (rid, token), parts in sorted(groups.items(), key=lambda kv: (requests[kv[0][0]]["index"], kv[0][1])):
        index = requests[rid]["index"]
        target = os.path.join(out_dir, f"req{index}", step_dir_name(token), rank_name)
        _write_split(target, files, parts,
                     {"format": FORMAT, "source": tmap.get("source"), "split_of": os.path.abspath(rank_dir),
                      "request": rid, "index": index, "token": token,
                      "prompt_len": requests[rid].get("prompt_len"),
                      "iterations": [it["iteration"] for it, _ in parts]})
        written.append(target)
    return written


def _write_split(target: str, files: RankFiles, parts: List[Part], meta: dict) -> None:
    """One request/token folder: its records renumbered from 0, tensors cut, side files kept."""
    out_tensors = os.path.join(target, TENSOR_DIR)
    counters: Dict[Tuple[str, str, str], int] = {}
    renamed: Dict[str, str] = {}
    new_data: Dict[str, Any] = {}
    has_tensors = False
    for it, seg in parts:
        for key in it.get("records", []):
            if key not in files.data:
                continue
            info = parse_key(key)
            name = (info.name, info.kind, info.direction)
            n = counters.get(name, 0)
            counters[name] = n + 1
            new_key = info.with_counter(n)
            renamed[key] = new_key
            cutter = _Cutter(it, seg, files.tensor_dir, out_tensors, key, new_key)
            new_data[new_key] = {field: value if field == PARAMETERS else map_summaries(value, cutter.tensor)
                                 for field, value in files.data[key].items()}
            has_tensors = has_tensors or cutter.wrote
    head = dict(files.header, dump_data_dir=out_tensors if has_tensors else None)
    stacks: List[StackGroup] = [(kept, frames) for keys, frames in files.stacks
                                for kept in [[renamed[k] for k in keys if k in renamed]] if kept]
    construct = {renamed[k]: renamed.get(p) if p is not None else None
                 for k, p in files.construct.items() if k in renamed}
    os.makedirs(target, exist_ok=True)
    write_rank_files(target, head, new_data, stacks, construct)
    write_json_atomic(os.path.join(target, TOKEN_MAP), meta)


class _Cutter:
    """Cuts every row-shaped tensor summary of one record to one segment's rows."""

    def __init__(self, it: dict, seg: dict, tensor_dir: str, out_tensors: str, old_key: str, new_key: str):
        self.it, self.seg = it, seg
        self.tensor_dir, self.out_tensors = tensor_dir, out_tensors
        self.old_key, self.new_key = old_key, new_key
        self.wrote = False

    def index(self, shape: List[int]) -> Optional[Tuple[Any, bool]]:
        """(numpy index, covers everything) for a tensor of `shape`, or None: not per row.

        Layout "flat" (vLLM): dimension 0 is the flattened rows of all requests; tensors with
        one row per request (logits) are indexed by ``logits_row``. Layout "batch" (HF):
        dimension 0 is the batch row, dimension 1 the sequence."""
        it, seg = self.it, self.seg
        if not shape:
            return None
        if it["layout"] == "flat":
            n, r = it["num_rows"], it["num_reqs"]
            a, b = seg["rows"]
            if shape[0] == n:
                return np.s_[a:b], (a == 0 and b == n)
            lr = seg.get("logits_row")
            if shape[0] == r and lr is not None:
                return np.s_[lr:lr + 1], r == 1
            return None
        bsz, seq = it["num_rows"], it.get("seq_len")
        bi = seg["batch_index"]
        a, b = seg["rows"]
        if shape[0] != bsz:
            return None
        if len(shape) >= 2 and shape[1] == seq:
            return np.s_[bi, a:b], (bsz == 1 and a == 0 and b == seq)
        if len(shape) >= 2 and shape[1] == 1 and b == seq:
            return np.s_[bi, 0:1], bsz == 1
        return np.s_[bi], bsz == 1

    def tensor(self, summ: dict) -> dict:
        cut = self.index(list(summ["shape"]))
        name = summ.get("data_name")
        if cut is None:
            return self._save(summ, self._load(name), restat=False) if name else dict(summ)
        idx, whole = cut
        if name is None:
            if whole:          # one request in this forward: its statistics are the record's
                shape = np.broadcast_to(np.empty((), np.uint8), summ["shape"])[idx].shape
                return dict(summ, shape=list(shape))
            raise ValueError(
                f"split_by_request: {self.old_key} (forward {self.it['iteration']}) holds rows of several "
                "requests and this dump has statistics only; dump with task 'tensor' to split it "
                "(statistics of a batch cannot be divided).")
        return self._save(summ, np.ascontiguousarray(self._load(name)[idx]))

    def _load(self, name: str) -> np.ndarray:
        return np.load(os.path.join(self.tensor_dir, name), mmap_mode="r")

    def _save(self, summ: dict, arr: np.ndarray, restat: bool = True) -> dict:
        old = summ["data_name"]
        new_name = self.new_key + old[len(self.old_key):] if old.startswith(self.old_key) else old
        os.makedirs(self.out_tensors, exist_ok=True)
        np.save(os.path.join(self.out_tensors, new_name), np.asarray(arr))
        self.wrote = True
        out = dict(summ, data_name=new_name)
        if restat:
            dtype = summ.get("dtype", "")
            out["shape"] = list(arr.shape)
            if checksum_kind(summ.get("md5")) == XOR:      # xor mode: the checksum instead of statistics
                out["md5"] = xor_of_array(arr) if "bfloat16" not in dtype else None
                return out
            out.update(reference_stats(arr, dtype))
            if "md5" in summ:      # bfloat16 is stored as float32: its CRC would not be the tensor's
                out["md5"] = crc32_hex(np.ascontiguousarray(arr).view(np.uint8)) if "bfloat16" not in dtype else None
        return out
