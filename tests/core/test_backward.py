"""Backward records equal torch.autograd results computed independently, without the tool."""
import os

import numpy as np
import torch

from ts_core import PrecisionDebugger

from ..conftest import load_dump
from .models import MLP


def _npy(rank_dir, summary):
    return np.load(os.path.join(rank_dir, "dump_tensor_data", summary["data_name"]))


def test_module_and_api_backward_equal_autograd(dump_root):
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(5, 6, requires_grad=True)

    # Independent reference: autograd.grad w.r.t. every intermediate activation.
    h1 = model.fc1(x)
    a1 = model.act(h1)
    out = model.fc2(a1)
    loss = out.pow(2).mean()
    g_out, g_a1, g_h1, g_x = torch.autograd.grad(loss, [out, a1, h1, x])
    ref_param_grads = torch.autograd.grad(model.fc2(model.act(model.fc1(x))).pow(2).mean(),
                                          [model.fc1.weight, model.fc2.weight, model.fc2.bias])

    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="mix", step=[0])
    dbg.start(model)
    model(x).pow(2).mean().backward()
    dbg.stop()
    dbg.close()
    rank_dir = os.path.join(dump_root, "step0", "rank")
    data = load_dump(rank_dir)["data"]

    fc2 = data["Module.fc2.Linear.backward.0"]
    np.testing.assert_array_equal(_npy(rank_dir, fc2["input"][0]), g_out.numpy())
    np.testing.assert_array_equal(_npy(rank_dir, fc2["output"][0]), g_a1.numpy())
    act = data["Module.act.ReLU.backward.0"]
    np.testing.assert_array_equal(_npy(rank_dir, act["input"][0]), g_a1.numpy())
    np.testing.assert_array_equal(_npy(rank_dir, act["output"][0]), g_h1.numpy())
    fc1 = data["Module.fc1.Linear.backward.0"]
    np.testing.assert_array_equal(_npy(rank_dir, fc1["output"][0]), g_x.numpy())

    # API level: F.linear's backward output holds grads of (input, weight, bias) in call order.
    lin1 = data["Functional.linear.1.backward"]
    got = [_npy(rank_dir, s) for s in lin1["output"]]
    np.testing.assert_array_equal(got[0], g_a1.numpy())
    np.testing.assert_array_equal(got[1], ref_param_grads[1].numpy())
    np.testing.assert_array_equal(got[2], ref_param_grads[2].numpy())

    pg = data["Module.fc1.Linear.parameters_grad.0"]
    np.testing.assert_array_equal(_npy(rank_dir, pg["weight"][0]), model.fc1.weight.grad.numpy())
    np.testing.assert_array_equal(_npy(rank_dir, pg["weight"][0]), ref_param_grads[0].numpy())


def test_inplace_ops_record_inputs_before_mutation_and_keep_backward(dump_root):
    torch.manual_seed(1)
    w = torch.randn(4, 4, requires_grad=True)
    base = torch.randn(3, 4)
    relu = torch.nn.ReLU(inplace=True)
    seq = torch.nn.Sequential(torch.nn.Linear(4, 4), relu)

    def run():
        h = base @ w
        h.add_(1.0)                 # Tensor.add_ on a non-leaf
        h = torch.relu_(h * 1.0)    # functional in-place
        return seq(h).sum()

    ref_loss = run()
    ref_grad, = torch.autograd.grad(ref_loss, [w])

    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="mix", step=[0])
    dbg.start(seq)
    loss = run()
    grad, = torch.autograd.grad(loss, [w])
    dbg.stop()
    dbg.close()
    assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)

    rank_dir = os.path.join(dump_root, "step0", "rank")
    data = load_dump(rank_dir)["data"]
    h = base @ w.detach()
    add_in = _npy(rank_dir, data["Tensor.add_.0.forward"]["input_args"][0])
    np.testing.assert_array_equal(add_in, h.numpy())               # before +1
    add_out = _npy(rank_dir, data["Tensor.add_.0.forward"]["output"][0])
    np.testing.assert_array_equal(add_out, (h + 1).numpy())
    relu_mod_in = _npy(rank_dir, data["Module.1.ReLU.forward.0"]["input_args"][0])
    assert (relu_mod_in < 0).any()                                  # recorded before ReLU mutated it
    assert "Module.1.ReLU.backward.0" in data
    assert "Tensor.add_.0.backward" in data and "Torch.relu_.0.backward" in data


def test_module_whose_input_needs_no_grad_still_gets_a_backward_record(dump_root):
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(inplace=True), torch.nn.Linear(3, 1))
    x = torch.randn(2, 4)                       # a data batch: no grad
    h = model[0](x)
    ref_h_grad, = torch.autograd.grad(model[2](model[1](h.clone())).sum(), [h])
    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="L0", step=[0])
    dbg.start(model)
    model(x).sum().backward()
    dbg.stop()
    dbg.close()
    rank_dir = os.path.join(dump_root, "step0", "rank")
    rec = load_dump(rank_dir)["data"]["Module.0.Linear.backward.0"]
    assert rec["output"] == []                  # no gradient w.r.t. the data batch
    np.testing.assert_array_equal(_npy(rank_dir, rec["input"][0]), ref_h_grad.numpy())
