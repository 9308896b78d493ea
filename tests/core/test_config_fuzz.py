"""Fuzz: 1,500 random and mutated configs; each is accepted or rejected with a ConfigError that
names a field -- never any other exception."""
import json
import random

from ts_core import ConfigError, build_config
from ts_core.config import DebuggerConfig

BASE = {"task": "statistics", "dump_path": "./d", "rank": [], "step": [0, "2-3"], "level": "mix",
        "seed": 1, "is_deterministic": False, "async_dump": False,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
        "tensor": {"scope": [], "list": [], "data_mode": ["all"], "file_format": "npy"}}
KEYS = list(BASE) + ["statistics.scope", "statistics.list", "statistics.data_mode", "statistics.summary_mode",
                     "bogus", "framework", "stack", "on_write_error"]


def _random_value(rng, depth=0):
    choices = [None, True, False, 0, -1, 3, 2**40, 1.5, float("nan"), "", "L0", "tensor", "md5", "1-3",
               "3-1", "forward", "x" * 50, "../", "Module.fc"]
    kind = rng.random()
    if depth < 2 and kind < 0.2:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 2 and kind < 0.3:
        return {rng.choice(KEYS + ["list", "scope"]): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return rng.choice(choices)


def _mutate(rng, cfg):
    cfg = json.loads(json.dumps(cfg))
    for _ in range(rng.randint(1, 4)):
        key = rng.choice(KEYS)
        target = cfg
        if "." in key:
            section, key = key.split(".")
            target = cfg.setdefault(section, {}) if isinstance(cfg.get(section, {}), dict) else cfg
        action = rng.random()
        if action < 0.2 and key in target:
            del target[key]
        else:
            target[key] = _random_value(rng)
    return cfg


def test_fuzzed_configs_raise_only_config_error(tmp_path):
    rng = random.Random(20261122)
    outcomes = {"accepted": 0, "rejected": 0}
    fields = {f for f in DebuggerConfig.__dataclass_fields__} | {"config_path", "statistics", "tensor"}
    for i in range(1500):
        cfg = _mutate(rng, BASE) if i % 3 else _random_value(rng)
        path = tmp_path / f"c{i % 7}.json"
        path.write_text(json.dumps(cfg))
        try:
            got = build_config(str(path))
        except ConfigError as err:
            outcomes["rejected"] += 1
            base_field = err.field.split(".")[-1]
            assert err.field in str(err)
            assert base_field in fields or err.field.split(".")[0] in fields or "unknown key" in str(err), err
            assert str(path) in str(err)              # a value read from a file names the file
        else:
            outcomes["accepted"] += 1
            assert isinstance(got, DebuggerConfig)
            assert got.task in ("statistics", "tensor") and got.level in ("L0", "L1", "mix", "debug")
    assert outcomes["accepted"] > 50 and outcomes["rejected"] > 500, outcomes


def test_truncated_config_files(tmp_path):
    text = json.dumps(BASE)
    for cut in range(0, len(text), 7):
        path = tmp_path / "t.json"
        path.write_text(text[:cut])
        try:
            build_config(str(path))
        except ConfigError as err:
            assert err.field == "config_path"
