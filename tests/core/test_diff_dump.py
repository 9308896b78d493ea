"""Diff-only dump (bench_path + diff_nums): statistics and CRCs everywhere, tensor files only for
the records that introduce a difference against an earlier md5 dump; msprobe picks the same."""
import json
import os

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ts_core import ConfigError, PrecisionDebugger, build_config

from ..conftest import load_dump, require
from ..msprobe_ref import msprobe_rank_dir, run_msprobe
NUDGE = 1.0 + 2 ** -20          # one op of the new run scales by this: a few low bits change


class TwoBranch(nn.Module):
    """Two independent places where a run can differ from the bench (s1, s2: 1.0 in the bench)."""

    def __init__(self, s1: float = 1.0, s2: float = 1.0):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc3, self.fc2 = nn.Linear(6, 8), nn.Linear(6, 8), nn.Linear(8, 3)
        self.s1, self.s2 = s1, s2

    def forward(self, x):
        a = F.relu(self.fc1(x)) * self.s1
        b = torch.tanh(self.fc3(x)) * self.s2
        return self.fc2(a + b)


def _x():
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(1))


def _run(dump_root, net, level="L1", steps=1, **kw):
    dbg = PrecisionDebugger(dump_path=dump_root, level=level, **kw)
    for _ in range(steps):
        dbg.start(net)
        net(_x()).pow(2).mean().backward()
        dbg.stop()
        dbg.step()
    dbg.close()
    return [os.path.join(dump_root, f"step{i}", "rank") for i in range(steps)]


def _bench(tmp_path, level="L1", steps=1):
    root = str(tmp_path / "bench")
    _run(root, TwoBranch(), level=level, steps=steps, task="statistics", summary_mode="md5")
    return root


def _saved(rank):
    folder = os.path.join(rank, "dump_tensor_data")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_only_the_op_that_introduced_the_difference_is_saved(tmp_path):
    bench = _bench(tmp_path)
    rank, = _run(str(tmp_path / "new"), TwoBranch(s1=NUDGE, s2=NUDGE), task="tensor", bench_path=bench)
    assert _saved(rank) == ["Tensor.__mul__.0.forward.input.0.npy", "Tensor.__mul__.0.forward.output.0.npy"]
    dump = load_dump(rank)
    assert dump["task"] == "tensor"
    data = dump["data"]
    mul = data["Tensor.__mul__.0.forward"]
    x = _x()
    ref = TwoBranch()
    with torch.no_grad():
        h = F.relu(ref.fc1(x))
    folder = os.path.join(rank, "dump_tensor_data")
    np.testing.assert_array_equal(np.load(os.path.join(folder, mul["input_args"][0]["data_name"])), h.numpy())
    np.testing.assert_array_equal(np.load(os.path.join(folder, mul["output"][0]["data_name"])), (h * NUDGE).numpy())
    for key, rec in data.items():                 # statistics and CRCs for every record, files for one
        for part in ("input_args", "output", "input"):
            for s in rec.get(part) or []:
                if isinstance(s, dict) and s.get("type") == "torch.Tensor":
                    assert s["Max"] is not None and len(s["md5"]) == 8
                    assert ("data_name" in s) == (key == "Tensor.__mul__.0.forward"), key


@pytest.mark.parametrize("diff_nums,expected", [(2, 2), (-1, 2), (1, 1)])
def test_diff_nums_counts_independent_sources(tmp_path, diff_nums, expected):
    bench = _bench(tmp_path)
    rank, = _run(str(tmp_path / "new"), TwoBranch(s1=NUDGE, s2=NUDGE), task="tensor", bench_path=bench,
                 diff_nums=diff_nums)
    records = {f.split(".forward")[0] for f in _saved(rank)}
    assert records == {"Tensor.__mul__.0", "Tensor.__mul__.1"} if expected == 2 else {"Tensor.__mul__.0"}


def test_identical_run_saves_nothing_and_downstream_records_do_not_count(tmp_path):
    bench = _bench(tmp_path, level="mix", steps=2)
    ranks = _run(str(tmp_path / "same"), TwoBranch(), level="mix", steps=2, task="tensor", bench_path=bench,
                 diff_nums=-1)
    assert [_saved(r) for r in ranks] == [[], []]
    ranks = _run(str(tmp_path / "s2"), TwoBranch(s2=NUDGE), level="mix", steps=2, task="tensor",
                 bench_path=bench, diff_nums=-1)
    # step 0: the tanh branch's multiply only (fc2, the loss and every backward consume its result);
    # step 1 runs on the same weights (no optimizer), so it finds the same op again
    for r in ranks:
        assert {f.split(".forward")[0] for f in _saved(r)} == {"Tensor.__mul__.1"}


def test_a_missing_bench_step_warns_and_saves_no_tensors(tmp_path):
    bench = _bench(tmp_path)
    with pytest.warns(RuntimeWarning, match="no bench dump for step 1"):
        ranks = _run(str(tmp_path / "new"), TwoBranch(s1=NUDGE), steps=2, task="tensor", bench_path=bench)
    assert len(_saved(ranks[0])) == 2 and _saved(ranks[1]) == []
    assert load_dump(ranks[1])["data"]


def test_a_bench_of_another_checksum_kind_is_refused_with_a_warning(tmp_path):
    bench = str(tmp_path / "bench")
    _run(bench, TwoBranch(), task="statistics", summary_mode="xor")
    with pytest.warns(RuntimeWarning, match="holds no crc32 checksums"):
        rank, = _run(str(tmp_path / "new"), TwoBranch(s1=NUDGE), task="tensor", bench_path=bench)
    assert _saved(rank) == []


def test_config_rules(tmp_path):
    bench = str(tmp_path)
    cfg = build_config(task="tensor", bench_path=bench)
    assert cfg.summary_mode == "md5" and cfg.diff_nums == 1          # CRCs are what it compares
    for kw, field, hint in [
        (dict(task="statistics", bench_path=bench), "bench_path", "tensor-task option"),
        (dict(task="tensor", bench_path=bench, summary_mode="statistics"), "summary_mode", "use summary_mode md5"),
        (dict(task="tensor", bench_path=bench, async_dump=True), "async_dump", "set async_dump false"),
        (dict(task="tensor", bench_path=bench, diff_nums=0), "diff_nums", r"-1 \(no limit\)"),
        (dict(task="tensor", bench_path=bench, diff_nums=True), "diff_nums", "positive int"),
        (dict(task="tensor", bench_path=3), "bench_path", "dump_path of an earlier run"),
    ]:
        with pytest.raises(ConfigError, match=hint) as info:
            build_config(**kw)
        assert info.value.field == field
    with pytest.raises(ConfigError, match="no such folder") as info:     # checked when a debugger starts
        PrecisionDebugger(task="tensor", bench_path=str(tmp_path / "nope"))
    assert info.value.field == "bench_path"
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"task": "statistics", "statistics": {"bench_path": bench}}))
    with pytest.raises(ConfigError, match="belongs to the tensor section"):
        build_config(str(path))


@require("msprobe")
def test_msprobe_saves_the_same_records_and_its_bench_works_here(tmp_path):
    """msprobe 26.2.0 makes the bench (its md5 dump, a proc{PID} folder) and runs the diff-only
    dump itself; our run against msprobe's bench saves the same tensors."""
    body = ("from tests.core.test_diff_dump import TwoBranch, _x\n"
            "net = TwoBranch(float(sys.argv[1]), float(sys.argv[1]))\n"
            "d.start(); net(_x()).pow(2).mean().backward(); d.stop(); d.step()\n")
    common = {"rank": [], "step": [], "level": "L1", "risk_level": "ALL"}
    ms_bench = run_msprobe(dict(common, task="statistics", statistics={"summary_mode": "md5"}), body, tmp_path,
                           ["1.0"], name="ms_bench")
    ms_new = run_msprobe(dict(common, task="tensor", tensor={"summary_mode": "md5", "bench_path": ms_bench,
                                                               "diff_nums": -1}), body, tmp_path, [repr(NUDGE)],
                         name="ms_new")
    theirs = os.path.join(msprobe_rank_dir(ms_new), "dump_tensor_data")
    rank, = _run(str(tmp_path / "ours"), TwoBranch(NUDGE, NUDGE), task="tensor", bench_path=ms_bench, diff_nums=-1)
    assert [f[:-len(".pt")] for f in sorted(os.listdir(theirs))] == [f[:-len(".npy")] for f in _saved(rank)]
    assert len(_saved(rank)) == 4
