"""module_dump(module, name) / module_dump_end(): one module recorded as a whole, whatever the
level, nothing else meanwhile (msprobe's documented contract), normal recording afterwards."""
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ts_core
from ts_core import PrecisionDebugger, module_dump, module_dump_end

from ..conftest import load_dump, require
from ..msprobe_ref import msprobe_json, run_msprobe


class ModuleOP(nn.Module):            # msprobe's own example
    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features=8, out_features=4)
        self.linear_2 = nn.Linear(in_features=4, out_features=2)

    def forward(self, x):
        return F.relu(self.linear_2(self.linear_1(x)))


def _example(dump_root, level, functions=True):
    torch.manual_seed(0)
    module = ModuleOP()
    x = torch.randn(10, 8)
    dbg = PrecisionDebugger(dump_path=dump_root, level=level, step=[0])
    dbg.start(module if level != "L1" else None)
    y = torch.sigmoid(x)
    (module_dump if functions else dbg.module_dump)(module, "MyModuleOP")
    out = module(y)
    (module_dump_end if functions else dbg.module_dump_end)()
    loss = out.sum()
    loss.backward()
    dbg.stop()
    dbg.close()
    return module, y, out, load_dump(os.path.join(dump_root, "step0", "rank"))["data"]


@pytest.mark.parametrize("functions", [True, False], ids=["functions", "methods"])
def test_l1_records_the_module_as_one_call_and_nothing_inside(dump_root, functions):
    module, y, out, data = _example(dump_root, "L1", functions)
    assert list(data) == ["Torch.sigmoid.0.forward", "Module.MyModuleOP.ModuleOP.forward.0", "Tensor.sum.0.forward",
                          "Tensor.sum.0.backward", "Module.MyModuleOP.ModuleOP.backward.0"]
    fwd = data["Module.MyModuleOP.ModuleOP.forward.0"]
    assert fwd["input_args"][0]["Max"] == pytest.approx(y.max().item())
    assert fwd["output"][0]["Norm"] == pytest.approx(out.detach().norm().item(), rel=1e-6)
    bwd = data["Module.MyModuleOP.ModuleOP.backward.0"]
    assert bwd["input"][0]["Mean"] == 1.0                   # d(sum)/d(out)


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_module_and_api_levels_record_nothing_inside_the_module(dump_root, level):
    _, _, _, data = _example(dump_root, level)
    inside = [k for k in data if "linear_" in k and "parameters_grad" not in k or k.startswith("Functional.")]
    assert inside == []
    assert "Module.MyModuleOP.ModuleOP.forward.0" in data and "Module.MyModuleOP.ModuleOP.backward.0" in data
    if level == "mix":
        assert "Tensor.sum.0.forward" in data              # recorded again after module_dump_end


def test_numbers_unchanged_and_hooks_removed_on_close(dump_root):
    def grads(with_tool):
        torch.manual_seed(0)
        module = ModuleOP()
        x = torch.randn(10, 8, requires_grad=True)
        dbg = PrecisionDebugger(dump_path=dump_root, level="L1") if with_tool else None
        if dbg:
            dbg.start()
            dbg.module_dump(module, "M")
        module(x).pow(2).sum().backward()
        if dbg:
            dbg.module_dump_end()
            dbg.stop()
            dbg.close()
            assert not module._forward_pre_hooks and not module._forward_hooks
        return [x.grad] + [p.grad for p in module.parameters()]

    for a, b in zip(grads(False), grads(True)):
        assert torch.equal(a, b)


def test_calls_are_numbered_and_only_recorded_inside_start_stop(dump_root):
    module, x = ModuleOP(), torch.randn(3, 8)
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0])
    dbg.module_dump(module, "M")        # before start(): armed, records once the step collects
    module(x)
    dbg.start()
    module(x)
    module(x)
    dbg.stop()
    module(x)
    dbg.module_dump_end()
    dbg.close()
    data = load_dump(os.path.join(dump_root, "step0", "rank"))["data"]
    assert list(data) == ["Module.M.ModuleOP.forward.0", "Module.M.ModuleOP.forward.1"]


def test_bad_arguments_say_what_to_pass(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1")
    dbg.start()
    with pytest.raises(TypeError, match="expects torch.nn.Module"):
        dbg.module_dump(lambda x: x, "f")
    with pytest.raises(TypeError, match="dump_name must be a non-empty string"):
        dbg.module_dump(ModuleOP(), "")
    dbg.close()
    with pytest.raises(RuntimeError, match="needs a PrecisionDebugger"):
        ts_core.module_dump(ModuleOP(), "M")


@require("msprobe")
def test_l1_keys_match_msprobe(tmp_path):
    root = run_msprobe({"task": "statistics", "rank": [], "step": [], "level": "L1"},
                       "from tests.core.test_module_dump import ModuleOP\n"
                       "torch.manual_seed(0); module = ModuleOP(); x = torch.randn(10, 8)\n"
                       "d.start(); y = torch.sigmoid(x)\n"
                       "module_dump(module, 'MyModuleOP'); out = module(y); module_dump_end()\n"
                       "out.sum().backward(); d.stop(); d.step()\n", tmp_path)
    theirs = msprobe_json(root)["data"]
    _, _, _, ours = _example(str(tmp_path / "ours"), "L1")
    assert list(theirs) == list(ours)
    for key in theirs:
        t_out = [s for s in theirs[key].get("output", []) if isinstance(s, dict)]
        o_out = [s for s in ours[key].get("output", []) if isinstance(s, dict)]
        assert [s["shape"] for s in t_out] == [s["shape"] for s in o_out]
        assert [s["Max"] for s in t_out] == pytest.approx([s["Max"] for s in o_out])
