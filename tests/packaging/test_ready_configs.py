"""Ready configs ship in the package and go by name; msprobe-only values and typos get a pointer."""
import json
import os
import subprocess
import sys

import pytest
import yaml

from ts_core import ConfigError, PrecisionDebugger, build_config
from ts_core.config import READY_DIR, ready_configs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_ready_configs_are_package_files_and_the_checkout_folder_is_the_same():
    assert READY_DIR.startswith(os.path.join(ROOT, "ts_core"))
    assert {"statistics_mix", "statistics_L1", "md5", "structure", "tensor_list"} <= set(ready_configs())
    assert os.path.samefile(os.path.join(ROOT, "configs"), READY_DIR)


@pytest.mark.parametrize("name", ready_configs())
def test_each_ready_config_loads_by_name_as_by_path(name):
    by_path = build_config(os.path.join(READY_DIR, name + ".json"))
    assert build_config(name) == by_path
    assert build_config(name + ".json") == by_path
    assert build_config(name + ".yaml") == build_config(os.path.join(READY_DIR, name + ".yaml"))


def test_the_debugger_takes_a_ready_config_by_name(tmp_path):
    dbg = PrecisionDebugger(config_path="statistics_mix", dump_path=str(tmp_path / "d"))
    try:
        raw = json.load(open(os.path.join(READY_DIR, "statistics_mix.json")))
        assert (dbg.config.task, dbg.config.level) == (raw["task"], raw["level"])
    finally:
        dbg.close()


def test_a_users_file_wins_over_a_ready_config_of_the_same_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "statistics_mix.json").write_text(json.dumps({"task": "tensor", "level": "L0"}))
    assert build_config("statistics_mix.json").task == "tensor"
    assert build_config("statistics_mix.yaml").task == "statistics"          # no such user file: the ready one
    with pytest.raises(ConfigError, match="does not exist .*ready configs go by name: .*statistics_mix"):
        build_config("./nothing_here.json")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ts_core.cli", *args], cwd=ROOT, capture_output=True, text=True)


def test_config_init_prints_a_ready_config_to_start_from(tmp_path):
    out = _cli("config", "init", "statistics_mix")
    assert out.returncode == 0
    path = tmp_path / "config.json"
    path.write_text(out.stdout)
    assert build_config(str(path)) == build_config("statistics_mix")
    as_yaml = _cli("config", "init", "md5", "--yaml")
    assert yaml.safe_load(as_yaml.stdout) == json.load(open(os.path.join(READY_DIR, "md5.json")))
    bad = _cli("config", "init", "statistic_mix")
    assert bad.returncode == 2 and "did you mean 'statistics_mix'?" in bad.stderr
    listed = [line.split(None, 1) for line in _cli("config", "list").stdout.splitlines()]
    assert [name for name, _ in listed] == ready_configs()
    described = dict(listed)           # each with what it records: its YAML twin's first comment sentence
    with open(os.path.join(READY_DIR, "md5.yaml")) as f:
        assert described["md5"] in f.read().replace("\n# ", " ")
    assert described["md5"].startswith("API calls with a CRC-32 of each tensor")
    assert all(len(d) > 10 for d in described.values())


@pytest.mark.parametrize("field,value,want", [
    ("task", "tensors", "did you mean 'tensor'?"),
    ("level", "l1", "did you mean 'L1'?"),
    ("summary_mode", "MD5", "did you mean 'md5'?"),
    ("task", "overflow_check", "monitor mode"),
    ("task", "acc_check", "tsprobe acc-check"),
    ("task", "run_ut", "tsprobe acc-check"),
    ("task", "free_benchmark", "tsprobe acc-check"),
    ("task", "grad_probe", "monitor mode"),
    ("level", "L2", "L1 for API calls"),
])
def test_a_wrong_value_gets_a_pointer(field, value, want):
    section = {"summary_mode": value} if field == "summary_mode" else {}
    overrides = {} if section else {field: value}
    with pytest.raises(ConfigError) as err:
        build_config(None, **overrides) if not section else _with_section(section)
    assert want in str(err.value) and "allowed:" in str(err.value)


def _with_section(section):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"task": "statistics", "statistics": section}, f)
    try:
        return build_config(f.name)
    finally:
        os.unlink(f.name)


def test_a_far_miss_gets_no_guess():
    with pytest.raises(ConfigError) as err:
        build_config(None, level="L5")
    assert "did you mean" not in str(err.value)
