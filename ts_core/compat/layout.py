"""Translate one tsprobe dump folder (dump.json, stack.json, construct.json, npy files) into
TroubleShooter's api_dump layout.

TroubleShooter names: ``{NN|Tensor|Functional|Primitive}_{NAME}_{cnt}_{forward|backward}_{input|output}.{idx}``.
* ``NN``: a leaf module/Cell (``Module.fc.Linear.forward.0`` -> ``NN_Linear_{cnt}``); the API calls
  made inside a leaf module are not listed separately (TroubleShooter wraps the layer, not its inside).
  Non-leaf modules (containers) are not listed; the APIs they call are.
* ``Tensor``: Tensor methods; ``Functional``: torch/functional/ops/mint functions;
  ``Primitive``: MindSpore Primitive calls outside a leaf Cell.
* ``cnt`` counts forward calls per ``{type}_{NAME}`` in execution order, across start/stop windows.
* forward ``input.i`` = i-th flattened argument (args then kwargs), ``output.i`` = i-th output;
  backward ``input.i`` = gradient of the i-th forward output (what flows into backward),
  backward ``output.i`` = gradient of the i-th forward input.
"""
from __future__ import annotations

import math
import os
import shutil
from typing import Any, Dict, List, Optional, Tuple

from ..dumpfmt import (BACKWARD, FORWARD, MODULE_PREFIXES, KeyInfo, parse_key, read_json_optional, read_rank_files,
                       write_json_atomic)


def ts_identity(info: KeyInfo) -> Optional[Tuple[str, str]]:
    """(TroubleShooter type, name) of a forward/backward record: ``("NN", "Linear")``,
    ``("Functional", "linear")``, ``("Tensor", "__add__")``, ``("Primitive", "MatMul")``;
    None for records TroubleShooter has no row for (parameters_grad, debug-level saves)."""
    if info.direction not in (FORWARD, BACKWARD):
        return None
    if info.kind == "module" and info.prefix in MODULE_PREFIXES:
        return "NN", info.class_name
    if info.kind != "api":
        return None
    ts_type = info.prefix if info.prefix in ("Tensor", "Primitive") else "Functional"
    return ts_type, info.name.rsplit(".", 1)[-1]


def _leaves(value: Any, out: List[Any]) -> List[Any]:
    if isinstance(value, dict) and "type" in value and ("dtype" in value or "value" in value):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _leaves(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _leaves(v, out)
    else:
        out.append(None)
    return out


_FLOAT_WORDS = ("float", "bfloat", "half", "double", "complex")


def _is_float(s: Dict[str, Any]) -> bool:
    return "dtype" in s and any(w in str(s["dtype"]).lower() for w in _FLOAT_WORDS)


def _num(x: Any) -> Optional[float]:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


class Translator:
    """Keeps TroubleShooter counters and output across several dump folders (start/stop windows)."""

    def __init__(self, out_dir: str, prefix: str):
        self.out_dir = out_dir
        self.prefix = prefix                          # "torch" | "mindspore"
        self.npy_dir = os.path.join(out_dir, f"{prefix}_api_dump")
        self.info_path = os.path.join(out_dir, f"{prefix}_api_dump_info.json")
        self.stack_path = os.path.join(out_dir, f"{prefix}_api_dump_stack.json")
        self.counts: Dict[str, int] = {}
        self.info: List[list] = []
        self.stack: Dict[str, List[str]] = {}
        os.makedirs(self.npy_dir, exist_ok=True)

    # -- selection ------------------------------------------------------------------------
    @staticmethod
    def _selected(api: str, ordinal: int, mode: str, scope: Optional[List[str]], rng: List[Optional[int]]) -> bool:
        if mode == "all" or not scope:
            return True
        scope = [_strip_direction(str(x)) for x in scope]
        if mode == "list":
            return api in scope
        if mode == "api_list":
            name = api.split("_", 1)[1].rsplit("_", 1)[0].lower()
            return any(str(s).lower() in name for s in scope)
        if mode == "range":
            if rng[0] is None and api == scope[0]:
                rng[0] = ordinal
            if rng[0] is not None and rng[1] is None and api == scope[-1]:
                rng[1] = ordinal
                return True
            return rng[0] is not None and rng[1] is None
        return True

    def add_dump(self, dump_dir: str, *, mode: str = "all", scope: Optional[List[str]] = None,
                 dump_type: str = "all", filter_data: bool = True, retain_backward: bool = False) -> None:
        files = read_rank_files(dump_dir)
        construct = files.construct
        key_stack = files.stacks_by_key()
        data: Dict[str, Any] = files.data
        tensor_dir = files.tensor_dir
        infos = {k: parse_key(k) for k in data}
        parsed = {k: ts_identity(i) for k, i in infos.items()}

        def info_of(key: str) -> KeyInfo:
            return infos.get(key) or parse_key(key)

        parents_of_modules = {p for k, p in construct.items() if p and parsed.get(k) and parsed[k][0] == "NN"}

        def is_leaf_module(key: Optional[str]) -> bool:
            if not key:
                return False
            info = info_of(key)
            # a leaf: no module/Cell record names it as parent
            return ts_identity(info) is not None and ts_identity(info)[0] == "NN" \
                and info.forward_key not in parents_of_modules and key not in parents_of_modules

        def keep(key: str) -> bool:
            p = parsed[key]
            if p is None:
                return False
            if p[0] == "NN":
                return is_leaf_module(key)
            return not is_leaf_module(construct.get(key))   # calls inside a layer belong to the layer

        ts_of: Dict[str, str] = {}      # forward base -> TroubleShooter api name
        rng: List[Optional[int]] = [None, None]
        ordinal = 0
        for key, rec in data.items():
            p = parsed[key]
            if p is None or not keep(key):
                continue
            ts_type, name = p
            info = infos[key]
            direction = info.direction
            fwd_id = info.forward_key
            if direction == FORWARD:
                stem = f"{ts_type}_{name}"
                cnt = self.counts.get(stem, 0)
                self.counts[stem] = cnt + 1
                api = f"{stem}_{cnt}"
                ts_of[fwd_id] = api
                selected = self._selected(api, ordinal, mode, scope, rng)
                ordinal += 1
                if not selected:
                    ts_of[fwd_id] = None
                    continue
                self.stack[f"{api}_forward"] = list(key_stack.get(key, []))
                groups = [("input", _leaves(rec.get("input_args", []), []) + _leaves(rec.get("input_kwargs", {}), [])),
                          ("output", _leaves(rec.get("output", []), []))]
            else:
                if not retain_backward:
                    continue
                api = ts_of.get(fwd_id)
                if api is None:
                    continue
                groups = [("input", _leaves(rec.get("input", []), [])), ("output", _leaves(rec.get("output", []), []))]
            for part, leaves in groups:
                for idx, s in enumerate(leaves):
                    if s is None or "dtype" not in s:
                        continue               # scalars and None: no data file in TroubleShooter either
                    if filter_data and not _is_float(s):
                        continue
                    fname = f"{api}_{direction}_{part}.{idx}"
                    stats = [None, None, None]
                    if dump_type in ("all", "statistics") and "bool" not in str(s.get("dtype")).lower():
                        stats = [_num(s.get("Max")), _num(s.get("Min")), _num(s.get("Mean"))]
                    self.info.append([fname, key, 0, str(s.get("dtype")), list(s.get("shape") or []), stats])
                    src = s.get("data_name")
                    if dump_type in ("all", "npy") and src:
                        sp = os.path.join(tensor_dir, src)
                        if os.path.isfile(sp):
                            shutil.move(sp, os.path.join(self.npy_dir, fname + ".npy"))

    def write(self) -> None:
        write_json_atomic(self.info_path, self.info)
        write_json_atomic(self.stack_path, self.stack)


def _strip_direction(name: str) -> str:
    """Seed 000 writes list/range names with a direction (``NN_Dense_1_backward``); an API is
    selected as a whole, forward and backward together."""
    for sfx in ("_forward", "_backward"):
        if name.endswith(sfx):
            return name[: -len(sfx)]
    return name


def load_info(run_dir: str) -> Tuple[str, List[list], str]:
    """Find ``{prefix}_api_dump_info.json`` under ``run_dir`` (or ``run_dir/rank0``) ->
    (prefix, entries, npy folder)."""
    for d in (run_dir, os.path.join(run_dir, "rank0")):
        for prefix in ("torch", "mindspore", "mindtorch"):
            p = os.path.join(d, f"{prefix}_api_dump_info.json")
            if os.path.isfile(p):
                return prefix, read_json_optional(p, []), os.path.join(d, f"{prefix}_api_dump")
    raise FileNotFoundError(f"no *_api_dump_info.json in {run_dir} or {run_dir}/rank0 "
                            "(TroubleShooter's .pkl info files are not read: pickle is never loaded)")
