"""dump_enable: a running job starts, stops or changes its dump by editing its config file,
checked at step boundaries with one stat of the file."""
import json
import os

import pytest
import torch
import torch.nn.functional as F

from ts_core import PrecisionDebugger

from ..conftest import load_dump
from .models import make


def _write(path, obj):
    """Write the config and move its mtime forward (edits within one clock tick still show)."""
    st = os.stat(path) if os.path.exists(path) else None
    with open(path, "w") as f:
        json.dump(obj, f)
    if st is not None:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _cfg(dump_path, enable, **extra):
    cfg = {"task": "statistics", "dump_path": dump_path, "rank": [], "step": [], "level": "L1",
           "dump_enable": enable, "statistics": {"scope": [], "list": [], "data_mode": ["all"]}}
    for k, v in extra.items():
        (cfg["statistics"] if k in ("list", "summary_mode") else cfg).__setitem__(k, v)
    return cfg


def _train(dbg, model, x, steps, edits=None):
    """`steps` training steps; edits[i] (a callable) runs before step i starts."""
    for i in range(steps):
        if edits and i in edits:
            edits[i]()
        dbg.start(model)
        model(x).pow(2).mean().backward()
        dbg.stop()
        dbg.step()


def test_switching_on_and_off_between_steps(tmp_path):
    path, dump = str(tmp_path / "config.json"), str(tmp_path / "dump")
    _write(path, _cfg(dump, False))
    model, x = make("mlp")
    orig_linear = F.linear
    dbg = PrecisionDebugger(config_path=path)
    _train(dbg, model, x, 2)
    assert not os.path.exists(dump)
    assert F.linear is orig_linear                     # off from the start: nothing installed
    _train(dbg, model, x, 2, {0: lambda: _write(path, _cfg(dump, True))})
    _train(dbg, model, x, 2, {0: lambda: _write(path, _cfg(dump, False))})
    dbg.close()
    assert sorted(os.listdir(dump)) == ["step2", "step3"]
    data = load_dump(os.path.join(dump, "step2", "rank"))["data"]
    assert "Functional.linear.0.forward" in data and "Functional.linear.1.backward" in data


def test_other_fields_take_effect_at_the_next_step(tmp_path):
    path, dump = str(tmp_path / "config.json"), str(tmp_path / "dump")
    _write(path, _cfg(dump, True))
    model, x = make("mlp")
    dbg = PrecisionDebugger(config_path=path)
    _train(dbg, model, x, 3, {1: lambda: _write(path, _cfg(dump, True, list=["relu"], summary_mode="md5")),
                              2: lambda: _write(path, _cfg(dump, True, level="mix"))})
    dbg.close()
    keys = [set(load_dump(os.path.join(dump, f"step{i}", "rank"))["data"]) for i in range(3)]
    assert "Functional.linear.0.forward" in keys[0]
    assert keys[1] == {"Functional.relu.0.forward", "Functional.relu.0.backward"}
    relu = load_dump(os.path.join(dump, "step1", "rank"))["data"]["Functional.relu.0.forward"]
    assert len(relu["output"][0]["md5"]) == 8
    assert "Module.fc1.Linear.forward.0" in keys[2] and "Functional.linear.0.forward" in keys[2]


def test_an_invalid_edit_turns_dumping_off_until_fixed(tmp_path):
    path, dump = str(tmp_path / "config.json"), str(tmp_path / "dump")
    _write(path, _cfg(dump, True))
    model, x = make("mlp")
    dbg = PrecisionDebugger(config_path=path)

    def break_it():
        with open(path, "a") as f:
            f.write("{ not json")
    with pytest.warns(RuntimeWarning, match="not valid.*dumping is off until it is fixed"):
        _train(dbg, model, x, 3, {1: break_it, 2: lambda: None})
    _train(dbg, model, x, 1, {0: lambda: _write(path, _cfg(dump, True))})
    dbg.close()
    assert sorted(os.listdir(dump)) == ["step0", "step3"]


def test_removing_dump_enable_keeps_the_current_state(tmp_path):
    path, dump = str(tmp_path / "config.json"), str(tmp_path / "dump")
    _write(path, _cfg(dump, False))
    model, x = make("mlp")
    dbg = PrecisionDebugger(config_path=path)
    without = _cfg(dump, False)
    del without["dump_enable"]
    _train(dbg, model, x, 2, {1: lambda: _write(path, without)})
    assert dbg.config.dump_enable is False and dbg._watcher is not None
    dbg.close()
    assert not os.path.exists(dump)


def test_one_stat_per_step_boundary_and_no_read_while_unchanged(tmp_path, monkeypatch):
    path, dump = str(tmp_path / "config.json"), str(tmp_path / "dump")
    _write(path, _cfg(dump, True))
    model, x = make("mlp")
    dbg = PrecisionDebugger(config_path=path)
    stats = []
    real_stat = os.stat

    def counting_stat(p, *a, **kw):
        if os.fspath(p) == path:
            stats.append(p)
        return real_stat(p, *a, **kw)
    monkeypatch.setattr(os, "stat", counting_stat)
    dbg.start(model)
    for _ in range(50):                       # many recorded calls inside one step: no stat
        model(x).sum().backward()
    dbg.stop()
    dbg.step()
    assert len(stats) == 2                    # start() and step(), nothing per call
    _train(dbg, model, x, 3)
    assert dbg._watcher.reads == 0
    dbg.close()


def test_keyword_overrides_keep_winning_after_a_reload(tmp_path):
    path = str(tmp_path / "config.json")
    _write(path, _cfg(str(tmp_path / "from_file"), True))
    model, x = make("mlp")
    dbg = PrecisionDebugger(config_path=path, dump_path=str(tmp_path / "kw"))
    _train(dbg, model, x, 2, {1: lambda: _write(path, _cfg(str(tmp_path / "from_file"), True, list=["relu"]))})
    dbg.close()
    assert sorted(os.listdir(tmp_path / "kw")) == ["step0", "step1"] and not (tmp_path / "from_file").exists()
    assert set(load_dump(str(tmp_path / "kw" / "step1" / "rank"))["data"]) == \
        {"Functional.relu.0.forward", "Functional.relu.0.backward"}


def test_without_dump_enable_the_file_is_not_watched(tmp_path):
    path, dump = str(tmp_path / "config.json"), str(tmp_path / "dump")
    cfg = _cfg(dump, True)
    del cfg["dump_enable"]
    _write(path, cfg)
    model, x = make("mlp")
    dbg = PrecisionDebugger(config_path=path)
    _train(dbg, model, x, 2, {1: lambda: _write(path, _cfg(dump, False))})
    dbg.close()
    assert dbg._watcher is None
    assert sorted(os.listdir(dump)) == ["step0", "step1"]


def test_loss_and_gradients_unchanged_across_switches(tmp_path):
    def run(with_tool):
        torch.manual_seed(0)
        model, x = make("mlp")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path, dump = str(tmp_path / f"c{with_tool}.json"), str(tmp_path / f"d{with_tool}")
        _write(path, _cfg(dump, False))
        dbg = PrecisionDebugger(config_path=path) if with_tool else None
        losses = []
        for i in range(4):
            if dbg and i in (1, 3):
                _write(path, _cfg(dump, i == 1, level="mix" if i == 3 else "L1"))
            if dbg:
                dbg.start(model)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
            if dbg:
                dbg.stop()
                dbg.step()
        if dbg:
            dbg.close()
        return losses, [p.detach().clone() for p in model.parameters()]

    (la, pa), (lb, pb) = run(False), run(True)
    assert all(torch.equal(a, b) for a, b in zip(la, lb)) and all(torch.equal(a, b) for a, b in zip(pa, pb))
