"""Config loading: msprobe schema from JSON/YAML/kwargs; every bad input is one ConfigError."""
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from ts_core import ConfigError, PrecisionDebugger, build_config
from ts_core.config import parse_int_list

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")


def _write(tmp_path, obj, name="config.json"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(obj) if name.endswith((".yaml", ".yml")) else json.dumps(obj))
    return str(path)


def test_defaults_match_msprobe():
    cfg = build_config()
    assert (cfg.task, cfg.level, cfg.dump_path, cfg.step, cfg.rank) == ("statistics", "L1", "./dump_path", [], [])
    assert cfg.data_mode == ["all"] and cfg.summary_mode == "statistics"


def test_task_section_applies_and_kwargs_override(tmp_path):
    path = _write(tmp_path, {"task": "tensor", "level": "L0", "step": "4-6", "rank": [1, "3"],
                             "tensor": {"list": ["Module.fc"], "data_mode": ["forward"]},
                             "statistics": {"list": ["ignored"], "summary_mode": "md5"}})
    cfg = build_config(path, level="mix", dump_path=str(tmp_path / "d"))
    assert cfg.task == "tensor" and cfg.level == "mix" and cfg.step == [4, 5, 6] and cfg.rank == [1, 3]
    assert cfg.list == ["Module.fc"] and cfg.data_mode == ["forward"]
    assert cfg.summary_mode == "statistics"          # the statistics section is not the active one


def test_yaml_loads_the_same_schema(tmp_path):
    obj = {"task": "statistics", "level": "mix", "step": [0, 2],
           "statistics": {"summary_mode": "md5", "scope": ["A.0.forward", "B.1.forward"]}}
    a = build_config(_write(tmp_path, obj, "c.yaml"))
    b = build_config(_write(tmp_path, obj, "c.json"))
    assert a == b and a.summary_mode == "md5" and a.scope == ["A.0.forward", "B.1.forward"]


@pytest.mark.parametrize("value,expected", [([1, 3], [1, 3]), ("3", [3]), ("4-6", [4, 5, 6]),
                                            ([0, "2-3", 2], [0, 2, 3]), (5, [5]), ([], [])])
def test_step_and_rank_forms(value, expected):
    assert parse_int_list("step", value) == expected


BAD = [
    ({"task": "overflow"}, "task", "statistics, tensor, structure"),
    ({"level": "L3"}, "level", "L0, L1, mix, debug"),
    ({"step": "6-4"}, "step", "ranges ascend"),
    ({"step": [1.5]}, "step", "non-negative ints"),
    ({"rank": [-1]}, "rank", "no negatives"),
    ({"step": [True]}, "step", "non-negative ints"),
    ({"dump_path": 3}, "dump_path", "folder path"),
    ({"seed": "x"}, "seed", "int in"),
    ({"is_deterministic": "yes"}, "is_deterministic", "true or false"),
    ({"statistics": {"summary_mode": "sha"}}, "summary_mode", "statistics, md5, xor"),
    ({"statistics": {"scope": ["only-one"]}}, "scope", "exactly two"),
    ({"statistics": {"data_mode": ["all", "forward"]}}, "data_mode", "cannot be combined"),
    ({"statistics": {"data_mode": ["sideways"]}}, "data_mode", "forward"),
    ({"statistics": {"data_mode": []}}, "data_mode", "non-empty"),
    ({"statistics": {"list": "Module.fc"}}, "list", "list of strings"),
    ({"statistics": {"scope": ["a", "b"], "list": ["c"]}}, "scope", "either scope or list"),
    ({"task": "tensor", "tensor": {"tensor_list": ["fc"]}}, "tensor.tensor_list", "statistics section"),
    ({"statistics": {"lst": []}}, "statistics.lst", "did you mean 'statistics.list'"),
    ({"levle": "L1"}, "levle", "did you mean 'level'"),
    ({"statistics": []}, "statistics", "mapping"),
    ({"compile_mode": "shdow"}, "compile_mode", "did you mean 'shadow'"),
]


@pytest.mark.parametrize("obj,field,hint", BAD)
def test_each_error_names_field_value_and_what_is_allowed(tmp_path, obj, field, hint):
    with pytest.raises(ConfigError) as info:
        build_config(_write(tmp_path, obj))
    err = info.value
    assert err.field == field
    assert hint in str(err)
    assert f"'{field}'" in str(err)
    assert str(err).startswith(f"{tmp_path / 'config.json'}: ")       # the file the value came from


def test_an_unknown_key_with_a_close_one_suggests_it_without_the_list_and_names_the_file(tmp_path):
    path = _write(tmp_path, {"task": "statistics", "levle": "L1"})
    with pytest.raises(ConfigError) as info:
        build_config(path)
    assert str(info.value) == f"{path}: config field 'levle': unknown key; did you mean 'level'?"
    far = _write(tmp_path, {"task": "statistics", "zzzzzz": 1}, "far.yaml")
    with pytest.raises(ConfigError) as info:
        build_config(far)
    text = str(info.value)          # nothing close: every key the file may hold
    assert text.startswith(f"{far}: config field 'zzzzzz': unknown key; known keys: ")
    assert all(k in text for k in ("dump_path", "level", "step", "statistics"))
    with pytest.raises(ConfigError) as info:        # a keyword argument: no file to name
        build_config(path, level="L9")
    assert str(info.value).startswith(f"{path}: config field 'levle'")
    with pytest.raises(ConfigError) as info:
        build_config(_write(tmp_path, {"task": "statistics"}, "plain.json"), level="L9")
    assert str(info.value).startswith("config field 'level'")


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        build_config(str(tmp_path / "missing.json"))
    bad = tmp_path / "broken.json"
    bad.write_text('{"task": "statistics",')
    with pytest.raises(ConfigError, match="not valid JSON/YAML") as info:
        build_config(str(bad))
    assert str(bad) in str(info.value)
    top = tmp_path / "list.json"
    top.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="mapping at top level"):
        build_config(str(top))


def _unreadable(path):
    """ConfigError message of build_config(path) for a file (mode 000) its reader may not open.
    Root reads any file, so as root the load runs in a forked child that has become 'nobody'
    first (`path` must then be in a folder 'nobody' can enter)."""
    path.write_text('{"task": "statistics"}')
    path.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(ConfigError) as info:
            build_config(str(path))
        return str(info.value)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # child: never returns into pytest
        try:
            os.setgid(65534)
            os.setuid(65534)
            build_config(str(path))
            msg = "no error"
        except BaseException as exc:              # noqa: B902 - reported to the parent
            msg = f"{type(exc).__name__}: {exc}"
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    os.waitpid(pid, 0)
    assert msg.startswith("ConfigError: "), msg
    return msg


@pytest.mark.parametrize("name, content", [
    ("random.json", bytes(range(256)) * 4),
    ("utf16.json", '{"task": "statistics"}'.encode("utf-16")),
    ("latin1.yaml", "task: statistics  # caf\xe9\n".encode("latin-1")),
], ids=["random-bytes", "utf-16", "latin-1"])
def test_config_that_is_not_text_is_a_config_error(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="not UTF-8 text") as info:
        build_config(str(path))
    assert str(path) in str(info.value) and "save the JSON or YAML config as UTF-8" in str(info.value)


def test_folder_and_unreadable_config_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="this is a folder") as info:
        build_config(str(tmp_path))
    assert str(tmp_path) in str(info.value)
    folder = tempfile.mkdtemp()        # pytest's own tmp folders are closed to other users
    try:
        os.chmod(folder, 0o755)
        path = Path(folder) / "secret.json"
        msg = _unreadable(path)
    finally:
        shutil.rmtree(folder)
    assert "permission denied" in msg and str(path) in msg


def test_unknown_keyword_override_is_rejected():
    with pytest.raises(ConfigError, match="did you mean 'summary_mode'"):
        PrecisionDebugger(summary_mod="md5")


def test_msprobe_only_keys_are_tolerated(tmp_path):
    cfg = build_config(_write(tmp_path, {"task": "statistics", "framework": "pytorch",
                                         "enable_dataloader": False, "acl_config": ""}))
    assert cfg.task == "statistics"


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(CONFIGS) if f.endswith((".json", ".yaml"))))
def test_every_shipped_config_loads(name):
    cfg = build_config(os.path.join(CONFIGS, name))
    # a hot-switch config (dump_enable) starts off and is turned on for the steps wanted
    assert cfg.step or cfg.dump_enable is not None, "shipped configs name their steps"
