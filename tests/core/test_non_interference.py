"""Loss and gradients are bit-identical with the tool on and off, and close() undoes everything."""
import pytest
import torch

from ts_core import PrecisionDebugger

from ..conftest import require
from ..torch_state import hook_count as _hooks, surface_changes, torch_surface as _torch_surface
from .models import make, train_steps

CASES = [("mlp", "L0", "statistics"), ("mlp", "L1", "tensor"), ("cnn", "mix", "statistics"),
         ("cnn", "L1", "statistics"), ("cnn", "mix", "tensor"), ("cnn", "L0", "tensor"),
         pytest.param("gpt2", "mix", "statistics", marks=require("transformers")),
         pytest.param("gpt2", "L1", "tensor", marks=require("transformers"))]


@pytest.mark.parametrize("name,level,task", CASES)
def test_bit_identical_loss_and_grads(dump_root, name, level, task):
    ref_losses, ref_grads = train_steps(name, None, steps=2)
    dbg = PrecisionDebugger(dump_path=dump_root, task=task, level=level, step=[0, 1])
    _check_identical(dbg, name, ref_losses, ref_grads)


def test_bit_identical_with_md5(dump_root):
    ref_losses, ref_grads = train_steps("cnn", None, steps=2)
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0, 1], summary_mode="md5")
    _check_identical(dbg, "cnn", ref_losses, ref_grads)


def _check_identical(dbg, name, ref_losses, ref_grads):
    losses, grads = train_steps(name, dbg, steps=2)
    dbg.close()
    for a, b in zip(losses, ref_losses):
        assert torch.equal(a, b)
    assert grads.keys() == ref_grads.keys()
    for k in grads:
        assert torch.equal(grads[k], ref_grads[k]), k


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_close_restores_every_function_and_removes_every_hook(dump_root, level):
    before = _torch_surface()
    model, x = make("cnn")
    dbg = PrecisionDebugger(dump_path=dump_root, level=level, step=[0])
    dbg.start(model)
    assert _torch_surface() != before or level == "L0"
    assert _hooks(model) > 0 or level == "L1"
    model(x).sum().backward()
    dbg.stop()
    dbg.close()
    assert surface_changes(before, _torch_surface()) == []
    assert _hooks(model) == 0


def test_hooks_are_released_after_the_last_configured_step(dump_root):
    before = _torch_surface()
    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0])
    for _ in range(2):
        dbg.start(model)
        model(x).sum().backward()
        dbg.stop()
        dbg.step()
    assert _hooks(model) == 0
    assert all(before[k] is v for k, v in _torch_surface().items() if k in before and k[0] != "global")


def test_context_manager_closes(dump_root):
    before = _torch_surface()
    linear = torch.nn.functional.linear
    model, x = make("mlp")
    with PrecisionDebugger(dump_path=dump_root, level="mix", step=[0]) as dbg:
        dbg.start(model)
        assert torch.nn.functional.linear is not linear       # patched while collecting
        model(x).sum().backward()
        dbg.stop()
    assert _hooks(model) == 0
    assert torch.nn.functional.linear is linear
    assert all(before[k] is v for k, v in _torch_surface().items() if k in before)
