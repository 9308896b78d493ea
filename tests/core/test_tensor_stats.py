"""Every Max/Min/Mean/Norm in dump.json equals numpy's on the saved .npy file."""
import os

import numpy as np
import pytest
import torch

from ts_core import PrecisionDebugger

from ..conftest import load_dump, require
from .models import train_steps


def _summaries(obj):
    if isinstance(obj, dict):
        if obj.get("type") == "torch.Tensor":
            yield obj
        else:
            for v in obj.values():
                yield from _summaries(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _summaries(v)


def _check_against_npy(rank_dir):
    dump = load_dump(rank_dir)
    assert dump["task"] == "tensor" and dump["dump_data_dir"].endswith("dump_tensor_data")
    checked = 0
    for key, rec in dump["data"].items():
        for s in _summaries(rec):
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
