"""One validated config object from msprobe's config.json schema (JSON, YAML or kwargs).

Every error is a single ``ConfigError`` naming the field, the bad value and what is allowed,
so a typo in a 40-line config is found in one run.
"""
from __future__ import annotations

import difflib
import functools
import json
import os
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, List, Mapping, Optional, Union

from .dumpfmt.tensor_pack import TENSOR_FORMATS   # msprobe's one .npy per tensor, or one tar per step and rank
from .errors import ConfigError, unknown_key, warn_user
from .monitor.options import MonitorConfig, parse_monitor

TASKS = ("statistics", "tensor", "structure")
LEVELS = ("L0", "L1", "mix", "debug")
EVERY_STEP = "every_step"          # fingerprint: the weights at every dumped step
DATA_MODES = ("all", "forward", "backward", "input", "output")
SUMMARY_MODES = ("statistics", "md5", "xor")
COMPILE_MODES = ("", "boundaries", "shadow", "modules")
STRUCTURE_LEVELS = ("L0", "mix")     # task "structure" records the hierarchy: modules must be hooked

# msprobe keys we accept for drop-in compatibility but do not act on.
_TOLERATED_TOP = {"enable_dataloader", "precision", "acl_config", "is_dump_compile",
                  "extra_info", "overflow_check", "free_benchmark", "run_ut", "grad_probe",
                  "exception_dump", "acc_check", "nan_check", "diff_check", "risk_level"}
_TOP = {"task", "dump_path", "rank", "step", "level", "seed", "is_deterministic", "async_dump",
        "statistics", "tensor", "structure", "stack", "on_write_error", "framework", "dump_eval",
        "dump_enable", "fingerprint", "monitor", "compile_mode", "tensor_format"}
_SECTION = {"scope", "list", "data_mode", "summary_mode", "file_format", "online_run_ut",
            "nfs_path", "host", "port", "tls_path", "bench_path", "online_run_ut_recompute",
            "tensor_list", "diff_nums", "tensor_format"}
_SECTION_OURS = {"scope", "list", "data_mode", "summary_mode", "file_format", "tensor_list",
                 "bench_path", "diff_nums", "tensor_format"}
# section keys that mean something in one task's section only: key -> (section, why)
_SECTION_ONLY = {
    "tensor_list": ("statistics", "task 'tensor' saves every tensor already; tensor_list belongs to the "
                                  "statistics section"),
    "bench_path": ("tensor", "the diff-only dump saves tensors: bench_path belongs to the tensor section"),
}


@dataclass(frozen=True)
class DebuggerConfig:
    """What to collect, where, and when. Immutable once validated."""

    task: str = "statistics"
    dump_path: str = "./dump_path"
    rank: List[int] = field(default_factory=list)      # empty: every rank
    step: List[int] = field(default_factory=list)      # empty: every step
    level: str = "L1"
    seed: int = 1234
    is_deterministic: bool = False
    async_dump: bool = False
    scope: List[str] = field(default_factory=list)     # [] or [first_key, last_key]
    list: List[str] = field(default_factory=list)      # exact keys or substrings
    data_mode: List[str] = field(default_factory=lambda: ["all"])
    summary_mode: str = "statistics"
    stack: bool = True                                 # record stack.json
    on_write_error: str = "warn"                       # "warn" keeps training alive, "raise" stops it
    framework: str = ""                                # "" = from the model passed to start()
    dump_eval: bool = False                            # integrations: also record evaluation loops
    dump_enable: Optional[bool] = None                 # None: static; a bool: hot switch (hot_reload.py)
    tensor_list: List[str] = field(default_factory=lambda: [])   # statistics task: also save these calls' tensors
    bench_path: str = ""                               # tensor task: diff-only dump against this md5 dump
    diff_nums: int = 1                                 # with bench_path: records saved at most (-1: all)
    tensor_format: str = "files"                       # "packed": one tar per step and rank (docs/dump-format.md)
    # fingerprint.json per step folder (config-check): True = the weights at the first dumped
    # step only (what the run starts from), "every_step" = at every dumped step, False = off
    fingerprint: Union[bool, str] = True
    monitor: Optional[MonitorConfig] = None            # monitor mode (ts_core/monitor); None: off
    # torch.compile: boundaries / shadow / modules (docs/distributed-and-compiled.md); "" means
    # the TSPROBE_COMPILE environment variable, else boundaries
    compile_mode: str = ""

    def wants(self, direction: str, part: str) -> bool:
        """Does data_mode keep `part` ('input'/'output') of a `direction` ('forward'/'backward') record?"""
        modes = self.data_mode
        if "all" in modes:
            return True
        dir_ok = "forward" not in modes and "backward" not in modes or direction in modes
        part_ok = "input" not in modes and "output" not in modes or part in modes
        return dir_ok and part_ok

    def collects_step(self, step: int) -> bool:
        """Is `step` dumped regardless of anomalies? An empty `step` means every step, or none in
        monitor mode (the monitor then decides which steps reach disk)."""
        return (not self.step and self.monitor is None) or step in self._steps

    def collects_rank(self, rank: Optional[int]) -> bool:
        return not self.rank or (rank or 0) in self.rank

    @functools.cached_property
    def _steps(self) -> frozenset:
        """``step`` as a set, made once (the config is frozen; a "0-100000" range is 100k ints)."""
        return frozenset(self.step)

    @functools.cached_property
    def last_step(self) -> Optional[int]:
        return max(self.step) if self.step else None


def parse_int_list(name: str, value: Any) -> List[int]:
    """Accept [1, 3], "3", "4-6", [1, "4-6"], 2 -> sorted unique ints >= 0."""
    allowed = "use a list of non-negative ints and 'a-b' ranges, e.g. [0, 2, \"4-6\"]"
    items = value if isinstance(value, (list, tuple)) else [value]
    out: set[int] = set()
    for item in items:
        if isinstance(item, bool):
            raise ConfigError(name, value, allowed)
        if isinstance(item, int):
            lo = hi = item
        elif isinstance(item, str):
            text = item.strip()
            try:
                if "-" in text.lstrip("-"):
                    a, b = text.split("-", 1)
                    lo, hi = int(a), int(b)
                else:
                    lo = hi = int(text)
            except ValueError:
                raise ConfigError(name, value, allowed) from None
        else:
            raise ConfigError(name, value, allowed)
        if lo < 0 or hi < lo:
            raise ConfigError(name, value, allowed + " (ranges ascend, no negatives)")
        if hi - lo > 1_000_000:
            raise ConfigError(name, value, "a range may span at most 1,000,000 values")
        out.update(range(lo, hi + 1))
    return sorted(out)


def _str_list(name: str, value: Any) -> List[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(name, value, "use a list of strings")
    return list(value)


# msprobe tasks that are no dump task here: where their job is done instead
MSPROBE_ONLY_TASKS = {
    "overflow_check": "tsprobe finds overflows with monitor mode: add \"monitor\": {} to watch every step and dump "
                      "the steps around the first NaN/Inf (docs/monitor.md); `tsprobe summary DUMP` names the "
                      "first NaN/Inf of any dump",
    "acc_check": "API accuracy checking is `tsprobe acc-check DUMP` on a dump of task \"tensor\" "
                 "(docs/acc-check.md)",
    "run_ut": "API accuracy checking is `tsprobe acc-check DUMP` on a dump of task \"tensor\" (docs/acc-check.md)",
    "free_benchmark": "there is no free benchmark: re-run suspect APIs on the dumped inputs with "
                      "`tsprobe acc-check DUMP` (docs/acc-check.md), or watch every step with monitor mode "
                      "(docs/monitor.md)",
    "grad_probe": "gradient statistics of every step come from monitor mode (\"monitor\": {}, docs/monitor.md); "
                  "a dump at level L0/mix also records each parameter's gradient (parameters_grad)",
}


def _choice(name: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(name, value, _hint(name, value, allowed) + f"allowed: {', '.join(allowed)}")
    return value


def _hint(name: str, value: Any, allowed: tuple) -> str:
    """"did you mean 'L1'? " for a near miss (another case, a letter more or less), msprobe's
    pointer for a task it has and we do not, else ""."""
    if not isinstance(value, str):
        return ""
    if name == "task" and value in MSPROBE_ONLY_TASKS:
        return f"{MSPROBE_ONLY_TASKS[value]}. "
    if name == "level" and value == "L2":
        return ("msprobe's L2 dumps kernels inside compiled graphs (Ascend's adump); tsprobe records what Python "
                "calls: L1 for API calls, mix for modules and API calls. ")
    same_case = [a for a in allowed if a.lower() == value.lower()]
    near = same_case or difflib.get_close_matches(value, allowed, n=1, cutoff=0.6) or \
        [a for a in allowed if a.lower() == value.lower().rstrip("s")]
    return f"did you mean '{near[0]}'? " if near else ""


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(name, value, "use true or false")
    return value


# The ready configs shipped in the package (ts_core/configs/*.json and their *.yaml twins).
READY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def ready_configs() -> List[str]:
    """Names of the ready configs (``statistics_mix``, ...), usable as ``config_path``."""
    return sorted(n[:-5] for n in os.listdir(READY_DIR) if n.endswith(".json"))


def ready_config_description(name: str) -> str:
    """What a ready config records, in one line: the first sentence of its YAML twin's header
    comment (``# YAML twin of md5.json: API calls with a CRC-32 of each tensor, ...``)."""
    try:
        with open(os.path.join(READY_DIR, name + ".yaml"), encoding="utf-8") as f:
            head = []
            for line in f:
                if not line.startswith("#"):
                    break
                head.append(line.lstrip("#").strip())
    except OSError:
        return ""
    text = " ".join(head).split(": ", 1)[-1]
    end = re.search(r"\.(\s|$)", text)
    return text[:end.start()] if end else text


def resolve_config_path(path: str) -> str:
    """`path` itself when it is a file; a ready config's file when `path` is its name
    (``"statistics_mix"``, ``"statistics_mix.yaml"``); else `path` (reading it then fails clearly).
    A file of the user's wins over a ready config of the same name."""
    if os.path.exists(path) or os.path.dirname(path):
        return path
    stem, ext = os.path.splitext(path)
    if ext not in (".json", ".yaml"):
        stem, ext = path, ".json"
    ready = os.path.join(READY_DIR, stem + ext)
    return ready if os.path.isfile(ready) else path


def _read_text(path: str) -> str:
    """The config file's text; every way it cannot be read is a ConfigError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        problem = f"the file does not exist (ready configs go by name: {', '.join(ready_configs())})"
    except IsADirectoryError:
        problem = "this is a folder; give the path of the JSON or YAML file"
    except PermissionError:
        problem = "the file cannot be read: permission denied"
    except UnicodeDecodeError as exc:
        problem = (f"the file is not UTF-8 text (byte {exc.start}: {exc.reason}); "
                   "save the JSON or YAML config as UTF-8")
    except OSError as exc:
        problem = f"the file cannot be read ({exc.strerror or exc})"
    raise ConfigError("config_path", path, problem)


def _read_file(path: str) -> dict:
    text = _read_text(path)
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # parse errors of either format
        raise ConfigError("config_path", path, f"the file is not valid JSON/YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("config_path", path, "the file must hold a mapping at top level")
    return data


def _flatten(raw: Mapping[str, Any]) -> dict:
    """Top-level keys plus the active task's section -> one flat dict; unknown keys rejected."""
    flat: dict = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise ConfigError(str(key), value, "keys must be strings")
        if key in _TOLERATED_TOP:
            continue
        if key not in _TOP:
            raise unknown_key(key, _TOP | _TOLERATED_TOP)
        if key in TASKS:
            continue
        flat[key] = value
    task = flat.get("task", "statistics")
    for section in TASKS:
        body = raw.get(section)
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigError(section, body, "use a mapping of scope/list/data_mode/...")
        for key, value in body.items():
            if key not in _SECTION:
                raise unknown_key(f"{section}.{key}", {f"{section}.{k}" for k in _SECTION_OURS})
            if key not in _SECTION_OURS or section != task:
                continue
            only = _SECTION_ONLY.get(key)
            if only is not None and only[0] != section:
                raise ConfigError(f"{section}.{key}", value, only[1])
            if section == "structure" and key == "summary_mode":
                raise ConfigError("structure.summary_mode", value,
                                  "task 'structure' records no values; drop summary_mode")
            flat[key] = value
    return flat


def build_config(config_path: Optional[str] = None, **overrides: Any) -> DebuggerConfig:
    """Load `config_path` (JSON or YAML, msprobe schema), apply non-None keyword overrides, validate."""
    path = resolve_config_path(os.fspath(config_path)) if config_path else None
    raw = _read_file(path) if path else {}
    try:
        flat = _flatten(raw)
    except ConfigError as e:
        raise (e.in_file(path) if path else e) from None
    names = {f.name for f in fields(DebuggerConfig)}
    given = set()
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in names:
            raise unknown_key(key, names)
        flat[key] = value
        given.add(key)
    try:
        return validate(flat)
    except ConfigError as e:     # a value from the file (not a keyword argument): name the file
        if path and e.field.split(".")[-1] not in given and e.field.split(".")[0] not in given:
            raise e.in_file(path) from None
        raise


def validate(flat: Mapping[str, Any]) -> DebuggerConfig:
    cfg = DebuggerConfig()
    v = dict(flat)
    if "task" in v:
        _choice("task", v["task"], TASKS)
    if "level" in v:
        _choice("level", v["level"], LEVELS)
    if "dump_path" in v and (not isinstance(v["dump_path"], str) or not v["dump_path"]):
        raise ConfigError("dump_path", v["dump_path"], "use a non-empty folder path string")
    for name in ("rank", "step"):
        if name in v:
            v[name] = parse_int_list(name, v[name])
    if "seed" in v and (isinstance(v["seed"], bool) or not isinstance(v["seed"], int)
                        or not 0 <= v["seed"] < 2**32):
        raise ConfigError("seed", v["seed"], "use an int in [0, 2**32)")
    for name in ("is_deterministic", "async_dump", "stack", "dump_eval"):
        if name in v:
            _bool(name, v[name])
    if "fingerprint" in v and v["fingerprint"] != EVERY_STEP and not isinstance(v["fingerprint"], bool):
        raise ConfigError("fingerprint", v["fingerprint"], f"use true, false or \"{EVERY_STEP}\" (the weights "
                          "at every dumped step, not only the first)")
    if "framework" in v:
        _choice("framework", v["framework"], ("", "pytorch", "mindspore", "mindtorch"))
    if "on_write_error" in v:
        _choice("on_write_error", v["on_write_error"], ("warn", "raise"))
    if "compile_mode" in v:
        _choice("compile_mode", v["compile_mode"], COMPILE_MODES)
    if "scope" in v:
        v["scope"] = _str_list("scope", v["scope"])
        if len(v["scope"]) not in (0, 2):
            raise ConfigError("scope", v["scope"], "use [] or exactly two keys [first, last]")
    if "list" in v:
        v["list"] = _str_list("list", v["list"])
        if any(not s.strip() for s in v["list"]):
            raise ConfigError("list", v["list"], "entries must be non-empty")
    if "data_mode" in v:
        modes = _str_list("data_mode", v["data_mode"])
        for m in modes:
            _choice("data_mode", m, DATA_MODES)
        if not modes:
            raise ConfigError("data_mode", modes, f"use a non-empty list of {', '.join(DATA_MODES)}")
        if "all" in modes and len(modes) > 1:
            raise ConfigError("data_mode", modes, "'all' cannot be combined with other modes")
        v["data_mode"] = modes
    if "summary_mode" in v:
        _choice("summary_mode", v["summary_mode"], SUMMARY_MODES)
    if "tensor_format" in v:
        _choice("tensor_format", v["tensor_format"], TENSOR_FORMATS)
    if "file_format" in v:
        _choice("file_format", v.pop("file_format"), ("npy",))
    if "dump_enable" in v and v["dump_enable"] is not None:
        _bool("dump_enable", v["dump_enable"])
    if "tensor_list" in v:
        v["tensor_list"] = _str_list("tensor_list", v["tensor_list"])
        if any(not s.strip() for s in v["tensor_list"]):
            raise ConfigError("tensor_list", v["tensor_list"], "entries must be non-empty")
    if "diff_nums" in v:
        n = v["diff_nums"]
        if isinstance(n, bool) or not isinstance(n, int) or not (n == -1 or n >= 1):
            raise ConfigError("diff_nums", n, "use a positive int (records whose tensors are saved) "
                                              "or -1 (no limit)")
    if "bench_path" in v:
        _check_bench_path(v)
    if "monitor" in v:
        v["monitor"] = parse_monitor(v["monitor"])
    cfg = replace(cfg, **v)
    return _check_combinations(cfg, explicit_summary="summary_mode" in v)


def _check_bench_path(v: dict) -> None:
    path = v["bench_path"]
    if not isinstance(path, str):
        raise ConfigError("bench_path", path, "use the dump_path of an earlier run with summary_mode md5")


def check_paths(cfg: DebuggerConfig) -> None:
    """What must exist when a debugger starts with `cfg` (not when a config file is only read):
    a dump_path the dump can be written under (a failure later only warns, and the run would go
    on for nothing), the bench of a diff-only dump."""
    why = _unwritable(cfg.dump_path)
    if why:
        raise ConfigError("dump_path", cfg.dump_path, f"the dump cannot be written there: {why}; give a folder "
                                                      "you can write (it is created if missing)")
    if cfg.bench_path and not os.path.isdir(cfg.bench_path):
        raise ConfigError("bench_path", cfg.bench_path, "no such folder; give the dump_path of an earlier run "
                                                        "made with summary_mode md5 (it holds step*/rank*/dump.json)")


def _unwritable(path: str) -> Optional[str]:
    """Why no dump can be written under `path`, or None: it is a file, or the folder (or its
    nearest existing parent, where it would be created) is a file or not writable."""
    p = os.path.abspath(path)
    if os.path.exists(p):
        if not os.path.isdir(p):
            return "it is a file, not a folder"
        return None if os.access(p, os.W_OK | os.X_OK) else "permission denied (the folder is not writable)"
    parent = os.path.dirname(p)
    while not os.path.exists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent} is a file, so no folder can be made below it"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"permission denied (it would be created in {parent}, which is not writable)"
    return None


def _check_combinations(cfg: DebuggerConfig, explicit_summary: bool) -> DebuggerConfig:
    """Rules between fields, checked once every field is valid on its own."""
    if cfg.scope and cfg.list:
        raise ConfigError("scope", cfg.scope, "set either scope or list, not both")
    if cfg.task == "structure" and cfg.summary_mode != "statistics":
        raise ConfigError("summary_mode", cfg.summary_mode, "task 'structure' records no values; drop summary_mode")
    if cfg.tensor_format != "files" and cfg.task == "structure":
        raise ConfigError("tensor_format", cfg.tensor_format, "task 'structure' saves no tensors; drop tensor_format")
    if cfg.tensor_list and cfg.task != "statistics":
        raise ConfigError("tensor_list", cfg.tensor_list,
                          f"tensor_list is a statistics-task option (task is '{cfg.task}')")
    if cfg.bench_path:
        if cfg.task != "tensor":
            raise ConfigError("bench_path", cfg.bench_path,
                              f"the diff-only dump is a tensor-task option (task is '{cfg.task}')")
        if cfg.async_dump:
            raise ConfigError("async_dump", True, "bench_path compares each checksum while the step "
                                                  "runs; set async_dump false")
        if cfg.summary_mode == "statistics":
            if explicit_summary:
                raise ConfigError("summary_mode", "statistics", "bench_path compares checksums: use "
                                  "summary_mode md5 (as the bench dump was made) or leave it out")
            cfg = replace(cfg, summary_mode="md5")
    if cfg.task == "structure" and cfg.level not in STRUCTURE_LEVELS:
        warn_user(f"tsprobe: task 'structure' records the module hierarchy; level '{cfg.level}' "
                  "is raised to 'mix' (as msprobe does)")
        cfg = replace(cfg, level="mix")
    return cfg
