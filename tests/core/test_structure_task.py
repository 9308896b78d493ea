"""task "structure": construct.json and stack.json as a full dump writes them, dump.json records
with dtype and shape but no statistics; checked against a statistics run and against msprobe."""
import os

import pytest

from ts_core import PrecisionDebugger, build_config

from ..conftest import load_dump, load_json, require, tensor_summaries
from ..msprobe_ref import msprobe_json, run_msprobe
from .models import make


def _run(dump_root, **kw):
    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=dump_root, step=[0], **kw)
    dbg.start(model)
    model(x).pow(2).mean().backward()
    dbg.stop()
    dbg.close()
    rank = os.path.join(dump_root, "step0", "rank")
    return load_dump(rank), load_json(rank, "construct.json"), load_json(rank, "stack.json")


def test_structure_has_the_hierarchy_stacks_and_records_of_a_full_dump_without_values(tmp_path):
    s_dump, s_construct, s_stack = _run(str(tmp_path / "s"), task="structure", level="mix")
    f_dump, f_construct, f_stack = _run(str(tmp_path / "f"), task="statistics", level="mix")
    assert s_dump["task"] == "structure" and s_dump["level"] == "mix" and s_dump["dump_data_dir"] is None
    assert list(s_dump["data"]) == list(f_dump["data"])
    assert s_construct == f_construct
    assert s_construct["Functional.linear.0.forward"] == "Module.fc1.Linear.forward.0"
    assert [g[0] for g in s_stack.values()] == [g[0] for g in f_stack.values()]     # same keys, same grouping
    assert all(any("models.py" in f for f in g[1]) for g in s_stack.values() if "Module.fc1" in g[0][0])
    summaries = list(tensor_summaries(s_dump["data"]))
    full = list(tensor_summaries(f_dump["data"]))
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
    root = run_msprobe({"task": "structure", "rank": [], "step": [], "level": "mix", "risk_level": "ALL"},
                       "from tests.core.models import make\n"
                       "model, x = make('mlp')\n"
                       "d.start(model); model(x).pow(2).mean().backward(); d.stop(); d.step()\n", tmp_path)
    theirs = msprobe_json(root, "construct.json")
    _, ours, _ = _run(str(tmp_path / "ours"), task="structure", level="mix")
    assert set(theirs) == set(ours)
    for key, parent in theirs.items():
        if parent is None and ours[key] is not None:
            assert key == "Functional.linear.0.backward" and ours[key] == "Module.fc1.Linear.backward.0"
        else:
            assert ours[key] == parent, key


def test_structure_fingerprint_has_dtypes_and_shapes_and_does_no_tensor_work(dump_root, monkeypatch):
    from ts_core.backends.torch.tensors import TorchAdapter
    from ts_core.dumpfmt import read_fingerprint

    calls = []
    for name in ("stats", "crc32", "stats_to_host", "xor_checksum"):
        real = getattr(TorchAdapter, name)

        def counted(self, *a, _real=real, _name=name, **kw):
            calls.append(_name)
            return _real(self, *a, **kw)
        monkeypatch.setattr(TorchAdapter, name, counted)
    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=dump_root, step=[0], task="structure", level="mix")
    dbg.start(model)
    model(x).pow(2).mean().backward()
    dbg.stop()
    dbg.close()
    doc = read_fingerprint(os.path.join(dump_root, "step0", "rank"))
    assert calls == []
    assert doc["weights"] == {n: {"dtype": "torch.float32", "shape": list(p.shape)}
                              for n, p in model.named_parameters()}
    assert doc["data"] == {"args.0": {"dtype": "torch.float32", "shape": [5, 6]}}
