"""The token window shared by the inference captures (Hugging Face ``generate``, vLLM).

:class:`TokenWindow` opens a collection window around each top-level forward whose rows hold
at least one request at a token position inside the range. A *describer* (one per engine:
``hf_generate._hf_describe``, ``vllm._VllmDescriber``) says which rows of that forward belong
to which request and token position; the window writes that, plus the keys of the records the
forward produced, to ``token_map.json`` (format: :mod:`ts_core.dumpfmt.token_map`).

Only the debugger's public per-forward surface is used: ``start``/``stop``/``step``,
``in_window``, ``set_collecting``, ``open_dump_dir`` and ``record_keys``.
Nothing here imports torch at module import time.
"""
from __future__ import annotations

import os
import re
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ts_core.dumpfmt.token_map import FORMAT, write_token_map
from ts_core.model_hooks import ModelHook, hooks_of

__all__ = ["Describer", "IterationInfo", "Segment", "TokenWindow", "check_token_range"]


def check_token_range(token_range: Any) -> Tuple[int, int]:
    if (not isinstance(token_range, (list, tuple)) or len(token_range) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in token_range)
            or token_range[0] > token_range[1]):
        raise ValueError(f"token_range must be [start, end] with 0 <= start <= end (inclusive; 0 = the "
                         f"prefill), got {token_range!r}")
    return int(token_range[0]), int(token_range[1])


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
        self._handles: List[Any] = []            # removable: one per client of the model's hook owner
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
        start = _Hook(pre=self._pre, post=None if self.end_module is not None else self._post, prepend=True)
        self._handles.append(hooks_of(self.model).add(start))
        if self.end_module is not None:
            self._handles.append(hooks_of(self.end_module).add(_Hook(post=self._post)))
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
    def _pre(self, ctx: Any, module: Any, args: tuple, kwargs: dict) -> None:
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

    def _post(self, ctx: Any, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
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
        try:
            self.token_map_path = write_token_map(self._rank_dir, self.token_map())
        except OSError as exc:
            warnings.warn(f"tsprobe: could not write the token map into {self._rank_dir}: {exc}", RuntimeWarning)


class _Hook(ModelHook):
    """The window's forward hooks on one module (a client of its hook owner)."""

    def __init__(self, pre: Optional[Callable] = None, post: Optional[Callable] = None, prepend: bool = False):
        self.pre_forward = pre
        self.post_forward = post
        self.prepend = prepend


def _default_request_index(ids: List[str]) -> Dict[str, int]:
    """Numeric ids (vLLM's "0", "1", ...; HF batch rows) in numeric order, others as first seen."""
    if all(re.fullmatch(r"\d+", i) for i in ids):
        order = sorted(ids, key=int)
    else:
        order = list(ids)
    return {rid: n for n, rid in enumerate(order)}
