"""task "structure": construct.json and stack.json as a full dump writes them, dump.json records
with dtype and shape but no statistics; checked against a statistics run and against msprobe."""
import glob
import json
import os
import subprocess
import sys

import pytest

from ts_core import PrecisionDebugger, build_config

from ..conftest import load_dump, load_json, require
from .models import make

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(dump_root, **kw):
    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=dump_root, step=[0], **kw)
    dbg.start(model)
    model(x).pow(2).mean().backward()
    dbg.stop()
    dbg.close()
    rank = os.path.join(dump_root, "step0", "rank")
    return load_dump(rank), load_json(rank, "construct.json"), load_json(rank, "stack.json")


def _summaries(obj):
    if isinstance(obj, dict) and obj.get("type") == "torch.Tensor":
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _summaries(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _summaries(v)


def test_structure_has_the_hierarchy_stacks_and_records_of_a_full_dump_without_values(tmp_path):
    s_dump, s_construct, s_stack = _run(str(tmp_path / "s"), task="structure", level="mix")
    f_dump, f_construct, f_stack = _run(str(tmp_path / "f"), task="statistics", level="mix")
    assert s_dump["task"] == "structure" and s_dump["level"] == "mix" and s_dump["dump_data_dir"] is None
    assert list(s_dump["data"]) == list(f_dump["data"])
    assert s_construct == f_construct
    assert s_construct["Functional.linear.0.forward"] == "Module.fc1.Linear.forward.0"
    assert [g[0] for g in s_stack.values()] == [g[0] for g in f_stack.values()]     # same keys, same grouping
    assert all(any("models.py" in f for f in g[1]) for g in s_stack.values() if "Module.fc1" in g[0][0])
    summaries = list(_summaries(s_dump["data"]))
    full = list(_summaries(f_dump["data"]))
    assert len(summaries) == len(full) > 20
    for s, f in zip(summaries, full):
        assert s == {k: f[k] for k in ("type", "dtype", "shape", "requires_grad")}
    assert not os.path.exists(os.path.join(tmp_path, "s", "step0", "rank", "dump_tensor_data"))


def test_structure_raises_level_l1_to_mix_as_msprobe_does():
    with pytest.warns(UserWarning, match="raised to 'mix'"):
        cfg = build_config(task="structure", level="L1")
    assert cfg.level == "mix"
    assert build_config(task="structure", level="L0").level == "L0"


def test_structure_at_l0_records_modules_only(dump_root):
    dump, construct, _ = _run(dump_root, task="structure", level="L0")
    assert dump["data"] and all(k.startswith("Module.") for k in dump["data"])
    assert set(construct) == {k for k in dump["data"] if "parameters_grad" not in k}


@require("msprobe")
def test_construct_json_matches_msprobe(tmp_path):
    """Same keys as msprobe 26.2.0's structure dump of the same model; the same parents, except
    that msprobe leaves the backward of the first layer's API without a parent."""
    ms_root = tmp_path / "ms"
    (tmp_path / "c.json").write_text(json.dumps({"task": "structure", "dump_path": str(ms_root), "rank": [],
                                                 "step": [], "level": "mix", "risk_level": "ALL"}))
    script = ("import sys; sys.path.insert(0, %r)\n"
              "from tests.core.models import make\n"
              "from msprobe.pytorch import PrecisionDebugger\n"
              "d = PrecisionDebugger(config_path=%r)\n"
              "model, x = make('mlp')\n"
              "d.start(model); model(x).pow(2).mean().backward(); d.stop(); d.step()\n") % (ROOT, str(tmp_path / "c.json"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.load(open(glob.glob(str(ms_root / "step0" / "*" / "construct.json"))[0]))
    _, ours, _ = _run(str(tmp_path / "ours"), task="structure", level="mix")
    assert set(theirs) == set(ours)
    for key, parent in theirs.items():
        if parent is None and ours[key] is not None:
            assert key == "Functional.linear.0.backward" and ours[key] == "Module.fc1.Linear.backward.0"
        else:
            assert ours[key] == parent, key
