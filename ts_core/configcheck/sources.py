"""Where fingerprints come from: a tsprobe dump (``fingerprint.json`` in each step/rank folder),
one fingerprint.json, or an msprobe config_check pack (``config_check_pack.zip``, made by
msprobe's ``ConfigChecker``), read into the same shape."""
from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..dumpfmt import (FINGERPRINT_JSON, TENSOR_DIR, DumpFormatError, parse_step_dir, rank_number, read_json,
                       is_rank_dir)
from .rules import recorded_env


@dataclass(frozen=True)
class Source:
    """One fingerprint: which step and rank folder it describes (``DumpUnit``-like for pairing)."""

    step: Optional[int]
    rank: str
    json_path: Path
    doc: Any = None

    @property
    def label(self) -> str:
        return "/".join(x for x in (f"step{self.step}" if self.step is not None else "", self.rank) if x) or "run"

    def __hash__(self) -> int:
        return hash((self.step, self.rank, str(self.json_path)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Source) and (self.step, self.rank, self.json_path) == \
            (other.step, other.rank, other.json_path)


def load_run(path: "os.PathLike | str") -> List[Source]:
    """Every fingerprint of a run: a dump root/step/rank folder, a fingerprint.json, or an
    msprobe pack (.zip). Raises DumpFormatError naming what is missing."""
    p = Path(path)
    if not p.exists():
        raise DumpFormatError(f"{p}: no such file or directory")
    if p.is_file() and p.suffix == ".zip":
        return _msprobe_pack(p)
    if p.is_file():
        return [_source(p)]
    found = []
    for root, dirs, files in os.walk(p):
        dirs[:] = sorted(d for d in dirs if d != TENSOR_DIR)
        if len(Path(root).relative_to(p).parts) > 3:
            dirs[:] = []
        if FINGERPRINT_JSON in files:
            found.append(_source(Path(root) / FINGERPRINT_JSON))
    if not found:
        raise DumpFormatError(f"{p}: holds no {FINGERPRINT_JSON} (dump with fingerprint: true, the default) and is "
                              f"not an msprobe config_check pack (.zip)")
    return sorted(found, key=lambda s: (s.step if s.step is not None else -1, rank_number(s.rank) or -1, s.rank))


def _source(path: Path) -> Source:
    doc = read_json(path)
    if not isinstance(doc, dict) or "packages" not in doc:
        raise DumpFormatError(f"{path}: not a tsprobe fingerprint (no \"packages\")")
    step, rank = doc.get("step"), ""
    for part in reversed(path.parent.parts[-2:]):
        if not rank and is_rank_dir(part):
            rank = part
        s = parse_step_dir(part)
        if s is not None:
            step = s
    return Source(step, rank, path, doc)


_UNIT = re.compile(r"^(weights|dataset)/step(\d+)/rank(\d+)/(weight|dataset)\.json$")


def _msprobe_pack(path: Path) -> List[Source]:
    """An msprobe config_check pack: env, pip, hyperparameters/*.json for the whole run,
    weights/ and dataset/ per step and rank (Max/Min/Mean/Norm, no checksum)."""
    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise DumpFormatError(f"{path}: not a zip file (an msprobe config_check pack is one)") from None
    with z:
        names = set(z.namelist())

        def load(name: str) -> Any:
            return json.loads(z.read(name).decode("utf-8")) if name in names else None

        common: Dict[str, Any] = {"packages": {}, "environment": {}, "hyperparameters": {}, "framework": {},
                                  "origin": "msprobe config_check pack"}
        if "pip" in names:
            for line in z.read("pip").decode("utf-8").splitlines():
                name, _, version = line.strip().partition("=")
                if name:
                    common["packages"][name.lower()] = version
        env = load("env") or {}
        common["environment"] = {k: str(v) for k, v in sorted(env.items()) if recorded_env(k)}
        for n in ("hyperparameters/hyperparameters_static.json", "hyperparameters/hyperparameters_dynamic.json"):
            common["hyperparameters"].update({str(k): v for k, v in (load(n) or {}).items()})
        units: Dict[tuple, Dict[str, Any]] = {}
        for n in sorted(names):
            m = _UNIT.match(n)
            if not m:
                continue
            doc = units.setdefault((int(m.group(2)), int(m.group(3))), dict(common))
            raw = load(n) or {}
            if m.group(1) == "weights":
                doc["weights"] = {k: _stats(v) for k, v in raw.items()}
            else:
                doc["data"] = {k: _stats(v) for k, v in _flat(raw).items()}
    if not units:
        return [Source(None, "", path, common)]
    return [Source(step, f"rank{rank}", path, {**doc, "step": step, "rank": rank}) for (step, rank), doc in
            sorted(units.items())]


def _stats(v: Any) -> Dict[str, Any]:
    v = v if isinstance(v, dict) else {}
    return {"Max": v.get("max"), "Min": v.get("min"), "Mean": v.get("mean"), "Norm": v.get("norm")}


def _flat(d: Any, prefix: str = "") -> Dict[str, Any]:
    """msprobe dataset.json ({"args": {"0": {max, ...}}, "kwargs": {...}}) -> {"args.0": {...}}."""
    out: Dict[str, Any] = {}
    if isinstance(d, dict) and {"max", "min", "mean", "norm"} <= set(d):
        return {prefix: d}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out
