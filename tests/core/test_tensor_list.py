"""tensor_list (statistics task): statistics for every record, and the real tensors of the records
whose key contains a listed name, as msprobe selects them."""
import os

import numpy as np
import torch

from ts_core import PrecisionDebugger, build_config

from ..conftest import load_dump, require, tensor_summaries
from ..msprobe_ref import ROOT, msprobe_json, run_msprobe
from .models import make

CONFIGS = os.path.join(ROOT, "configs")


def _data_names(obj):
    return [s["data_name"] for s in tensor_summaries(obj) if "data_name" in s]


def _run(dump_root, tensor_list, level="mix"):
    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=dump_root, level=level, step=[0], tensor_list=tensor_list)
    with torch.no_grad():
        hidden = torch.relu(model.fc1(x))                # the fc2 input, computed outside the dump
    dbg.start(model)
    model(x).pow(2).mean().backward()
    dbg.stop()
    dbg.close()
    rank = os.path.join(dump_root, "step0", "rank")
    return model, x, hidden, load_dump(rank), rank


def test_listed_records_get_tensor_files_all_records_get_statistics(dump_root):
    model, x, hidden, dump, rank = _run(dump_root, ["fc2", "relu"])
    data = dump["data"]
    assert dump["task"] == "statistics" and dump["dump_data_dir"] == os.path.join(rank, "dump_tensor_data")
    saved = sorted(_data_names(data))
    assert saved == sorted(os.listdir(os.path.join(rank, "dump_tensor_data")))
    assert {"Module.fc2.Linear.forward.0.input.0.npy", "Module.fc2.Linear.backward.0.output.0.npy",
            "Functional.relu.0.forward.output.0.npy", "Module.fc2.Linear.parameters_grad.0.weight.npy"} <= set(saved)
    for key, rec in data.items():
        names = _data_names(rec)
        assert bool(names) == ("fc2" in key or "relu" in key), key
        for summary in (rec.get("output") or []):
            if isinstance(summary, dict) and summary.get("type") == "torch.Tensor":
                assert summary["Max"] is not None, key           # statistics everywhere
    fwd = data["Module.fc2.Linear.forward.0"]
    tensor_dir = os.path.join(rank, "dump_tensor_data")
    np.testing.assert_array_equal(np.load(os.path.join(tensor_dir, fwd["input_args"][0]["data_name"])), hidden.numpy())
    np.testing.assert_array_equal(np.load(os.path.join(tensor_dir, fwd["parameters"]["weight"]["data_name"])),
                                  model.fc2.weight.detach().numpy())
    grad = data["Module.fc2.Linear.parameters_grad.0"]["weight"][0]
    np.testing.assert_array_equal(np.load(os.path.join(tensor_dir, grad["data_name"])), model.fc2.weight.grad.numpy())
    assert "data_name" not in data["Module.fc1.Linear.parameters_grad.0"]["weight"][0]


def test_matching_is_msprobes_substring_match_on_the_key(dump_root):
    """'ReLU' (the module class) is not 'relu': msprobe matches case-sensitively, as here."""
    _, _, _, dump, _ = _run(dump_root, ["relu"])
    with_files = {k for k, rec in dump["data"].items() if _data_names(rec)}
    assert with_files == {"Functional.relu.0.forward", "Functional.relu.0.backward"}


def test_no_tensor_folder_without_tensor_list(dump_root):
    _, _, _, dump, rank = _run(dump_root, [])
    assert dump["dump_data_dir"] is None and not os.path.exists(os.path.join(rank, "dump_tensor_data"))
    assert not _data_names(dump["data"])


def test_ready_config_loads(tmp_path):
    cfg = build_config(os.path.join(CONFIGS, "statistics_tensor_list.json"))
    assert cfg.task == "statistics" and cfg.tensor_list and cfg.level == "mix"


@require("msprobe")
def test_same_files_as_msprobe(tmp_path):
    root = run_msprobe({"task": "statistics", "rank": [], "step": [], "level": "mix", "risk_level": "ALL",
                        "statistics": {"tensor_list": ["fc2", "relu"]}},
                       "from tests.core.models import make\n"
                       "model, x = make('mlp')\n"
                       "d.start(model); model(x).pow(2).mean().backward(); d.stop(); d.step()\n", tmp_path)
    theirs = msprobe_json(root)["data"]
    _, _, _, ours, _ = _run(str(tmp_path / "ours"), ["fc2", "relu"])
    assert sorted(n[:-len(".pt")] for n in _data_names(theirs)) == \
        sorted(n[:-len(".npy")] for n in _data_names(ours["data"]))
