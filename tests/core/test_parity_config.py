"""The config keys of msprobe's dump options load as msprobe users write them; wrong values and
combinations are one ConfigError naming the field; the checksum field's kinds are told apart."""
import json
import os

import numpy as np
import pytest

from ts_core import ConfigError, build_config
from ts_core.dumpfmt import CRC32, XOR, checksum_kind, xor_field, xor_of_array

from ..msprobe_ref import ROOT


def _write(tmp_path, obj):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(obj))
    return str(path)


def test_msprobes_shipped_config_and_documented_examples_load(tmp_path):
    shipped = {"task": "statistics", "dump_path": "./dump_path", "rank": [], "step": [], "level": "L1",
               "extra_info": True, "async_dump": False,
               "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
               "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
               "acc_check": {"white_list": [], "black_list": [], "error_data_path": "./"}}
    assert build_config(_write(tmp_path, shipped)).task == "statistics"
    statistics = {"task": "statistics", "dump_path": "/home/data_dump", "rank": [], "step": [], "level": "L1",
                  "async_dump": False, "extra_info": True,
                  "statistics": {"scope": [], "list": [], "tensor_list": ["relu"], "data_mode": ["all"],
                                 "summary_mode": "statistics"}}
    assert build_config(_write(tmp_path, statistics)).tensor_list == ["relu"]
    tensor = {"task": "tensor", "dump_path": "/home/data_dump", "rank": [], "step": [], "level": "L1",
              "async_dump": False,
              "tensor": {"scope": [], "list": [], "data_mode": ["all"], "bench_path": "/home/bench_data_dump",
                         "summary_mode": "md5", "diff_nums": 5}}
    cfg = build_config(_write(tmp_path, tensor))
    assert (cfg.bench_path, cfg.summary_mode, cfg.diff_nums) == ("/home/bench_data_dump", "md5", 5)
    structure = {"task": "structure", "dump_path": "/home/data_dump", "rank": [], "step": [], "level": "mix"}
    assert build_config(_write(tmp_path, structure)).task == "structure"
    enable = {"task": "statistics", "dump_path": "/home/data_dump", "rank": [], "step": [], "level": "L1",
              "dump_enable": False, "statistics": {"summary_mode": "statistics"}}
    assert build_config(_write(tmp_path, enable)).dump_enable is False
    xor = {"task": "statistics", "statistics": {"summary_mode": "xor"}}
    assert build_config(_write(tmp_path, xor)).summary_mode == "xor"
    assert build_config(_write(tmp_path, {"async_dump": True})).async_dump is True


def test_structure_section_takes_scope_and_list(tmp_path):
    cfg = build_config(_write(tmp_path, {"task": "structure", "level": "mix",
                                          "structure": {"list": ["Module.fc1"], "data_mode": ["forward"]}}))
    assert cfg.list == ["Module.fc1"] and cfg.data_mode == ["forward"]


BAD = [
    ({"statistics": {"tensor_list": "relu"}}, "tensor_list", "list of strings"),
    ({"statistics": {"tensor_list": ["relu", " "]}}, "tensor_list", "non-empty"),
    ({"task": "tensor", "tensor": {"tensor_list": ["relu"]}}, "tensor.tensor_list", "statistics section"),
    ({"task": "statistics", "statistics": {"bench_path": "/x"}}, "statistics.bench_path", "tensor section"),
    ({"task": "structure", "level": "mix", "structure": {"summary_mode": "xor"}}, "structure.summary_mode",
     "records no values"),
    ({"dump_enable": "yes"}, "dump_enable", "true or false"),
    ({"async_dump": 1}, "async_dump", "true or false"),
    ({"task": "tensor", "tensor": {"bench_path": "/x", "diff_nums": "3"}}, "diff_nums", "positive int"),
    ({"task": "tensor", "tensor": {"bench_path": "/x", "diff_nums": -2}}, "diff_nums", "positive int"),
    ({"statistics": {"summary_mode": "crc"}}, "summary_mode", "statistics, md5, xor"),
]


@pytest.mark.parametrize("obj,field,hint", BAD)
def test_each_error_names_the_field(tmp_path, obj, field, hint):
    with pytest.raises(ConfigError, match=hint) as info:
        build_config(_write(tmp_path, obj))
    assert info.value.field == field


def test_keyword_combinations_are_checked_too():
    with pytest.raises(ConfigError, match="statistics-task option") as info:
        build_config(task="tensor", tensor_list=["fc"])
    assert info.value.field == "tensor_list"
    with pytest.raises(ConfigError, match="records no values"):
        build_config(task="structure", level="mix", summary_mode="md5")


def test_ready_configs_of_this_issue_load():
    for name in ("structure", "xor", "async_dump", "dump_enable", "diff_dump", "statistics_tensor_list"):
        cfg = build_config(os.path.join(ROOT, "configs", f"{name}.json"))
        assert cfg == build_config(os.path.join(ROOT, "configs", f"{name}.yaml"))
    assert build_config(os.path.join(ROOT, "configs", "diff_dump.json")).diff_nums == 5


def test_checksum_field_kinds_and_format():
    assert checksum_kind("3e1a317a") == CRC32
    assert checksum_kind("0x3e1a317a7e78d33e") == XOR
    assert checksum_kind(2.5) == XOR and checksum_kind(None) is None and checksum_kind("Functional") is None
    assert xor_field(-7) == "0xfffffffffffffff9" and xor_field(True) == "0x0000000000000001"
    assert xor_field(2.5) == 2.5 and xor_field(None) is None
    assert xor_of_array(np.array([1, 2, 3], dtype=np.int64)) == "0x0000000000000000"      # 1 ^ 2 ^ 3
    assert xor_of_array(np.array(7, dtype=np.int32)) == "0x0000000000000007"
    assert xor_of_array(np.zeros((0, 3))) is None
