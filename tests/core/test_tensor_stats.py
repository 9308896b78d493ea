"""Every Max/Min/Mean/Norm in dump.json equals numpy's on the saved .npy file."""
import os

import numpy as np
import pytest
import torch

from ts_core import PrecisionDebugger

from ..conftest import load_dump, require, tensor_summaries
from .models import train_steps


def _check_against_npy(rank_dir):
    dump = load_dump(rank_dir)
    assert dump["task"] == "tensor" and dump["dump_data_dir"].endswith("dump_tensor_data")
    checked = 0
    for key, rec in dump["data"].items():
        for s in tensor_summaries(rec):
            path = os.path.join(rank_dir, "dump_tensor_data", s["data_name"])
            arr = np.load(path, allow_pickle=False)
            assert list(arr.shape) == s["shape"], key
            if arr.size == 0:
                continue
            a = arr.astype(np.float64)
            exp = [a.max(), a.min(), a.mean(), np.sqrt((a * a).sum())]
            got = [s["Max"], s["Min"], s["Mean"], s["Norm"]]
            np.testing.assert_allclose(got, exp, rtol=2e-5, atol=1e-6, err_msg=f"{key} {s['data_name']}")
            checked += 1
    return checked


@pytest.mark.parametrize("name,level", [("mlp", "L0"), ("mlp", "L1"), ("cnn", "mix"),
                                        pytest.param("gpt2", "mix", marks=require("transformers"))])
def test_statistics_match_numpy_on_saved_tensors(dump_root, name, level):
    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level=level, step=[0])
    train_steps(name, dbg, steps=1)
    dbg.close()
    checked = _check_against_npy(os.path.join(dump_root, "step0", "rank"))
    assert checked > 10


def test_int_and_bool_statistics_are_exact(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, task="statistics", level="L1", step=[0])
    dbg.start()
    idx = torch.tensor([[3, -7, 2**40]], dtype=torch.int64)
    torch.abs(idx)
    torch.logical_not(torch.tensor([True, False, False]))
    dbg.stop()
    dbg.close()
    data = load_dump(os.path.join(dump_root, "step0", "rank"))["data"]
    s = data["Torch.abs.0.forward"]["input_args"][0]
    assert (s["Max"], s["Min"]) == (2**40, -7) and isinstance(s["Max"], int)
    b = data["Torch.logical_not.0.forward"]["input_args"][0]
    assert (b["Max"], b["Min"]) == (True, False)
    assert b["Mean"] == pytest.approx(1 / 3)


def test_a_tensor_passed_on_unchanged_is_stored_once_and_linked(dump_root, monkeypatch):
    import ts_core.record.collector as collector

    monkeypatch.setattr(collector, "FLUSH_SECONDS", 60.0)   # one flush window, however slow the machine
    x = torch.randn(64, 64)
    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="L1", step=[0])
    dbg.start()
    y = torch.sin(x)           # y: output of sin ...
    torch.cos(y)               # ... and, unchanged, input of cos: one file, two names
    y.add_(1.0)                # changed in place: a new file
    dbg.stop()
    dbg.close()
    rank_dir = os.path.join(dump_root, "step0", "rank")
    data = load_dump(rank_dir)["data"]
    tdir = os.path.join(rank_dir, "dump_tensor_data")
    out_sin = os.path.join(tdir, data["Torch.sin.0.forward"]["output"][0]["data_name"])
    in_cos = os.path.join(tdir, data["Torch.cos.0.forward"]["input_args"][0]["data_name"])
    in_add = os.path.join(tdir, data["Tensor.add_.0.forward"]["input_args"][0]["data_name"])
    out_add = os.path.join(tdir, data["Tensor.add_.0.forward"]["output"][0]["data_name"])
    assert os.path.samefile(out_sin, in_cos)
    assert os.path.samefile(out_sin, in_add)           # still unchanged when add_ starts
    assert not os.path.samefile(in_add, out_add)
    np.testing.assert_array_equal(np.load(in_cos), torch.sin(x).numpy())
    np.testing.assert_array_equal(np.load(out_add), (torch.sin(x) + 1).numpy())
