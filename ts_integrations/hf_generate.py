"""Inference capture by token range: Hugging Face ``generate`` and the machinery shared with vLLM.

``generate_with_dump(model, debugger, token_range=(s, e), **generate_kwargs)`` dumps the
forwards of decoding iterations s..e (iteration 0 = prefill) of ``model.generate`` and writes
``token_map.json`` next to dump.json; see docs/inference.md.

The shared part (:class:`TokenWindow`) opens a collection window around each top-level
forward whose rows hold at least one request at a token position inside the range. A
*describer* (one for HF, one for vLLM) says which rows of that forward belong to which request
and token position; the window writes that, plus the keys of the records the forward produced,
to ``token_map.json``. :func:`split_by_request` turns a dump and its token map into one dump
tree per request with one ``step{k}`` folder per token position, so the ordinary compare pairs
token k of a request with token k of the same request in another run.

Nothing here imports torch or transformers at module import time.
"""
from __future__ import annotations

import json
import os
import re
import warnings
import zlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

TOKEN_MAP = "token_map.json"
FORMAT = "tsprobe.token_map/1"


# -- debugger access -----------------------------------------------------------------------------
# PrecisionDebugger has no public per-forward switch yet; these helpers use it when it appears
# (see docs/inference.md, "Core hooks") and fall back to its documented-internal state.

def check_token_range(token_range: Any) -> Tuple[int, int]:
    if (not isinstance(token_range, (list, tuple)) or len(token_range) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in token_range)
            or token_range[0] > token_range[1]):
        raise ValueError(f"token_range must be [start, end] with 0 <= start <= end (inclusive; 0 = the "
                         f"prefill), got {token_range!r}")
    return int(token_range[0]), int(token_range[1])


# -- what one forward holds ----------------------------------------------------------------------

class Segment(dict):
    """The rows of one forward that belong to one request at one token position.

    Keys: ``request`` (id), ``token`` (k: 0 = prompt/prefill rows, k >= 1 = the forward that
    consumes generated token k-1 and produces generated token k), ``rows`` ([a, b): flat row
    range for layout "flat", range along the sequence dim for layout "batch"),
    ``batch_index`` (layout "batch"), ``positions`` ([p0, p1): absolute positions in the
    sequence), ``logits_row`` (row of the logits tensor, when this segment ends the request's
    rows in this forward), ``sampled`` (this forward's logits produce the request's next token),
    ``in_range``."""


class IterationInfo:
    """Filled by a describer at the start of a top-level forward."""

    def __init__(self, layout: str, segments: List[Segment], *, num_rows: int, num_reqs: int,
                 seq_len: Optional[int] = None, prompt_lens: Optional[Dict[str, int]] = None,
                 extra: Optional[dict] = None):
        self.layout = layout
        self.segments = segments
        self.num_rows = num_rows
        self.num_reqs = num_reqs
        self.seq_len = seq_len
        self.prompt_lens = prompt_lens or {}
        self.extra = extra or {}


Describer = Callable[[int, tuple, dict], IterationInfo]    # (iteration, args, kwargs) -> info


class TokenWindow:
    """Collect only the forwards (and only mark as in range the rows) of token positions s..e.

    ``with TokenWindow(debugger, model, (s, e), describe, end_module=...)``: starts the
    debugger on `model` with collection switched off, then for every top-level forward of
    `model` asks `describe` which request/token each row is; collection is on from that
    forward's start until `end_module`'s forward ends (vLLM: the logits processor, which runs
    after the model forward) or, without one, until the model forward ends. On exit: stop,
    token_map.json, and ``debugger.step()`` unless ``advance_step=False``.
    """

    def __init__(self, debugger: Any, model: Any, token_range: Sequence[int], describe: Describer, *,
                 source: str, end_module: Any = None, advance_step: bool = True,
                 request_index: Optional[Callable[[List[str]], Dict[str, int]]] = None):
        self.debugger = debugger
        self.model = model
        self.token_range = check_token_range(token_range)
        self.describe = describe
        self.source = source
        self.end_module = end_module
        self.advance_step = advance_step
        self.request_index = request_index or _default_request_index
        self.iterations: List[dict] = []
        self.requests: Dict[str, dict] = {}
        self.seen_iterations = 0
        self.token_map_path: Optional[str] = None
        self._handles: List[Any] = []
        self._open: Optional[dict] = None        # the collected forward in progress
        self._keys_before = 0
        self._rank_dir: Optional[str] = None
        self._warned = False

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> "TokenWindow":
        dbg = self.debugger
        dbg.start(self.model)
        dbg.set_collecting(False)
        if not dbg.in_window:         # this step or rank is not collected: do nothing
            return self
        self._rank_dir = dbg.open_dump_dir
        self._keys_before = len(dbg.record_keys())
        self._handles.append(self.model.register_forward_pre_hook(self._pre, with_kwargs=True, prepend=True))
        end = self.end_module if self.end_module is not None else self.model
        self._handles.append(end.register_forward_hook(self._post, always_call=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._close_iteration()
        dbg = self.debugger
        was_collecting = self._rank_dir is not None
        dbg.stop()
        if was_collecting:
            self._write_map()
        if self.advance_step:
            dbg.step()

    # -- per forward ----------------------------------------------------------------------------
    def _pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        self._close_iteration()              # a forward whose end hook never ran
        it = self.seen_iterations
        self.seen_iterations += 1
        try:
            info = self.describe(it, args, kwargs)
        except Exception as exc:            # never break the user's generation
            if not self._warned:
                self._warned = True
                warnings.warn(f"tsprobe: could not tell which request each row of forward {it} belongs to "
                              f"({type(exc).__name__}: {exc}); that forward is not dumped.", RuntimeWarning)
            return
        lo, hi = self.token_range
        for rid, plen in info.prompt_lens.items():
            req = self.requests.setdefault(rid, {"prompt_len": plen, "tokens": [], "first_position": None})
            req["prompt_len"] = plen
        for seg in info.segments:
            seg["in_range"] = lo <= seg["token"] <= hi
            req = self.requests.setdefault(seg["request"], {"prompt_len": None, "tokens": [], "first_position": None})
            if req["first_position"] is None:
                req["first_position"] = seg["positions"][0]
        if not any(seg["in_range"] for seg in info.segments):
            return
        entry = {"iteration": it, "layout": info.layout, "num_rows": info.num_rows, "num_reqs": info.num_reqs}
        if info.seq_len is not None:
            entry["seq_len"] = info.seq_len
        entry.update(info.extra)
        entry["segments"] = [dict(s) for s in info.segments]
        self._open = entry
        self.debugger.set_collecting(True)

    def _post(self, module: Any, args: tuple, output: Any) -> None:
        self._close_iteration()

    def _close_iteration(self) -> None:
        entry = self._open
        if entry is None:
            return
        self._open = None
        self.debugger.set_collecting(False)
        keys = self.debugger.record_keys()
        entry["records"] = keys[self._keys_before:]
        self._keys_before = len(keys)
        self.iterations.append(entry)
        for seg in entry["segments"]:
            if seg["in_range"]:
                toks = self.requests[seg["request"]]["tokens"]
                if seg["token"] not in toks:
                    toks.append(seg["token"])

    # -- output -----------------------------------------------------------------------------------
    def token_map(self) -> dict:
        index = self.request_index(list(self.requests))
        reqs = {rid: {"index": index[rid], **info} for rid, info in
                sorted(self.requests.items(), key=lambda kv: index[kv[0]])}
        return {"format": FORMAT, "source": self.source, "token_range": list(self.token_range),
                "forwards_seen": self.seen_iterations, "requests": reqs, "iterations": self.iterations}

    def _write_map(self) -> None:
        if self._rank_dir is None or not os.path.isdir(self._rank_dir):
            return
        path = os.path.join(self._rank_dir, TOKEN_MAP)
        data = self.token_map()
        if os.path.isfile(path):        # a second window in the same step folder: append
            try:
                with open(path, encoding="utf-8") as f:
                    old = json.load(f)
                data = _merge_maps(old, data)
            except (OSError, ValueError):
                pass
        try:
            _write_json(path, data)
            self.token_map_path = path
        except OSError as exc:
            warnings.warn(f"tsprobe: could not write {path}: {exc}", RuntimeWarning)


def _write_json(path: str, obj: Any) -> None:
    """Complete file or none: write a temporary file, then rename it over `path`."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _default_request_index(ids: List[str]) -> Dict[str, int]:
    """Numeric ids (vLLM's "0", "1", ...; HF batch rows) in numeric order, others as first seen."""
    if all(re.fullmatch(r"\d+", i) for i in ids):
        order = sorted(ids, key=int)
    else:
        order = list(ids)
    return {rid: n for n, rid in enumerate(order)}


def _merge_maps(old: dict, new: dict) -> dict:
    """A second window in the same step folder: its requests come after the first's; an id
    used already (HF batch rows restart at "0") gets the next free number."""
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


# -- Hugging Face generate -------------------------------------------------------------------------

def _hf_describe(iteration: int, args: tuple, kwargs: dict) -> IterationInfo:
    """One ``model.generate`` forward: [B, T] inputs, left padding marked by the attention mask."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        ids = kwargs["inputs_embeds"]
    bsz, seq = int(ids.shape[0]), int(ids.shape[1])
    mask = kwargs.get("attention_mask")
    pos = kwargs.get("position_ids")
    valid = mask[:, -seq:].bool().tolist() if mask is not None and mask.dim() == 2 else [[True] * seq] * bsz
    totals = mask.sum(dim=1).tolist() if mask is not None and mask.dim() == 2 else None
    segments, prompt_lens = [], {}
    for b in range(bsz):
        cols = [t for t, v in enumerate(valid[b]) if v]
        if not cols:
            continue
        a, e = cols[0], cols[-1] + 1
        if pos is not None:
            p0 = int(pos[b, a])
        elif totals is not None:
            p0 = int(totals[b]) - (e - a)
        else:
            p0 = iteration + seq - 1 if iteration else 0
        rid = str(b)
        if iteration == 0:
            prompt_lens[rid] = e - a
        segments.append(Segment(request=rid, token=iteration, batch_index=b, rows=[a, e],
                                positions=[p0, p0 + e - a], logits_row=b, sampled=True))
    return IterationInfo("batch", segments, num_rows=bsz, num_reqs=bsz, seq_len=seq, prompt_lens=prompt_lens)


def generate_with_dump(model: Any, debugger: Any, token_range: Sequence[int], *args: Any,
                       advance_step: bool = True, **generate_kwargs: Any) -> Any:
    """``model.generate(*args, **generate_kwargs)`` dumping only decoding iterations s..e.

    Iteration 0 is the prefill, iteration k >= 1 the forward that consumes generated token
    k-1 (one forward per token, as ``generate`` runs with its KV cache). Request ids in the
    token map are the batch rows ("0", "1", ...; with ``num_beams``/``num_return_sequences``
    every expanded row is its own request). Batched prompts need left padding
    (``tokenizer.padding_side = "left"``), as ``generate`` itself does for decoder-only models.
    Returns what ``generate`` returns; the dump folder is closed with ``debugger.step()``
    unless ``advance_step=False``.
    """
    with TokenWindow(debugger, model, token_range, _hf_describe, source="hf_generate",
                     advance_step=advance_step):
        return model.generate(*args, **generate_kwargs)


# -- offline: one dump per request, one step per token position -----------------------------------

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
    steps = {os.path.basename(os.path.dirname(os.path.normpath(d))) for d in rank_dirs}
    written: List[str] = []
    for rank_dir in rank_dirs:
        step_name = os.path.basename(os.path.dirname(os.path.normpath(rank_dir)))
        target = os.path.join(out_dir, step_name) if len(steps) > 1 else out_dir
        written.extend(_split_rank_dir(rank_dir, target))
    return written


def _rank_dirs_with_map(root: str) -> Iterator[str]:
    if os.path.isfile(os.path.join(root, TOKEN_MAP)):
        yield root
        return
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        if TOKEN_MAP in filenames and "dump.json" in filenames:
            yield dirpath


def _split_rank_dir(rank_dir: str, out_dir: str) -> List[str]:
    with open(os.path.join(rank_dir, TOKEN_MAP), encoding="utf-8") as f:
        tmap = json.load(f)
    with open(os.path.join(rank_dir, "dump.json"), encoding="utf-8") as f:
        dump = json.load(f)
    stacks, construct = _load_optional(rank_dir, "stack.json"), _load_optional(rank_dir, "construct.json")
    data = dump.get("data", {})
    tensor_dir = os.path.join(rank_dir, "dump_tensor_data")
    rank_name = os.path.basename(os.path.normpath(rank_dir))
    requests = tmap.get("requests", {})
    # (request, token) -> list of (iteration entry, segment)
    groups: Dict[Tuple[str, int], List[Tuple[dict, dict]]] = {}
    for it in tmap.get("iterations", []):
        for seg in it["segments"]:
            if seg.get("in_range"):
                groups.setdefault((seg["request"], seg["token"]), []).append((it, seg))
    written = []
    for (rid, token), parts in sorted(groups.items(), key=lambda kv: (requests[kv[0][0]]["index"], kv[0][1])):
        index = requests[rid]["index"]
        target = os.path.join(out_dir, f"req{index}", f"step{token}", rank_name)
        _write_split(target, dump, data, stacks, construct, tensor_dir, parts,
                     {"format": FORMAT, "source": tmap.get("source"), "split_of": os.path.abspath(rank_dir),
                      "request": rid, "index": index, "token": token,
                      "prompt_len": requests[rid].get("prompt_len"),
                      "iterations": [it["iteration"] for it, _ in parts]})
        written.append(target)
    return written


def _load_optional(rank_dir: str, name: str) -> dict:
    path = os.path.join(rank_dir, name)
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _split_key(key: str) -> Tuple[str, str, int]:
    """(base, direction, index) of ``Module.x.Cls.forward.3`` or ``Torch.add.3.forward``."""
    head, a, b = key.rsplit(".", 2)
    if a.isdigit():
        return head, b, int(a)
    return head, a, int(b)


def _join_key(key: str, base: str, direction: str, index: int) -> str:
    _, a, _ = key.rsplit(".", 2)
    return f"{base}.{index}.{direction}" if a.isdigit() else f"{base}.{direction}.{index}"


def _write_split(target: str, dump: dict, data: dict, stacks: dict, construct: dict, tensor_dir: str,
                 parts: List[Tuple[dict, dict]], meta: dict) -> None:
    out_tensors = os.path.join(target, "dump_tensor_data")
    counters: Dict[Tuple[str, str], int] = {}
    renamed: Dict[str, str] = {}
    new_data: Dict[str, Any] = {}
    has_tensors = False
    for it, seg in parts:
        for key in it.get("records", []):
            if key not in data:
                continue
            base, direction, _ = _split_key(key)
            n = counters.get((base, direction), 0)
            counters[(base, direction)] = n + 1
            new_key = _join_key(key, base, direction, n)
            renamed[key] = new_key
            cutter = _Cutter(it, seg, tensor_dir, out_tensors, key, new_key)
            rec = data[key]
            new_rec = {}
            for field, value in rec.items():
                new_rec[field] = value if field == "parameters" else cutter.walk(value)
            new_data[new_key] = new_rec
            has_tensors = has_tensors or cutter.wrote
    head = {k: v for k, v in dump.items() if k != "data"}
    head["dump_data_dir"] = out_tensors if has_tensors else None
    os.makedirs(target, exist_ok=True)
    _write_json(os.path.join(target, "dump.json"), dict(head, data=new_data))
    new_stacks = {}
    for sid, (keys, frames) in stacks.items():
        kept = [renamed[k] for k in keys if k in renamed]
        if kept:
            new_stacks[str(len(new_stacks))] = [kept, frames]
    _write_json(os.path.join(target, "stack.json"), new_stacks)
    new_construct = {renamed[k]: renamed.get(p) if p is not None else None
                     for k, p in construct.items() if k in renamed}
    _write_json(os.path.join(target, "construct.json"), new_construct)
    _write_json(os.path.join(target, TOKEN_MAP), meta)


class _Cutter:
    """Cuts every row-shaped tensor summary of one record to one segment's rows."""

    def __init__(self, it: dict, seg: dict, tensor_dir: str, out_tensors: str, old_key: str, new_key: str):
        self.it, self.seg = it, seg
        self.tensor_dir, self.out_tensors = tensor_dir, out_tensors
        self.old_key, self.new_key = old_key, new_key
        self.wrote = False

    def walk(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.walk(v) for v in value]
        if isinstance(value, dict):
            if "shape" in value and "dtype" in value and "type" in value:
                return self.tensor(value)
            return {k: self.walk(v) for k, v in value.items()}
        return value

    def index(self, shape: List[int]) -> Optional[Tuple[Any, bool]]:
        """(numpy index, covers everything) for a tensor of `shape`, or None: not per row."""
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
            return self._copy_file(summ) if name else dict(summ)
        idx, whole = cut
        if name is None:
            if whole:
                out = dict(summ)
                out["shape"] = list(np.empty(summ["shape"], dtype=np.uint8)[idx].shape)
                return out
            raise ValueError(
                f"split_by_request: {self.old_key} (forward {self.it['iteration']}) holds rows of several "
                "requests and this dump has statistics only; dump with task 'tensor' to split it "
                "(statistics of a batch cannot be divided).")
        arr = np.load(os.path.join(self.tensor_dir, name), mmap_mode="r")
        part = np.ascontiguousarray(arr[idx])
        return self._save(summ, part)

    def _copy_file(self, summ: dict) -> dict:
        arr = np.load(os.path.join(self.tensor_dir, summ["data_name"]), mmap_mode="r")
        return self._save(summ, np.asarray(arr), restat=False)

    def _save(self, summ: dict, arr: np.ndarray, restat: bool = True) -> dict:
        out = dict(summ)
        new_name = self.new_key + summ["data_name"][len(self.old_key):] if summ["data_name"].startswith(
            self.old_key) else summ["data_name"]
        os.makedirs(self.out_tensors, exist_ok=True)
        np.save(os.path.join(self.out_tensors, new_name), arr)
        self.wrote = True
        out["data_name"] = new_name
        if restat:
            out["shape"] = list(arr.shape)
            out.update(_np_stats(arr, summ.get("dtype", "")))
            if "md5" in summ:
                out["md5"] = (f"{zlib.crc32(arr.tobytes()) & 0xFFFFFFFF:08x}"
                              if "bfloat16" not in summ.get("dtype", "") else None)
        return out


def _np_stats(arr: np.ndarray, dtype: str) -> dict:
    if arr.size == 0:
        return {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if np.iscomplexobj(arr):
        arr = np.abs(arr)
    if arr.dtype == np.bool_ or "bool" in dtype:
        f = arr.astype(np.float64)
        return {"Max": bool(f.max()), "Min": bool(f.min()), "Mean": float(f.mean()),
                "Norm": float(np.linalg.norm(f.ravel()))}
    f = arr.astype(np.float64)
    mx, mn = f.max(), f.min()
    if np.issubdtype(arr.dtype, np.integer):
        mx, mn = int(arr.max()), int(arr.min())
    else:
        mx, mn = float(mx), float(mn)
    return {"Max": mx, "Min": mn, "Mean": float(f.mean()), "Norm": float(np.linalg.norm(f.ravel()))}
