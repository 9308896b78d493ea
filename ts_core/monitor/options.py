"""The ``monitor`` section of the config: what monitor mode watches, when it captures, what then.

``"monitor": {}`` turns monitor mode on with the defaults below; ``null``/``false`` (or no
section) leaves it off. Every error is a ``ConfigError`` naming ``monitor.<field>``, the value
and what is allowed; an unknown key gets a did-you-mean hint, as everywhere in the config.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional

from ..errors import ConfigError, unknown_key

SPIKE_MODES = ("min", "max")
ON_TRIGGER = ("continue", "stop", "raise")
MAX_KEEP_STEPS = 1000


@dataclass(frozen=True)
class SpikeConfig:
    """Lightning's ``SpikeDetection`` parameters (``lightning.fabric.utilities.spike``), plus
    ``sigma``: also require ``|value - mean| >= sigma * std`` over the window (null: Lightning's
    rule exactly)."""

    mode: str = "min"               # min: an increase is bad; max: a decrease is bad
    window: int = 10                # running mean over the last `window` accepted values
    warmup: int = 1                 # values offered before spikes are looked for
    atol: Optional[float] = None    # a spike differs from the mean by at least atol ...
    rtol: Optional[float] = 2.0     # ... and by at least rtol * |mean|
    sigma: Optional[float] = None   # ... and by at least sigma standard deviations
    finite_only: bool = True        # a NaN/Inf value is itself a spike


@dataclass(frozen=True)
class MonitorConfig:
    keep_steps: int = 3                         # K: the ring buffer holds the last K steps
    backward: bool = False                      # also module gradient records (backward), see docs
    nan: bool = True                            # trigger on NaN/Inf in loss, outputs or gradients
    loss_spike: Optional[SpikeConfig] = SpikeConfig()
    grad_spike: Optional[SpikeConfig] = None    # on the global gradient norm; off by default
    module_grad_norms: bool = True              # per-module gradient norms in monitor.jsonl
    jsonl: bool = True                          # dump_path/monitor.jsonl, one line per step and rank
    tensorboard: bool = False                   # scalars through torch.utils.tensorboard
    tensorboard_dir: str = ""                   # "" = dump_path/tensorboard
    on_trigger: str = "continue"                # continue | stop (ask the trainer to stop) | raise
    max_captures: int = 1                       # triggers that write dumps (+ the first NaN/Inf); 0: none
    after_steps: int = 0                        # dump the N steps after a capture (top-level task/level)
    max_records_per_step: int = 20000           # memory bound of one buffered step


def _path(section: str, key: str) -> str:
    return f"{section}.{key}"


def _int(name: str, value: Any, lo: int, hi: Optional[int] = None) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= lo and (hi is None or value <= hi)
    if not ok:
        span = f"an int >= {lo}" if hi is None else f"an int from {lo} to {hi}"
        raise ConfigError(name, value, f"use {span}")
    return value


def _tolerance(name: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(name, value, "use null or a finite number >= 0")
    return float(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(name, value, "use true or false")
    return value


def _mapping(name: str, value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(name, value, f"use a mapping of {what}")
    return value


def _check_keys(section: str, body: Mapping[str, Any], cls: type) -> None:
    known = {f.name for f in fields(cls)}
    for key in body:
        if key not in known:
            raise unknown_key(_path(section, str(key)), {_path(section, k) for k in known})


def parse_spike(section: str, value: Any) -> Optional[SpikeConfig]:
    """``null``/``false``: off; ``{}``/``true``: Lightning's defaults; a mapping: those fields."""
    if value is None or value is False:
        return None
    if value is True:
        return SpikeConfig()
    body = _mapping(section, value, ", ".join(f.name for f in fields(SpikeConfig)))
    _check_keys(section, body, SpikeConfig)
    out = {}
    for key, v in body.items():
        name = _path(section, key)
        if key == "mode":
            if v not in SPIKE_MODES:
                raise ConfigError(name, v, f"allowed: {', '.join(SPIKE_MODES)}")
            out[key] = v
        elif key == "window":
            out[key] = _int(name, v, 1, 100000)
        elif key == "warmup":
            out[key] = _int(name, v, 0)
        elif key in ("atol", "rtol", "sigma"):
            out[key] = _tolerance(name, v)
        else:
            out[key] = _flag(name, v)
    return replace(SpikeConfig(), **out)


def parse_monitor(value: Any) -> Optional[MonitorConfig]:
    """The validated ``monitor`` section, or None when monitor mode is off."""
    if value is None or value is False:
        return None
    if value is True:
        return MonitorConfig()
    body = _mapping("monitor", value, "monitor options, e.g. {} for the defaults")
    _check_keys("monitor", body, MonitorConfig)
    out = {}
    for key, v in body.items():
        name = _path("monitor", key)
        if key == "keep_steps":
            out[key] = _int(name, v, 1, MAX_KEEP_STEPS)
        elif key in ("max_captures", "after_steps"):
            out[key] = _int(name, v, 0)
        elif key == "max_records_per_step":
            out[key] = _int(name, v, 1)
        elif key in ("loss_spike", "grad_spike"):
            out[key] = parse_spike(name, v)
        elif key == "on_trigger":
            if v not in ON_TRIGGER:
                raise ConfigError(name, v, f"allowed: {', '.join(ON_TRIGGER)}")
            out[key] = v
        elif key == "tensorboard_dir":
            if not isinstance(v, str):
                raise ConfigError(name, v, "use a folder path string (\"\" = dump_path/tensorboard)")
            out[key] = v
        else:
            out[key] = _flag(name, v)
    return replace(MonitorConfig(), **out)
