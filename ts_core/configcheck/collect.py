"""Recording a run's fingerprint (config key ``fingerprint``, on by default) into every dumped
step/rank folder: ``fingerprint.json`` next to dump.json.

At ``start()`` of a newly opened step folder: installed packages and Python (once per process),
the environment variables that matter (``rules.py``), the framework's determinism and precision
settings, the command line and hyperparameters, the tsprobe config, and per parameter its
dtype, shape and statistics (one batched device transfer, as for dumped tensors) plus a CRC-32
when the model's parameters total at most ``CRC_LIMIT`` bytes. At the model's first forward in
that step: the same for its inputs (the batch), through a one-shot forward pre-hook (torch: it
removes itself; MindSpore, which iterates its hook dict while calling them: it goes inert and is
removed at the next dumped step or ``close()``). Reading only: the model's numbers are untouched.
"""
from __future__ import annotations

import os
import platform
import sys
import warnings
import weakref
from dataclasses import asdict
from typing import Any, Dict, List, Optional

from ..backends._depth import internal
from ..dumpfmt import STAT_FIELDS, rank_number, write_fingerprint
from ..dumpfmt.fingerprint import FINGERPRINT_VERSION
from .rules import parse_argv, recorded_env

CRC_LIMIT = 64 * 2**20          # parameters up to this many bytes also get a CRC-32 (a host copy)
_STATIC: Dict[str, Any] = {}
_RECORDERS: "weakref.WeakKeyDictionary[Any, Recorder]" = weakref.WeakKeyDictionary()


def _static() -> Dict[str, Any]:
    """Packages, Python and platform: the same for the whole process, read once (~50 ms)."""
    if not _STATIC:
        from importlib import metadata

        pkgs = {}
        for dist in metadata.distributions():
            name = dist.metadata.get("Name") if dist.metadata else None
            if name:
                pkgs[name.lower()] = dist.version
        _STATIC.update(python=platform.python_version(), packages=dict(sorted(pkgs.items())),
                       platform={"system": platform.system(), "machine": platform.machine(),
                                 "cpu_count": os.cpu_count()})
    return _STATIC


def environment() -> Dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if recorded_env(k)}


def framework_settings() -> Dict[str, Any]:
    """Determinism and precision switches of the frameworks this process has imported."""
    out: Dict[str, Any] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        probes = {      # each probe is a call: a torch-like module (mindtorch) may lack any of them
            "version": lambda: torch.__version__, "cuda": lambda: torch.version.cuda,
            "deterministic_algorithms": lambda: torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": lambda: torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn_deterministic": lambda: torch.backends.cudnn.deterministic,
            "cudnn_benchmark": lambda: torch.backends.cudnn.benchmark,
            "allow_tf32_matmul": lambda: torch.backends.cuda.matmul.allow_tf32,
            "allow_tf32_cudnn": lambda: torch.backends.cudnn.allow_tf32,
            "fp16_reduced_precision_reduction": lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            "bf16_reduced_precision_reduction": lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "float32_matmul_precision": lambda: torch.get_float32_matmul_precision(),
            "default_dtype": lambda: str(torch.get_default_dtype()),
            "num_threads": lambda: torch.get_num_threads(), "initial_seed": lambda: torch.initial_seed(),
        }
        out["torch"] = _probe(probes)
    ms = sys.modules.get("mindspore")
    if ms is not None:
        out["mindspore"] = _probe({
            "version": lambda: ms.__version__, "mode": lambda: ms.get_context("mode"),
            "deterministic": lambda: ms.get_context("deterministic"),
            "device_target": lambda: ms.get_context("device_target"), "seed": lambda: ms.get_seed(),
        })
    return out


def _probe(probes: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # deprecated switches still answer
        for name, fn in probes.items():
            try:
                v = fn()
            except Exception:
                continue
            out[name] = v if isinstance(v, (bool, int, float, str, type(None))) else str(v)
    return out


def _named_tensors(model: Any) -> List[tuple]:
    """(name, tensor) of a model's parameters (and torch float buffers: running statistics)."""
    if hasattr(model, "named_parameters") and hasattr(model, "named_buffers"):       # torch
        out = list(model.named_parameters())
        out += [(n, b) for n, b in model.named_buffers() if getattr(b, "is_floating_point", lambda: False)()]
        return out
    if hasattr(model, "parameters_and_names"):                                        # MindSpore
        return list(model.parameters_and_names())
    return []


def summarize_tensors(adapter: Any, named: List[tuple], crc: bool) -> Dict[str, Dict[str, Any]]:
    """dtype, shape and Max/Min/Mean/Norm of each tensor (one batched transfer), + crc32."""
    with internal():            # the statistics ops must not be recorded as the model's calls
        out, handles = {}, []
        for name, t in named:
            out[name] = dict(adapter.meta(t))
            out[name].pop("type", None)
            h = adapter.stats(t)
            if h is not None:
                handles.append((name, h))
        for (name, _), row in zip(handles, adapter.stats_to_host([h for _, h in handles]) if handles else []):
            out[name].update(dict(zip(STAT_FIELDS, row)))
        if crc:
            for name, t in named:
                out[name]["crc32"] = adapter.crc32(t)
    return out


def _leaves(value: Any, prefix: str, is_tensor) -> List[tuple]:
    if is_tensor(value):
        return [(prefix, value)]
    if isinstance(value, (list, tuple)):
        return [x for i, v in enumerate(value) for x in _leaves(v, f"{prefix}.{i}", is_tensor)]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _leaves(v, f"{prefix}.{k}", is_tensor)]
    return []


class Recorder:
    """One debugger's fingerprints: one per dumped step/rank folder."""

    def __init__(self, debugger: Any, adapter: Any):
        self.debugger = weakref.ref(debugger)
        self.adapter = adapter
        self.folder: Optional[str] = None
        self.doc: Dict[str, Any] = {}
        self.hyperparameters: Dict[str, Any] = {}
        self.handle: Any = None

    def start(self, model: Any) -> None:
        dbg = self.debugger()
        folder = dbg.open_dump_dir if dbg is not None else None
        if folder is None or folder == self.folder:
            return
        self.remove_hook()
        self.folder = folder
        models = model if isinstance(model, (list, tuple)) else [model]
        named = [(f"{i}.{n}" if len(models) > 1 else n, t) for i, m in enumerate(models) if m is not None
                 for n, t in _named_tensors(m)]
        size = sum(_nbytes(t) for _, t in named)
        static = _static()
        self.doc = {"version": FINGERPRINT_VERSION, "step": dbg.current_step, "rank": self._rank(folder),
                    "python": static["python"], "platform": static["platform"], "packages": static["packages"],
                    "environment": environment(), "framework": framework_settings(), "argv": list(sys.argv),
                    "hyperparameters": {**parse_argv(sys.argv[1:]), **self.hyperparameters},
                    "tsprobe_config": asdict(dbg.config),
                    "weights": summarize_tensors(self.adapter, named, crc=size <= CRC_LIMIT)}
        self.write()
        root = models[0] if models else None
        if root is not None and hasattr(root, "register_forward_pre_hook"):
            try:
                self.handle = root.register_forward_pre_hook(self._first_batch, with_kwargs=True)
            except TypeError:        # a framework without with_kwargs
                self.handle = root.register_forward_pre_hook(lambda m, a: self._first_batch(m, a, {}))

    @staticmethod
    def _rank(folder: str) -> Optional[int]:
        return rank_number(os.path.basename(folder))

    def _first_batch(self, module: Any, args: tuple, kwargs: dict) -> None:
        dbg = self.debugger()
        if dbg is not None and dbg.open_dump_dir == self.folder and "data" not in self.doc:
            named = _leaves(args, "args", self.adapter.is_tensor) + _leaves(kwargs, "kwargs", self.adapter.is_tensor)
            self.doc["data"] = summarize_tensors(self.adapter, named, crc=True)
            self.write()
        if getattr(self.adapter, "framework", "") == "pytorch":
            self.remove_hook()      # MindSpore iterates its hook dict while calling: removed at the next start/close
        return None

    def write(self) -> None:
        if self.folder and os.path.isdir(self.folder):
            try:
                write_fingerprint(self.folder, self.doc)
            except OSError as e:       # like any dump write: warn, training goes on
                warnings.warn(f"tsprobe: writing {self.folder}'s fingerprint failed ({e})", stacklevel=3)

    def remove_hook(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


def _nbytes(t: Any) -> int:
    n = getattr(t, "nbytes", None)
    if isinstance(n, int):
        return n
    try:
        return int(t.numel()) * int(t.element_size())
    except Exception:
        return 0


def on_start(debugger: Any, model: Any, adapter: Any) -> None:
    """The debugger's start(): record the fingerprint of a newly opened step folder."""
    rec = _RECORDERS.get(debugger)
    if rec is None:
        rec = _RECORDERS[debugger] = Recorder(debugger, adapter)
    rec.adapter = adapter
    rec.start(model)


def on_close(debugger: Any) -> None:
    """The debugger's close(): remove a first-batch hook that never fired."""
    rec = _RECORDERS.pop(debugger, None)
    if rec is not None:
        rec.remove_hook()


def record_hyperparameters(values: Any, debugger: Any = None) -> None:
    """Add hyperparameters to the fingerprint of the current (or given) debugger: a dict, an
    ``argparse.Namespace``, a dataclass, any object with ``__dict__``, or the path of a JSON or
    YAML file. Written into the open step folder's fingerprint and every later one."""
    from ..debugger import PrecisionDebugger

    dbg = debugger or PrecisionDebugger.current()
    if dbg is None:
        raise RuntimeError("record_hyperparameters: no PrecisionDebugger is open; create one first")
    flat = _flatten(_as_dict(values))
    rec = _RECORDERS.get(dbg)
    if rec is None:
        rec = _RECORDERS[dbg] = Recorder(dbg, None)
    rec.hyperparameters.update(flat)
    if rec.doc:
        rec.doc.setdefault("hyperparameters", {}).update(flat)
        rec.write()


def _as_dict(values: Any) -> Dict[str, Any]:
    if isinstance(values, (str, os.PathLike)):
        path = os.fspath(values)
        with open(path, encoding="utf-8") as f:
            if path.endswith((".yaml", ".yml")):
                import yaml

                data = yaml.safe_load(f)
            else:
                import json

                data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError(f"record_hyperparameters: {path} does not hold a mapping")
        return data
    if isinstance(values, dict):
        return values
    import dataclasses

    if dataclasses.is_dataclass(values) and not isinstance(values, type):
        return dataclasses.asdict(values)
    if hasattr(values, "__dict__"):
        return {k: v for k, v in vars(values).items() if not k.startswith("_")}
    raise TypeError(f"record_hyperparameters: got {type(values).__name__}; give a dict, a Namespace, a "
                    f"dataclass or a JSON/YAML file path")


def _flatten(d: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "."))
        else:
            out[name] = v if isinstance(v, (bool, int, float, str, type(None))) else str(v)
    return out
