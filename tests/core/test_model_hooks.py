"""The hook owner (ts_core/model_hooks.py): several clients on one model run in the order they
were added, each is removed as a unit, parameter gradients reach them unchanged, and the
end-of-backward event comes once per backward, after the gradients are accumulated."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from ts_core.model_hooks import ModelHook, hooks_of
from ts_core.record.summary import TensorAdapter


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


class Recorder(ModelHook):
    def __init__(self, name: str, calls: list, submodules: bool = False, prepend: bool = False):
        self.name, self.calls, self.submodules, self.prepend = name, calls, submodules, prepend

    def pre_forward(self, ctx, module, args, kwargs):
        self.calls.append((self.name, "pre", ctx))

    def post_forward(self, ctx, module, args, kwargs, output):
        self.calls.append((self.name, "post", ctx))


def _hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def test_clients_run_in_the_order_they_were_added_and_prepend_goes_first():
    model, calls = _net(), []
    owner = hooks_of(model)
    owner.add(Recorder("a", calls))
    owner.add(Recorder("b", calls))
    owner.add(Recorder("first", calls, prepend=True))
    model(torch.randn(2, 3))
    assert calls == [("first", "pre", ""), ("a", "pre", ""), ("b", "pre", ""),
                     ("a", "post", ""), ("b", "post", ""), ("first", "post", "")]


def test_a_submodule_client_gets_each_module_with_its_context():
    model, calls = _net(), []
    hooks_of(model).add(Recorder("dump", calls, submodules=True))
    model(torch.randn(2, 3))
    assert calls == [("dump", "pre", "0"), ("dump", "post", "0"), ("dump", "pre", "1"), ("dump", "post", "1"),
                     ("dump", "pre", "2"), ("dump", "post", "2")]


def test_each_client_is_removed_as_a_unit_and_the_others_stay():
    model, calls = _net(), []
    owner = hooks_of(model)
    assert hooks_of(model) is owner
    keep = owner.add(Recorder("keep", calls))
    drop = owner.add(Recorder("drop", calls, submodules=True))
    assert _hook_count(model) == 2 + 2 * 3
    drop.remove()
    assert _hook_count(model) == 2
    model(torch.randn(2, 3))
    assert [c[0] for c in calls] == ["keep", "keep"]
    keep.remove()
    assert _hook_count(model) == 0


def test_a_client_that_holds_its_model_never_keeps_it_alive():
    import gc
    import weakref

    class Holder(Recorder):
        def __init__(self, model):
            super().__init__("holder", [])
            self.model = model

    model = _net()
    hooks_of(model).add(Holder(model))
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_parameter_gradients_reach_the_client_as_autograd_accumulates_them():
    model = _net()
    seen = {}

    class Grads(ModelHook):
        submodules = True

        def param_grad(self, ctx, name, grad):
            seen[f"{ctx}.{name}"] = grad.clone()

    handle = hooks_of(model).add(Grads())
    x = torch.randn(5, 3)
    model(x).square().sum().backward()
    handle.remove()
    want = dict(model.named_parameters())
    assert sorted(seen) == sorted(want)
    for name, p in want.items():
        assert torch.equal(seen[name], p.grad)


def test_backward_end_comes_once_per_backward_after_every_gradient_is_accumulated():
    model = _net()
    owner = hooks_of(model)
    grads_at_end = []
    watch = owner.backward_end(lambda: grads_at_end.append([p.grad.clone() for p in model.parameters()]))
    x = torch.randn(4, 3)

    def loss_of(out):
        return out.sum() + out.square().sum()

    want = torch.autograd.grad(loss_of(model(x)), list(model.parameters()))      # independent: autograd
    out = model(x)
    assert watch.watch((out, {"aux": out * 2}))          # two watched tensors, one backward
    loss_of(out).backward()
    assert len(grads_at_end) == 1                        # .grad was complete when it came
    for got, w in zip(grads_at_end[0], want):
        assert torch.equal(got, w)
    out2 = model(torch.randn(4, 3))
    watch.watch(out2)
    out2.sum().backward()
    assert len(grads_at_end) == 2                        # the next backward fires again
    assert not watch.watch(out2.detach())                # nothing to watch: no gradient comes


def test_an_incomplete_tensor_adapter_fails_when_made_naming_what_it_lacks():
    class Half(TensorAdapter):
        framework = "pytorch"

        def is_tensor(self, value):
            return False

    with pytest.raises(TypeError, match=r"Half is not a complete TensorAdapter.*lacks .*crc32.*stats"):
        Half()

    class Nameless(TensorAdapter):
        pass

    with pytest.raises(TypeError, match="framework"):
        Nameless()
