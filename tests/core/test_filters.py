"""scope, list, data_mode, step and rank select exactly what they say."""
import os

import pytest
import torch

from ts_core import PrecisionDebugger

from ..conftest import load_dump, load_json
from .models import make

CONFIGS = os.path.join(os.path.dirname(__file__), "..", "..", "configs")


def _run(dump_root, steps=1, model_name="mlp", **kw):
    model, x = make(model_name)
    dbg = PrecisionDebugger(dump_path=dump_root, **kw)
    for _ in range(steps):
        dbg.start(model)
        model(x).pow(2).mean().backward()
        dbg.stop()
        dbg.step()
    dbg.close()
    return dbg


def _keys(dump_root, step=0):
    return set(load_dump(os.path.join(dump_root, f"step{step}", "rank"))["data"])


def test_steps_are_selected(dump_root):
    _run(dump_root, steps=4, level="L1", step=[1, 3])
    assert sorted(os.listdir(dump_root)) == ["step1", "step3"]


def test_every_step_when_step_is_empty(dump_root):
    _run(dump_root, steps=3, level="L1")
    assert sorted(os.listdir(dump_root)) == ["step0", "step1", "step2"]


def test_rank_filter_skips_this_process(dump_root):
    _run(dump_root, steps=1, level="L1", step=[0], rank=[1])      # not distributed: rank 0
    assert not os.path.exists(dump_root)


def test_set_init_step_numbers_steps(dump_root):
    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[5])
    dbg.set_init_step(4)
    for _ in range(2):
        dbg.start(model)
        model(x).sum().backward()
        dbg.stop()
        dbg.step()
    dbg.close()
    assert os.listdir(dump_root) == ["step5"]


def test_list_selects_module_and_everything_inside_at_mix(dump_root):
    _run(dump_root, config_path=os.path.join(CONFIGS, "tensor_list.json"))
    keys = _keys(dump_root)
    assert "Module.fc2.Linear.forward.0" in keys and "Module.fc2.Linear.backward.0" in keys
    assert "Functional.linear.1.forward" in keys          # called inside fc2
    assert "Functional.linear.1.backward" in keys
    assert "Module.fc2.Linear.parameters_grad.0" in keys
    assert not any("fc1" in k for k in keys)
    assert "Functional.linear.0.forward" not in keys      # inside fc1
    assert "Tensor.pow.0.forward" not in keys


def test_list_substring_selects_apis(dump_root):
    _run(dump_root, level="L1", step=[0], list=["relu", "Tensor.pow.0.forward"])
    assert _keys(dump_root) == {"Functional.relu.0.forward", "Functional.relu.0.backward",
                                "Tensor.pow.0.forward", "Tensor.pow.0.backward"}


def test_scope_range_is_inclusive_in_execution_order(dump_root):
    _run(dump_root, level="L1", step=[0], scope=["Functional.relu.0.forward", "Tensor.pow.0.forward"])
    fwd = {k for k in _keys(dump_root) if k.endswith("forward")}
    assert fwd == {"Functional.relu.0.forward", "Functional.linear.1.forward", "Tensor.pow.0.forward"}
    assert "Functional.linear.1.backward" in _keys(dump_root)
    assert "Functional.linear.0.backward" not in _keys(dump_root)


@pytest.mark.parametrize("modes,forward_fields,backward_fields", [
    (["forward"], {"input_args", "input_kwargs", "output"}, None),
    (["backward"], None, {"input", "output"}),
    (["input"], {"input_args", "input_kwargs"}, {"input"}),
    (["output"], {"output"}, {"output"}),
])
def test_data_mode(dump_root, modes, forward_fields, backward_fields):
    _run(dump_root, level="L1", step=[0], data_mode=modes)
    data = load_dump(os.path.join(dump_root, "step0", "rank"))["data"]
    fwd = data.get("Functional.linear.0.forward")
    bwd = data.get("Functional.linear.0.backward")
    assert (set(fwd) if fwd else None) == forward_fields
    assert (set(bwd) if bwd else None) == backward_fields


def test_construct_json_holds_the_hierarchy_at_mix_and_is_empty_at_L1(dump_root, tmp_path):
    _run(dump_root, level="mix", step=[0])
    construct = load_json(os.path.join(dump_root, "step0", "rank"), "construct.json")
    assert construct["Functional.linear.0.forward"] == "Module.fc1.Linear.forward.0"
    assert construct["Functional.linear.0.backward"] == "Module.fc1.Linear.backward.0"
    assert construct["Module.fc1.Linear.forward.0"] is None
    assert construct["Tensor.pow.0.forward"] is None
    other = str(tmp_path / "l1")
    _run(other, level="L1", step=[0])
    assert load_json(os.path.join(other, "step0", "rank"), "construct.json") == {}


def test_md5_config_writes_crc32_of_tensor_bytes(dump_root):
    import zlib

    dbg = PrecisionDebugger(config_path=os.path.join(CONFIGS, "md5.json"), dump_path=dump_root)
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    dbg.start()
    torch.abs(x)
    dbg.stop()
    dbg.close()
    rec = load_dump(os.path.join(dump_root, "step0", "rank"))["data"]["Torch.abs.0.forward"]
    assert rec["input_args"][0]["md5"] == f"{zlib.crc32(x.numpy().tobytes()):08x}"


def test_md5_of_every_tensor_matches_its_file_through_a_training_step(tmp_path):
    """Every CRC of an L1 statistics/md5 step (views, tensors passed on unchanged, the optimizer's
    in-place updates, gradients) equals zlib's CRC of the same value's file in a tensor dump of
    the same deterministic run."""
    import zlib

    import numpy as np

    def run(root, task):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        bufs = [torch.zeros_like(p) for p in model.parameters()]
        x = torch.randn(5, 6)
        dbg = PrecisionDebugger(dump_path=root, task=task, level="L1", step=[0, 1], summary_mode="md5")
        for _ in range(2):
            dbg.start(model)
            loss = model(x).pow(2).mean()
            loss.backward()
            with torch.no_grad():        # SGD with momentum in the user's code: recorded in-place updates
                for p, buf in zip(model.parameters(), bufs):     # (torch.optim's calls are not recorded)
                    buf.mul_(0.9).add_(p.grad)
                    p.add_(buf, alpha=-0.1)
                    p.grad = None
            dbg.stop()
            dbg.step()
        dbg.close()
        return os.path.join(root, "step1", "rank")

    def summaries(rank):
        out, stack = {}, [(k, v) for k, v in load_dump(rank)["data"].items()]
        while stack:
            path, v = stack.pop()
            if isinstance(v, dict) and "md5" in v:
                out[path] = v
            elif isinstance(v, dict):
                stack.extend((f"{path}/{k}", x) for k, x in v.items())
            elif isinstance(v, list):
                stack.extend((f"{path}/{i}", x) for i, x in enumerate(v))
        return out

    stats_rank, tensor_rank = run(str(tmp_path / "md5"), "statistics"), run(str(tmp_path / "files"), "tensor")
    got, files = summaries(stats_rank), summaries(tensor_rank)
    assert got.keys() == files.keys() and len(got) > 40
    for path, v in got.items():
        arr = np.load(os.path.join(tensor_rank, "dump_tensor_data", files[path]["data_name"]))
        assert v["md5"] == f"{zlib.crc32(np.ascontiguousarray(arr).tobytes()) & 0xFFFFFFFF:08x}", path
    assert len({v["md5"] for v in got.values()}) > 20       # many distinct values, in-place updates included


def test_statistics_mix_config_two_steps(dump_root):
    _run(dump_root, steps=3, config_path=os.path.join(CONFIGS, "statistics_mix.json"))
    assert sorted(os.listdir(dump_root)) == ["step0", "step1"]
    keys = _keys(dump_root, 1)
    assert "Module.fc1.Linear.forward.0" in keys and "Functional.linear.0.forward" in keys


def test_statistics_L1_config(dump_root):
    _run(dump_root, config_path=os.path.join(CONFIGS, "statistics_L1.json"))
    keys = _keys(dump_root)
    assert "Functional.linear.0.forward" in keys and not any(k.startswith("Module.") for k in keys)
