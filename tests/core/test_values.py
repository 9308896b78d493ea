"""Any dtype, any argument structure: summarised without a crash, in float32 or better."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from ts_core import PrecisionDebugger

from ..conftest import load_dump, load_json

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _record(dump_root, fn, task="statistics"):
    dbg = PrecisionDebugger(dump_path=dump_root, task=task, level="L1", step=[0])
    dbg.start()
    fn()
    dbg.stop()
    dbg.close()
    return load_dump(os.path.join(dump_root, "step0", "rank"))["data"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool,
                                   torch.complex64])
def test_every_dtype(dump_root, dtype):
    x = (torch.arange(12).reshape(3, 4) - 5).to(dtype) if dtype != torch.bool else (torch.arange(12) % 3 == 0).reshape(3, 4)
    data = _record(dump_root, lambda: torch.flatten(x), task="tensor")
    assert list(data) == ["Torch.flatten.0.forward"]     # the writer thread's own work is not recorded
    s = data["Torch.flatten.0.forward"]["input_args"][0]
    assert s["dtype"] == str(dtype) and s["shape"] == [3, 4]
    arr = np.load(os.path.join(dump_root, "step0", "rank", "dump_tensor_data", s["data_name"]))
    ref = np.abs(arr) if dtype.is_complex else arr.astype(np.float64)
    assert s["Max"] == pytest.approx(ref.max()) and s["Min"] == pytest.approx(ref.min())
    assert s["Mean"] == pytest.approx(ref.mean(), rel=1e-6)
    assert s["Norm"] == pytest.approx(np.sqrt((ref.astype(np.float64) ** 2).sum()), rel=1e-6)


def test_low_precision_statistics_use_float32(dump_root):
    x = torch.full((4096,), 1.0, dtype=torch.float16) + torch.linspace(0, 1e-3, 4096, dtype=torch.float16)
    data = _record(dump_root, lambda: torch.abs(x))
    s = data["Torch.abs.0.forward"]["input_args"][0]
    exact = x.double()
    assert s["Mean"] == pytest.approx(exact.mean().item(), rel=1e-6)
    assert s["Norm"] == pytest.approx(exact.norm().item(), rel=1e-6)   # a float16 sum would overflow/lose it


def test_non_tensor_and_nested_arguments(dump_root):
    a, b = torch.ones(2, 3), torch.zeros(2, 3)
    data = _record(dump_root, lambda: (torch.cat([a, b], dim=0), a.to(torch.float64),
                                       a.reshape(torch.Size([3, 2])), a[0, 1:3], torch.empty(0).sum()))
    cat = data["Torch.cat.0.forward"]
    assert [s["shape"] for s in cat["input_args"][0]] == [[2, 3], [2, 3]]
    assert cat["input_kwargs"] == {"dim": {"type": "int", "value": 0}}
    assert data["Tensor.to.0.forward"]["input_args"][1] == {"type": "torch.dtype", "value": "torch.float64"}
    assert data["Tensor.reshape.0.forward"]["input_args"][1] == {"type": "torch.Size", "value": [3, 2]}
    idx = data["Tensor.__getitem__.0.forward"]["input_args"][1]
    assert idx == [{"type": "int", "value": 0}, {"type": "slice", "value": [1, 3, None]}]
    empty = data["Tensor.sum.0.forward"]["input_args"][0]
    assert empty["shape"] == [0] and empty["Max"] is None


def test_nan_and_inf_are_recorded_not_crashed(dump_root):
    x = torch.tensor([1.0, float("nan"), float("inf")])
    data = _record(dump_root, lambda: torch.abs(x))
    s = data["Torch.abs.0.forward"]["input_args"][0]
    assert s["Max"] != s["Max"]    # NaN propagates through max


def test_stack_json_keeps_user_frames_under_python_c(tmp_path):
    code = ("import torch; from ts_core import PrecisionDebugger; "
            f"d = PrecisionDebugger(dump_path={str(tmp_path / 'd')!r}, level='L1', step=[0]); d.start(); "
            "torch.relu(torch.ones(2)); d.stop(); d.close()")
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=str(tmp_path))
    stack = load_json(str(tmp_path / "d" / "step0" / "rank"), "stack.json")
    (keys, frames), = stack.values()
    assert keys == ["Torch.relu.0.forward"]
    assert frames == ["File <string>, line 1, in <module>, \n "]


def test_stack_json_points_at_the_calling_line(dump_root):
    def user_function():
        return torch.sigmoid(torch.ones(2))   # the line stack.json must name

    _record(dump_root, user_function)
    stack = load_json(os.path.join(dump_root, "step0", "rank"), "stack.json")
    (keys, frames), = stack.values()
    assert "return torch.sigmoid(torch.ones(2))" in frames[0] and "in user_function" in frames[0]
    assert __file__ in frames[0]
    assert not any("ts_core" in f for f in frames)
