"""Backward records equal torch.autograd results computed independently, without the tool."""
import os

import numpy as np
import pytest
import torch

from ts_core import PrecisionDebugger

from ..conftest import load_dump, load_json
from .models import MLP


def _npy(rank_dir, summary):
    return np.load(os.path.join(rank_dir, "dump_tensor_data", summary["data_name"]))


def _l0_tensor_dump(dump_root, model, run):
    """`run()` with an L0 tensor-mode debugger on `model`; returns (its result, rank dir, records)."""
    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="L0", step=[0])
    dbg.start(model)
    result = run()
    dbg.stop()
    dbg.close()
    rank_dir = os.path.join(dump_root, "step0", "rank")
    return result, rank_dir, load_dump(rank_dir)["data"]


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
    _, rank_dir, data = _l0_tensor_dump(dump_root, model, lambda: model(x).sum().backward())
    rec = data["Module.0.Linear.backward.0"]
    assert rec["output"] == []                  # no gradient w.r.t. the data batch
    np.testing.assert_array_equal(_npy(rank_dir, rec["input"][0]), ref_h_grad.numpy())


class RMSNorm(torch.nn.Module):
    """Uses its input three times (x * rsqrt(mean(x * x))), as Llama's RMSNorm does."""

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)


class Residual(torch.nn.Module):
    """x + norm(x): the norm's input is also used outside the norm, after it."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(333, 333)
        self.norm = RMSNorm()

    def forward(self, x):
        h = self.inp(x)
        return (h + self.norm(h) * 3.0).sin()


def _residual_case():
    torch.manual_seed(3)
    return Residual(), torch.randn(64, 333)


def _grads(model, x):
    model.zero_grad()
    model(x).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_input_used_inside_and_outside_a_module_keeps_its_gradient_bits(dump_root):
    """An identity node at the norm's input would sum its three contributions apart from the
    residual's ((r + a) + b) + c -> r + ((a + b) + c): other last bits (the defect of issue 13)."""
    model, x = _residual_case()
    ref = _grads(model, x)
    for level in ("L0", "mix"):
        dbg = PrecisionDebugger(dump_path=os.path.join(dump_root, level), task="statistics", level=level, step=[0])
        dbg.start(model)
        got = _grads(model, x)
        dbg.stop()
        dbg.close()
        assert all(torch.equal(a, b) for a, b in zip(got, ref)), level


def test_backward_record_of_a_shared_input_is_the_modules_own_share(dump_root):
    model, x = _residual_case()
    # Independent reference: the norm gets its own leaf copy of h, so autograd sums the norm's
    # share of the gradient on that leaf alone.
    h = model.inp(x).detach()
    h_norm = h.clone().requires_grad_()
    out = model.norm(h_norm)
    g_out, g_norm_share = torch.autograd.grad((h + out * 3.0).sin().sum(), [out, h_norm])

    _, rank_dir, data = _l0_tensor_dump(dump_root, model, lambda: model(x).sum().backward())
    rec = data["Module.norm.RMSNorm.backward.0"]
    np.testing.assert_array_equal(_npy(rank_dir, rec["input"][0]), g_out.numpy())
    np.testing.assert_array_equal(_npy(rank_dir, rec["output"][0]), g_norm_share.numpy())


def test_leaf_input_used_twice_and_a_module_returning_its_input(dump_root):
    torch.manual_seed(4)
    x = torch.randn(3, 5, requires_grad=True)
    model = torch.nn.Sequential(RMSNorm(), torch.nn.Identity())
    y = RMSNorm()(x)
    g_y, g_x = torch.autograd.grad(y.pow(3).sum(), [y, x])

    (got_x,), rank_dir, data = _l0_tensor_dump(dump_root, model,
                                               lambda: torch.autograd.grad(model(x).pow(3).sum(), [x]))
    assert torch.equal(got_x, g_x)
    norm = data["Module.0.RMSNorm.backward.0"]
    np.testing.assert_array_equal(_npy(rank_dir, norm["output"][0]), g_x.numpy())      # x is a leaf
    ident = data["Module.1.Identity.backward.0"]                                      # no node of its own
    np.testing.assert_array_equal(_npy(rank_dir, ident["input"][0]), g_y.numpy())
    np.testing.assert_array_equal(_npy(rank_dir, ident["output"][0]), g_y.numpy())


def test_backward_restricted_to_some_inputs_still_completes_records(dump_root):
    """autograd.grad w.r.t. one weight skips the nodes that lead elsewhere: a record whose
    input's consumers do not all run is completed when the backward pass ends."""
    torch.manual_seed(5)

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x) * self.b(x)

    model = torch.nn.Sequential(Two())
    x = torch.randn(2, 4, requires_grad=True)
    out = model(x)
    ref_out, ref_w = torch.autograd.grad(out.sum(), [out, model[0].a.weight])
    (got,), rank_dir, data = _l0_tensor_dump(dump_root, model,
                                             lambda: torch.autograd.grad(model(x).sum(), [model[0].a.weight]))
    assert torch.equal(got, ref_w)
    assert "Module.0.a.Linear.backward.0" in data
    assert "Module.0.b.Linear.backward.0" not in data        # no gradient reached b
    two = data["Module.0.Two.backward.0"]                     # b's node never ran: completed at the end
    np.testing.assert_array_equal(_npy(rank_dir, two["input"][0]), ref_out.numpy())
    assert two["output"] == [None]                            # x's gradient was not computed


def test_parameter_returned_or_saved_as_is_gets_records_and_keeps_no_hook(dump_root):
    """A hook on a parameter would outlive the step (and pile up, one per step); hooks on
    leaves are released at the next step and at close()."""
    from ..torch_state import hooks_on

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3))
            self.same = torch.nn.Identity()

        def forward(self, x):
            return x * self.same(self.w)

    torch.manual_seed(6)
    model, x = Scale(), torch.randn(4, 3)
    for level in ("mix", "debug"):
        root = os.path.join(dump_root, level)
        dbg = PrecisionDebugger(dump_path=root, task="tensor", level=level, step=[0, 1])
        for _ in range(2):
            dbg.start(model)
            if level == "debug":
                dbg.save(model.w, "w")
            model.zero_grad()
            model(x).sum().backward()
            dbg.stop()
            assert len([h for h in hooks_on(model) if h[0] == "w"]) == 1   # this step's only, released at the next
            dbg.step()
        dbg.close()
        assert hooks_on(model) == []
        rank_dir = os.path.join(root, "step1", "rank")
        data = load_dump(rank_dir)["data"]
        if level == "debug":
            grads = [k for k in data if k.startswith("w_grad.")]
            assert len(grads) == 1                  # not one more per earlier step's hook
            rec = data[grads[0]]
        else:
            rec = data["Module.same.Identity.backward.0"]["output"][0]
        np.testing.assert_array_equal(_npy(rank_dir, rec), x.sum(0).numpy())


class Poly(torch.nn.Module):
    """Uses its input four times in three nodes (x*x, then *x, then +x): four contributions to
    one gradient, summed by the record in the order autograd sums them."""

    def forward(self, x):
        return x * x * x + x


class Scale(torch.nn.Module):
    """One node (one mul): its output's gradient is read where its input's contribution is."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(333))

    def forward(self, x):
        return x * self.w


class Nest(torch.nn.Module):
    """Modules nested two deep, whose inputs are also used outside them (a residual)."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(333, 333)
        self.inner = torch.nn.Sequential(Poly(), Scale())

    def forward(self, x):
        h = self.inp(x)
        return (self.inner(h) * 0.25 + h).sin()


def test_nested_modules_input_gradients_equal_autograd_of_their_own_share(dump_root):
    torch.manual_seed(7)
    model, x = Nest(), torch.randn(16, 333)
    ref = _grads(model, x)
    # Independent reference: the inner modules get their own leaf copy of h, so autograd sums
    # their share of h's gradient on that leaf alone; the poly output is a leaf for Scale.
    h = model.inp(x).detach()
    h_in = h.clone().requires_grad_()
    p = model.inner[0](h_in)
    p_leaf = p.detach().requires_grad_()
    s = model.inner[1](p_leaf)
    g_s, g_p = torch.autograd.grad((s * 0.25 + h).sin().sum(), [s, p_leaf])
    g_h_in, = torch.autograd.grad(p, [h_in], g_p)

    for level in ("L0", "mix"):
        root = os.path.join(dump_root, level)
        dbg = PrecisionDebugger(dump_path=root, task="tensor", level=level, step=[0])
        dbg.start(model)
        got = _grads(model, x)
        dbg.stop()
        dbg.close()
        assert all(torch.equal(a, b) for a, b in zip(got, ref)), level        # training untouched
        rank_dir = os.path.join(root, "step0", "rank")
        data = load_dump(rank_dir)["data"]
        scale = data["Module.inner.1.Scale.backward.0"]
        np.testing.assert_array_equal(_npy(rank_dir, scale["input"][0]), g_s.numpy())
        np.testing.assert_array_equal(_npy(rank_dir, scale["output"][0]), g_p.numpy())
        poly = data["Module.inner.0.Poly.backward.0"]
        np.testing.assert_array_equal(_npy(rank_dir, poly["input"][0]), g_p.numpy())
        np.testing.assert_array_equal(_npy(rank_dir, poly["output"][0]), g_h_in.numpy())
        seq = data["Module.inner.Sequential.backward.0"]
        np.testing.assert_array_equal(_npy(rank_dir, seq["input"][0]), g_s.numpy())
        np.testing.assert_array_equal(_npy(rank_dir, seq["output"][0]), g_h_in.numpy())
        if level == "mix":          # an API of one node: its output's gradient and its inputs'
            mul = data["Tensor.__mul__.2.backward"]      # x * w, in Scale
            np.testing.assert_array_equal(_npy(rank_dir, mul["input"][0]), g_s.numpy())
            np.testing.assert_array_equal(_npy(rank_dir, mul["output"][0]), g_p.numpy())


class _Doubled(torch.autograd.Function):
    """A custom Function whose backward calls a torch API."""

    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, grad):
        return torch.mul(grad, 2.0)


class Doubled(torch.nn.Module):
    def forward(self, x):
        return _Doubled.apply(x)


def test_apis_called_by_a_custom_function_backward_belong_to_the_modules_backward(dump_root):
    """The module's backward has begun (its output's gradient arrived) before its one node, a
    Python backward, runs: the API calls made there are recorded under the module's backward."""
    model = torch.nn.Sequential(Doubled())
    x = torch.randn(3, 4, requires_grad=True)
    dbg = PrecisionDebugger(dump_path=dump_root, task="statistics", level="mix", step=[0])
    dbg.start(model)
    model(x).sum().backward()
    dbg.stop()
    dbg.close()
    rank_dir = os.path.join(dump_root, "step0", "rank")
    construct = load_json(rank_dir, "construct.json")
    assert construct["Torch.mul.0.forward"] == "Module.0.Doubled.backward.0"
    assert "Module.0.Doubled.backward.0" in load_dump(rank_dir)["data"]


class SparseUses(torch.nn.Module):
    """Its input (a leaf) gets three sparse gradient contributions (embedding, sparse=True)."""

    def forward(self, w):
        idx = torch.tensor([[0, 2], [1, 2]])
        return sum(torch.nn.functional.embedding(idx + j, w, sparse=True) for j in range(3))


def test_sparse_gradient_contributions_are_summed_as_autograd_sums_them(dump_root):
    torch.manual_seed(8)
    model = torch.nn.Sequential(SparseUses())
    w = torch.randn(5, 3, requires_grad=True)
    ref, = torch.autograd.grad(model(w).pow(2).sum(), [w])
    dense = ref.to_dense().double().numpy()
    for task, level in (("structure", "L0"), ("statistics", "L0"), ("statistics", "mix")):
        root = os.path.join(dump_root, task + level)
        dbg = PrecisionDebugger(dump_path=root, task=task, level=level, step=[0])
        dbg.start(model)
        got, = torch.autograd.grad(model(w).pow(2).sum(), [w])
        dbg.stop()
        dbg.close()
        assert got.is_sparse and torch.equal(got.to_dense(), ref.to_dense())
        rec = load_dump(os.path.join(root, "step0", "rank"))["data"]["Module.0.SparseUses.backward.0"]
        out = rec["output"][0]
        assert out is not None and out["shape"] == [5, 3]
        if task == "statistics":        # the dense value's statistics, implicit zeros included
            assert out["Max"] == pytest.approx(dense.max()) and out["Min"] == pytest.approx(dense.min())
            assert out["Mean"] == pytest.approx(dense.mean()) and out["Norm"] == pytest.approx(np.linalg.norm(dense))
