"""Recording a run's fingerprint (config key ``fingerprint``, on by default) into every dumped
step/rank folder: ``fingerprint.json`` next to dump.json.

At ``start()`` of a newly opened step folder: installed packages and Python (once per process),
the environment variables that matter (``rules.py``), the framework's determinism and precision
settings, the command line and hyperparameters, the tsprobe config; and at the first dumped
step (every dumped step with ``fingerprint: every_step``) per parameter its dtype, shape and
statistics (one batched device transfer, as for dumped tensors) plus a CRC-32 when the model's
parameters total at most ``CRC_LIMIT`` bytes. The weights a run starts from are its input; a
later step's are a result of training that the dump itself records, and re-reading them cost
about a fifth of an L0 dumped step's overhead (docs/performance.md): a later step's document
says ``weights_step``, the step whose folder holds them. At the model's first forward in
that step: the same for its inputs (the batch), through a one-shot forward pre-hook (torch: it
removes itself; MindSpore, which iterates its hook dict while calling them: it goes inert and is
removed at the next dumped step or ``close()``). Reading only: the model's numbers are untouched.
With ``async_dump`` the host transfers, CRCs and the write wait for ``stop()`` (``Recorder``);
with task ``structure`` only dtypes and shapes are recorded (no tensor work).
"""
from __future__ import annotations

import math

import os
import platform
import sys
import warnings
import weakref
from dataclasses import asdict
from typing import Any, Callable, Dict, List, Optional

from ..backends._depth import internal
from ..model_hooks import ModelHook, hooks_of
from ..dumpfmt import STAT_FIELDS, rank_number, shard_stats, write_fingerprint
from ..dumpfmt.fingerprint import FINGERPRINT_VERSION
from ..config import EVERY_STEP
from ..record.summary import on_accelerator
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


def _plain(v: Any) -> Any:
    """`v` if a JSON scalar of exactly that type, else its text: a str subclass (torch's
    TorchVersion) would send the document to the slow stdlib encoder (jsonio.write_json_atomic)."""
    return v if type(v) in (bool, int, float, str, type(None)) else str(v)


def _probe(probes: Dict[str, Any]) -> Dict[str, Any]:
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # deprecated switches still answer
        for name, fn in probes.items():
            try:
                v = fn()
            except Exception:
                continue
            out[name] = _plain(v)
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


class TensorSummary:
    """dtype, shape and Max/Min/Mean/Norm (+ crc32) of named tensors, in two halves: the
    constructor asks the device for the statistics (no sync), ``resolve()`` brings them to the
    host in one batched transfer and makes the CRCs. ``values=False`` (task ``structure``): dtype
    and shape only, no tensor work. ``defer`` (``async_dump``): ``resolve()`` is left to the
    caller (at ``stop()``), the CRCs made from copies on the tensors' device taken now."""

    def __init__(self, adapter: Any, named: List[tuple], crc: bool, values: bool = True,
                 defer: bool = False):
        self.adapter, self.defer = adapter, defer
        self.out: Dict[str, Dict[str, Any]] = {}
        self.handles: List[tuple] = []
        self.crcs: List[tuple] = []
        with internal():        # the statistics ops must not be recorded as the model's calls
            for name, t in named:
                self.out[name] = dict(adapter.meta(t))
                self.out[name].pop("type", None)
                if not values:
                    continue
                h = adapter.stats(t)
                if h is not None:
                    self.handles.append((name, h))
                if crc:
                    self.crcs.append((name, adapter.device_copy(t) if defer else t))
        if not defer:
            self.resolve()

    def resolve(self) -> Dict[str, Dict[str, Any]]:
        ad = self.adapter
        with internal():
            if self.handles:
                for (name, _), row in zip(self.handles, ad.stats_to_host([h for _, h in self.handles])):
                    if len(row) > 4:             # a shard's row: its own statistics
                        row = shard_stats(row, math.prod(self.out[name]["shape"]))[0]
                    self.out[name].update(dict(zip(STAT_FIELDS, row)))
            for name, t in self.crcs:
                self.out[name]["crc32"] = ad.crc32(ad.to_host(t) if self.defer else t)
        self.handles, self.crcs = [], []
        return self.out


def summarize_tensors(adapter: Any, named: List[tuple], crc: bool) -> Dict[str, Dict[str, Any]]:
    """dtype, shape and Max/Min/Mean/Norm of each tensor (one batched transfer), + crc32."""
    return TensorSummary(adapter, named, crc).out


def _leaves(value: Any, prefix: str, is_tensor) -> List[tuple]:
    if is_tensor(value):
        return [(prefix, value)]
    if isinstance(value, (list, tuple)):
        return [x for i, v in enumerate(value) for x in _leaves(v, f"{prefix}.{i}", is_tensor)]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _leaves(v, f"{prefix}.{k}", is_tensor)]
    return []


class _FirstBatch(ModelHook):
    """The root model's first forward of a step: its inputs (a client of the model's hook owner;
    torch: at a graph break at the model's edge, so the compiled graph is unchanged)."""

    def __init__(self, fn: Any):
        self.pre_forward = lambda ctx, module, args, kwargs: fn(module, args, kwargs)


class Recorder:
    """One debugger's fingerprints: one per dumped step/rank folder.

    ``async_dump``: nothing is fetched, CRC'd or written inside the step; the statistics are
    asked of the device at once (so they are of the weights as the step began), the CRCs are
    made from device copies (at most ``CRC_LIMIT`` bytes of weights, and of the batch), and the
    file is written at ``stop()``. Task ``structure``: dtype and shape only."""

    def __init__(self, debugger: Any, adapter: Any):
        self.debugger = weakref.ref(debugger)
        self.adapter = adapter
        self.folder: Optional[str] = None
        self.doc: Dict[str, Any] = {}
        self.hyperparameters: Dict[str, Any] = {}
        self.handle: Any = None
        self.pending: Dict[str, TensorSummary] = {}       # async_dump: section -> unresolved summary
        self.unwritten = False        # the document changed since the file was last written
        self._config: Optional[tuple] = None
        self.weights_at: Optional[tuple] = None     # (step, weak refs to the models) of the last read

    def start(self, model: Any) -> None:
        dbg = self.debugger()
        folder = dbg.open_dump_dir if dbg is not None else None
        if folder is None or folder == self.folder:
            return
        self.flush()
        self.remove_hook()
        self.folder = folder
        models = model if isinstance(model, (list, tuple)) else [model]
        static = _static()
        self.doc = {"version": FINGERPRINT_VERSION, "step": dbg.current_step, "rank": self._rank(folder),
                    "python": static["python"], "platform": static["platform"], "packages": static["packages"],
                    "environment": environment(), "framework": framework_settings(), "argv": list(sys.argv),
                    "hyperparameters": {**parse_argv(sys.argv[1:]), **self.hyperparameters},
                    "tsprobe_config": self._config_doc(dbg.config)}
        if dbg.config.fingerprint == EVERY_STEP or not self._weights_read_of(models):
            named = [(f"{i}.{n}" if len(models) > 1 else n, t) for i, m in enumerate(models) if m is not None
                     for n, t in _named_tensors(m)]
            size = sum(_nbytes(t) for _, t in named)
            self._summarize("weights", named, crc=size <= CRC_LIMIT, defer=dbg.config.async_dump)
            self.weights_at = (dbg.current_step, [_weak(m) for m in models])
        else:       # a later step's weights are a result of training, not an input: not re-read
            self.doc["weights_step"] = self.weights_at[0]
            self.unwritten = True
        root = models[0] if models else None
        if root is not None and hasattr(root, "register_forward_pre_hook"):
            self.handle = hooks_of(root).add(_FirstBatch(self._first_batch))

    def _weights_read_of(self, models: List[Any]) -> bool:
        """Were the weights read at an earlier step of these very models (alive, in order)?
        A model built anew may reuse a freed one's id: identity is checked through weak refs."""
        if self.weights_at is None:
            return False
        refs = self.weights_at[1]
        return len(refs) == len(models) and all(r() is m for r, m in zip(refs, models))

    def _config_doc(self, config: Any) -> Dict[str, Any]:
        """``asdict(config)``, once per config object (frozen: a reload makes a new one)."""
        if self._config is None or self._config[0] is not config:
            self._config = (config, asdict(config))
        return self._config[1]

    def _summarize(self, section: str, named: List[tuple], crc: bool, defer: bool) -> None:
        """Fill `section` of the document; written now, or at ``flush()`` when `defer`."""
        dbg = self.debugger()
        values = dbg is None or dbg.config.task != "structure"
        if defer and crc and section == "data":
            crc = sum(_nbytes(t) for _, t in named) <= CRC_LIMIT      # bounded device copies
        summary = TensorSummary(self.adapter, named, crc=crc, values=values, defer=defer)
        self.doc[section] = summary.out
        self.unwritten = True
        if defer:
            self.pending[section] = summary

    @staticmethod
    def _rank(folder: str) -> Optional[int]:
        return rank_number(os.path.basename(folder))

    def _first_batch(self, module: Any, args: tuple, kwargs: dict) -> None:
        dbg = self.debugger()
        if dbg is not None and dbg.open_dump_dir == self.folder and "data" not in self.doc:
            named = _leaves(args, "args", self.adapter.is_tensor) + _leaves(kwargs, "kwargs", self.adapter.is_tensor)
            # on an accelerator the batch's statistics wait for stop(): resolving them now would be a
            # host sync before the forward (async_dump defers everything the same way)
            defer = dbg.in_window and (dbg.config.async_dump or any(on_accelerator(t) for _, t in named))
            self._summarize("data", named, crc=True, defer=defer)
            if not self.pending:
                self.write()        # weights and batch in one write, before the forward runs
        if self.adapter.framework == "pytorch":
            self.remove_hook()      # MindSpore iterates its hook dict while calling: removed at the next start/close
        return None

    def flush(self) -> None:
        """At stop(): resolve what async_dump left pending; write the file if the step's first
        forward has not (a step without a forward, or async_dump)."""
        if self.pending:
            for summary in self.pending.values():
                summary.resolve()
            self.pending.clear()
        if self.unwritten:
            self.write()

    def write(self) -> None:
        self.unwritten = False
        if self.folder and os.path.isdir(self.folder):
            try:
                write_fingerprint(self.folder, self.doc)
            except OSError as e:       # like any dump write: warn, training goes on
                warnings.warn(f"tsprobe: writing {self.folder}'s fingerprint failed ({e})", stacklevel=3)

    def remove_hook(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


def _weak(obj: Any) -> Callable[[], Any]:
    """A weak reference to `obj`, or (an object that takes none, or None) a strong one."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


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


def on_stop(debugger: Any) -> None:
    """The debugger's stop(): what the step's first forward did not write is written now
    (async_dump's deferred half, or a step without a forward)."""
    rec = _RECORDERS.get(debugger)
    if rec is not None:
        rec.flush()


def on_close(debugger: Any) -> None:
    """The debugger's close(): write what is pending, remove a first-batch hook that never fired."""
    rec = _RECORDERS.pop(debugger, None)
    if rec is not None:
        try:
            rec.flush()
        finally:
            rec.remove_hook()


def add_hyperparameters(dbg: Any, values: Any) -> None:
    """``record_hyperparameters`` (hyperparameters.py) for the debugger `dbg`."""
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
            out[name] = _plain(v)
    return out
