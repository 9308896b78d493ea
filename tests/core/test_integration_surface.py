"""What integrations may ask a debugger (current(), is_hooked(), set_step()), the backend
contract the debugger relies on, and that hooking a model never keeps it alive."""
import gc
import inspect
import os
import re
import weakref

import pytest
import torch

from ts_core import ConfigError, PrecisionDebugger
from ts_core import debugger as debugger_module
from ts_core.backends.base import Backend
from ts_core.backends.torch import TorchBackend

from ..conftest import load_dump
from .models import MLP


def test_one_debugger_per_process_as_msprobe(dump_root):
    """msprobe's singleton: the same arguments give the open debugger back; other arguments
    replace it, saying so, and the replaced one's calls say why they fail."""
    first = PrecisionDebugger(dump_path=dump_root, step=[0])
    assert PrecisionDebugger.current() is first
    assert PrecisionDebugger(dump_path=dump_root, step=[0]) is first
    assert PrecisionDebugger(None, None, dump_root, None, [0]) is first
    assert not first._closed
    with pytest.warns(UserWarning, match=r"test_integration_surface.py:\d+\) replaces the open one"):
        second = PrecisionDebugger(dump_path=dump_root, step=[1])
    assert second is not first and PrecisionDebugger.current() is second
    with pytest.raises(RuntimeError, match="closed when another one was created .*one debugger per process"):
        first.start()
    second.close()
    assert PrecisionDebugger.current() is None
    third = PrecisionDebugger(dump_path=dump_root, step=[1])      # after close(): a new one
    assert third is not second
    third.close()


def test_is_hooked_names_the_hooked_model_only(dump_root):
    model, other = MLP(), MLP()
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[0])
    assert not dbg.is_hooked() and not dbg.is_hooked(model)       # no backend yet
    dbg.start(model)
    assert dbg.is_hooked() and dbg.is_hooked(model)
    assert not dbg.is_hooked(other)
    dbg.stop()
    dbg.close()
    assert not dbg.is_hooked() and not dbg.is_hooked(model)
    assert not model.fc1._forward_pre_hooks


def test_is_hooked_is_false_where_the_level_hooks_no_module(dump_root):
    model = MLP()
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0])
    dbg.start(model)
    model(torch.randn(2, 6))
    dbg.stop()
    assert not dbg.is_hooked(model) and not dbg.is_hooked()
    dbg.close()


def test_set_step_numbers_the_folder(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[4])
    dbg.set_step(4)
    assert dbg.current_step == 4
    dbg.start()
    torch.ones(2).mul(3)
    dbg.step()
    dbg.close()
    assert sorted(os.listdir(dump_root)) == ["step4"]
    assert "Tensor.mul.0.forward" in load_dump(os.path.join(dump_root, "step4", "rank"))["data"]


@pytest.mark.parametrize("bad", [-1, 1.0, True, "3", None])
def test_set_step_rejects_what_is_not_a_step_number(dump_root, bad):
    dbg = PrecisionDebugger(dump_path=dump_root, step=[0])
    dbg.set_step(2)
    with pytest.raises(ValueError) as err:
        dbg.set_step(bad)
    assert "set_step" in str(err.value) and repr(bad) in str(err.value) and "non-negative int" in str(err.value)
    assert dbg.current_step == 2                       # unchanged
    with pytest.raises(ConfigError, match="init_step"):
        dbg.set_init_step(bad)
    dbg.close()


def test_backend_contract_is_abstract_and_complete():
    with pytest.raises(TypeError, match="abstract"):
        Backend(None, None, None)      # the base alone cannot be built
    assert not TorchBackend.__abstractmethods__
    # the debugger calls only what the base declares, and never probes for optional methods
    source = inspect.getsource(debugger_module)
    called = set(re.findall(r"_backend\.(\w+)", source))
    assert {"install", "close", "capture_param_grads", "needs_model", "is_hooked"} <= called
    assert all(name in dir(Backend) for name in called), called - set(dir(Backend))
    assert "getattr(self._backend" not in source


def _train_step(model):
    model(torch.randn(4, 6)).sum().backward()


def test_hooked_model_is_freed_once_dropped_while_the_debugger_is_open(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0, 1])
    model = MLP()
    ref = weakref.ref(model)
    dbg.start(model)
    _train_step(model)
    dbg.stop()
    assert dbg.is_hooked(model)
    del model
    gc.collect()
    assert ref() is None                # the debugger's hooks did not keep it alive
    assert not dbg.is_hooked()
    dbg.record_param_grads()            # nothing left to read: no error
    dbg.step()
    # the debugger goes on with a new model
    fresh = MLP()
    dbg.start(fresh)
    _train_step(fresh)
    dbg.step()
    dbg.close()
    data = load_dump(os.path.join(dump_root, "step1", "rank"))["data"]
    assert "Module.fc1.Linear.forward.0" in data and "Module.fc1.Linear.parameters_grad.0" in data


def test_hooked_model_is_freed_after_close(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[0])
    model = MLP()
    ref = weakref.ref(model)
    dbg.start(model)
    _train_step(model)
    dbg.close()
    del model
    gc.collect()
    assert ref() is None


def test_record_param_grads_rereads_changed_gradients_and_keeps_unchanged_ones(tmp_path):
    """After backward, record_param_grads() takes .grad again: a gradient changed in place since
    (an unscale, an all-reduce) is recorded with its new values; an unchanged one as it was."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0", step=[0])
    dbg.start(model)
    model(torch.randn(5, 4)).sum().backward()
    first = model[0].weight.grad.clone()
    model[0].weight.grad.mul_(0.5)                # changed in place after the hook saw it
    dbg.record_param_grads()
    dbg.stop()
    dbg.close()
    data = load_dump(str(tmp_path / "step0" / "rank"))["data"]
    w0 = data["Module.0.Linear.parameters_grad.0"]["weight"][0]
    assert w0["Max"] == pytest.approx(float((first * 0.5).max()))
    w1 = data["Module.1.Linear.parameters_grad.0"]["weight"][0]
    assert w1["Max"] == pytest.approx(float(model[1].weight.grad.max()))
