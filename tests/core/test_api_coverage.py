"""API calls that reach torch by other roads than the patched names are still recorded:
nn.LSTM/GRU call torch._VF directly; a module may hold an API function it took before the
patch (transformers' GELUActivation). Values are checked against autograd run without the tool."""
import os

import numpy as np
import pytest
import torch

from ts_core import PrecisionDebugger

from ..conftest import load_dump, load_json, require


def _npy(rank_dir, summary):
    return np.load(os.path.join(rank_dir, "dump_tensor_data", summary["data_name"]))


def _mix_dump(dump_root, model, run):
    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="mix", step=[0])
    dbg.start(model)
    run()
    dbg.stop()
    dbg.close()
    rank_dir = os.path.join(dump_root, "step0", "rank")
    return rank_dir, load_dump(rank_dir)["data"], load_json(rank_dir, "construct.json")


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_layers_record_their_vf_call_with_autograd_values(dump_root, kind):
    torch.manual_seed(0)
    rnn = getattr(torch.nn, kind)(4, 3, batch_first=True)
    model = torch.nn.Sequential(rnn)
    x = torch.randn(2, 5, 4, requires_grad=True)
    weights = list(rnn._flat_weights)

    # Reference without the tool: the output, d(loss)/d(output) and d(loss)/d(x, weights).
    ref_out = rnn(x)[0]
    g_out = torch.full_like(ref_out, 2.0)
    ref_grads = torch.autograd.grad((ref_out * 2.0).sum(), [x] + weights)

    def run():
        out = rnn(x)[0]
        (out * 2.0).sum().backward()
    rank_dir, data, construct = _mix_dump(dump_root, model, run)

    name = kind.lower()
    fwd = data[f"VF.{name}.0.forward"]
    np.testing.assert_array_equal(_npy(rank_dir, fwd["input_args"][0]), x.detach().numpy())
    np.testing.assert_array_equal(_npy(rank_dir, fwd["output"][0]), ref_out.detach().numpy())
    bwd = data[f"VF.{name}.0.backward"]
    np.testing.assert_array_equal(_npy(rank_dir, bwd["input"][0]), g_out.numpy())
    got = [_npy(rank_dir, s) for s in bwd["output"]]
    assert len(got) == len(ref_grads)
    for g, ref in zip(got, ref_grads):
        np.testing.assert_array_equal(g, ref.numpy())
    # The call belongs to its module, forward and backward.
    assert construct[f"VF.{name}.0.forward"] == f"Module.0.{kind}.forward.0"
    assert construct[f"VF.{name}.0.backward"] == f"Module.0.{kind}.backward.0"


def test_vf_is_restored_after_close(dump_root):
    orig = torch._VF.lstm
    dbg = PrecisionDebugger(dump_path=dump_root, task="statistics", level="L1", step=[0])
    dbg.start(torch.nn.LSTM(2, 2))
    assert torch._VF.lstm is not orig
    dbg.stop()
    dbg.close()
    assert torch._VF.lstm is orig


class _HoldsFunction(torch.nn.Module):
    """Takes the functions before the tool patches them, as transformers' activations do."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.act = torch.nn.functional.gelu
        self.soft = __import__("functools").partial(torch.nn.functional.softmax, dim=-1)

    def forward(self, x):
        return self.soft(self.act(self.fc(x)))


def test_api_function_held_by_a_module_is_recorded_and_put_back(dump_root):
    torch.manual_seed(0)
    model = _HoldsFunction()
    orig_act, orig_soft = model.act, model.soft
    x = torch.randn(3, 4)
    h = model.fc(x)
    ref_gelu = torch.nn.functional.gelu(h)
    ref_out = torch.softmax(ref_gelu, dim=-1)

    out_box = []
    rank_dir, data, construct = _mix_dump(dump_root, model, lambda: out_box.append(model(x)))

    torch.testing.assert_close(out_box[0], ref_out, rtol=0, atol=0)
    gelu = data["Functional.gelu.0.forward"]
    np.testing.assert_array_equal(_npy(rank_dir, gelu["output"][0]), ref_gelu.detach().numpy())
    soft = data["Functional.softmax.0.forward"]
    assert soft["input_kwargs"]["dim"]["value"] == -1
    np.testing.assert_array_equal(_npy(rank_dir, soft["output"][0]), ref_out.detach().numpy())
    # After close the module holds its own functions again.
    assert model.act is orig_act and model.soft.func is orig_soft.func and model.soft is orig_soft


@require("transformers")
def test_transformers_gelu_activation_is_recorded_under_its_module(dump_root):
    from transformers.activations import GELUActivation

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), GELUActivation())
    x = torch.randn(3, 4, requires_grad=True)
    ref = model(x)
    ref_gx, = torch.autograd.grad(ref.sum(), [x])
    x.grad = None

    def run():
        model(x).sum().backward()
    rank_dir, data, construct = _mix_dump(dump_root, model, run)

    np.testing.assert_array_equal(_npy(rank_dir, data["Functional.gelu.0.forward"]["output"][0]),
                                  ref.detach().numpy())
    assert construct["Functional.gelu.0.forward"] == "Module.1.GELUActivation.forward.0"
    assert construct["Functional.gelu.0.backward"] == "Module.1.GELUActivation.backward.0"
    np.testing.assert_array_equal(x.grad.numpy(), ref_gx.numpy())
    assert model[1].act is torch.nn.functional.gelu
