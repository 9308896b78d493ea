"""The first-divergence rules of docs/compare.md on real torch models dumped twice (issue 12).

Each test builds a small model, dumps a golden and a target run (forward, backward and an
optimizer step inside the dumped step) and checks where compare names the bug, or that a
clean pair (no-op calls, other decompositions) raises nothing.
"""
import json

import numpy as np

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ts_core import PrecisionDebugger  # noqa: E402
from ts_core.compare import compare  # noqa: E402


class Gate(torch.autograd.Function):
    """tanh with a hand-written backward; ``wrong`` uses 1 - y instead of 1 - y*y."""

    @staticmethod
    def forward(ctx, x, wrong):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        ctx.wrong = wrong
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        d = 1 - y if ctx.wrong else 1 - y * y
        return g * d, None


class GateModule(nn.Module):
    def __init__(self, wrong=False):
        super().__init__()
        self.wrong = wrong

    def forward(self, x):
        return Gate.apply(x, self.wrong)


class Net(nn.Module):
    """ln -> fc1 -> act -> gate -> fc2, plus a residual; ``variant`` changes one thing."""

    def __init__(self, variant=None):
        super().__init__()
        self.ln = nn.LayerNorm(16)                  # default affine: weight 1, bias 0
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)
        self.gate = GateModule(variant == "wrong_backward")
        self.variant = variant

    def forward(self, x):
        v = self.variant
        h = self.ln(x)
        if v == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = self.fc1(h)
        else:
            h = self.fc1(h)
        h = h.float()
        if v == "noop":
            h = h.contiguous().view(h.shape).clone().float() * 1.0
        h = h * torch.sigmoid(h) if v == "decomp" else F.silu(h)
        h = self.fc2(self.gate(h))
        d = self.b(x) - self.a(x) if v == "swapped" else self.a(x) - self.b(x)
        out = h + d
        return out * out if v == "decomp" else out.pow(2)


def build(variant=None):
    torch.manual_seed(0)
    model = Net(variant)
    if variant == "cancelled_row":
        with torch.no_grad():
            model.fc1.weight[3] += 0.5             # + c * sum(LayerNorm output) = + 0
    if variant == "grad_hook":
        # scales the gradient with an op the dump does not wrap (torch._foreach_mul), as a fused
        # gradient clipping would: no recorded call computes the difference
        model.fc2.weight.register_hook(lambda g: torch._foreach_mul([g], 1.01)[0])
    return model, torch.randn(8, 16)


class LoopOptimizer:
    """AdamW or SGD with momentum as torch's per-parameter (for-loop) implementation computes
    them, written here: a user's optimizer, whose tensor calls the dump records (torch's own
    optimizers are machinery it does not record, ``backends/callers.py``)."""

    def __init__(self, params, kind, lr):
        self.params, self.kind, self.lr = list(params), kind, lr
        self.state = [None] * len(self.params)
        self.t = 0

    @torch.no_grad()
    def step(self):
        self.t += 1
        for i, p in enumerate(self.params):
            g = p.grad
            if self.kind == "sgd":
                buf = self.state[i]
                buf = self.state[i] = g.clone() if buf is None else buf.mul_(0.9).add_(g)
                p.add_(buf, alpha=-self.lr)
                continue
            if self.state[i] is None:
                self.state[i] = (torch.zeros_like(p), torch.zeros_like(p))
            m, v = self.state[i]
            p.mul_(1 - self.lr * 1e-2)
            m.lerp_(g, 0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            denom = (v.sqrt() / (1 - 0.999 ** self.t) ** 0.5).add_(1e-8)
            p.addcdiv_(m, denom, value=-self.lr / (1 - 0.9 ** self.t))

    def zero_grad(self):
        for p in self.params:
            p.grad = None


def run(model, x, path, level, task="tensor", optimizer="adamw"):
    opt = LoopOptimizer(model.parameters(), optimizer, 1e-3 if optimizer == "adamw" else 0.1)
    dbg = PrecisionDebugger(dump_path=str(path), task=task, level=level, step=[0])
    dbg.start(model)
    model(x).mean().backward()
    opt.step()
    opt.zero_grad()
    dbg.stop()
    dbg.step()
    dbg.close()
    return path


def pair(tmp_path, variant, level="mix", task="tensor", optimizer="adamw"):
    g = run(*build(), tmp_path / "g", level, task, optimizer)
    t = run(*build(variant), tmp_path / "t", level, task, optimizer)
    return compare(g, t, verbose=False)


def _row(result, golden_key, arg):
    return next(r for r in result.rows if r.golden_key == golden_key and r.arg == arg)


def test_cancelled_weight_row_really_cancels():
    """Independent check of the premise: the changed row does not change the model's output."""
    m0, x = build()
    m1, _ = build("cancelled_row")
    assert not torch.equal(m0.fc1.weight, m1.fc1.weight)
    with torch.no_grad():
        torch.testing.assert_close(m0.fc1(m0.ln(x)), m1.fc1(m1.ln(x)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_differing_parameter_is_named_at_its_module_even_when_outputs_agree(tmp_path, task):
    r = pair(tmp_path, "cancelled_row", "mix", task)
    fd = r.first_divergence
    assert (fd.key, fd.direction) == ("Functional.linear.0.forward", "forward")
    assert fd.module == "Module.fc1.Linear.forward.0"
    assert "the parameter weight of Module.fc1.Linear.forward.0" in fd.cause
    assert fd.tensor == "Functional.linear.0.forward.input.1"
    assert _row(r, "Functional.linear.0.forward", "output.0").verdict == "pass"   # the outputs agree


@pytest.mark.parametrize("level,key", [("L0", "Module.fc1.Linear.forward.0"), ("L1", "Functional.linear.0.forward")])
def test_differing_parameter_at_module_and_api_levels(tmp_path, level, key):
    fd = pair(tmp_path, "cancelled_row", level).first_divergence
    assert fd.key == key and fd.direction == "forward"
    assert ("parameters.weight (a parameter)" if level == "L0" else "input.1") in fd.cause


def test_an_optimizer_op_is_never_named_for_a_model_parameter(tmp_path):
    r = pair(tmp_path, "cancelled_row", "L1")
    optimizer_rows = [row for row in r.rows if row.golden_key and row.golden_key.startswith(("Tensor.lerp_",
                                                                                            "Tensor.mul_"))]
    assert optimizer_rows and any(row.verdict != "pass" for row in optimizer_rows)     # AdamW sees it too
    assert r.first_divergence.key == "Functional.linear.0.forward"


def test_a_differing_gradient_read_by_the_optimizer_is_named_at_its_parameter(tmp_path):
    """A gradient hook scales fc2's weight gradient after every recorded backward call, with an
    op the dump does not record: the optimizer reads a differing gradient; compare names the
    parameter's gradient, not SGD."""
    r = pair(tmp_path, "grad_hook", "mix", optimizer="sgd")
    fd = r.first_divergence
    assert fd.key == "Module.fc2.Linear.parameters_grad.0"
    assert "computed by something the dump does not record" in fd.cause
    assert all(row.verdict == "pass" for row in r.rows if row.direction == "backward"
               and not row.golden_key.endswith("parameters_grad.0"))


@pytest.mark.parametrize("level", ["mix", "L1"])
def test_calls_inside_a_custom_backward_belong_to_that_modules_backward(tmp_path, level):
    r = pair(tmp_path, "wrong_backward", level)
    fd = r.first_divergence
    assert fd.key.startswith("Tensor.__") and fd.direction == "forward"      # an op run during backward
    assert "in backward" in fd.source
    if level == "mix":
        assert fd.module == "Module.gate.GateModule.backward.0"
    model_forward = [row for row in r.rows if row.direction == "forward" and row.golden_key
                     and row.golden_key.startswith(("Functional.", "Module.")) and "backward" not in row.golden_key]
    assert model_forward and all(row.verdict == "pass" for row in model_forward)


def test_construct_json_gives_backward_ops_their_module(tmp_path):
    path = run(*build("wrong_backward"), tmp_path / "d", "mix")
    with open(path / "step0" / "rank" / "construct.json") as f:
        construct = json.load(f)
    inside = {k: v for k, v in construct.items() if v == "Module.gate.GateModule.backward.0"}
    assert {k.split(".")[1] for k in inside} >= {"__rsub__", "__mul__"}
    assert construct["Tensor.__rsub__.0.forward"] == "Module.gate.GateModule.backward.0"
    # the forward calls outside any module keep no parent; optimizer ops after backward too
    assert construct["Tensor.float.0.forward"] is None
    assert all(v is None for k, v in construct.items() if k.startswith(("Tensor.lerp_", "Tensor.addcdiv_")))


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_precision_lost_in_one_op_is_named_there_not_at_the_up_cast(tmp_path, task):
    r = pair(tmp_path, "bf16", "mix", task)
    fd = r.first_divergence
    assert (fd.key, fd.module) == ("Functional.linear.0.forward", "Module.fc1.Linear.forward.0")
    row = _row(r, "Functional.linear.0.forward", "output.0")
    assert row.target_dtype == "torch.bfloat16" and row.rtol == 1e-4       # judged as float32
    assert "more precise" in row.reason


class Residual(nn.Module):
    """x + fc(x) on small values, then a LayerNorm; ``bf16``: fc runs under bfloat16 autocast.
    The bf16 result is promoted to float32 by the addition (no recorded cast), the sum still
    agrees within the float32 tolerance (atol dominates at this scale) and only the LayerNorm,
    which scales it to unit size, shows the difference."""

    def __init__(self, bf16: bool):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.norm, self.out = nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 4)
        with torch.no_grad():                    # fc(x) as small as x: no bias
            self.fc.bias.zero_()
        self.bf16 = bf16

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            h = self.fc(x)
        return self.out(self.norm(x + h))


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_precision_lost_upstream_of_an_agreeing_sum_is_named_where_it_was_lost(tmp_path, level):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2)) * 1e-3
    g = run(Residual(False), x, tmp_path / "g", level)
    t = run(Residual(True), x, tmp_path / "t", level)
    r = compare(g, t, verbose=False)
    # the premise, checked on the dump: the sum agrees, the LayerNorm's output does not
    ln = "Module.norm.LayerNorm.forward.0" if level == "L0" else "Functional.layer_norm.0.forward"
    assert not _row(r, ln, "input.0").failed and _row(r, ln, "output.0").failed
    fd = r.first_divergence
    if level == "L0":
        assert fd.key == "Module.fc.Linear.forward.0"
    else:
        assert fd.key == "Functional.linear.0.forward"
        assert level == "L1" or fd.module == "Module.fc.Linear.forward.0"
    assert "precision is lost here" in fd.cause


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_swapped_operands_are_named_at_the_op_receiving_them(tmp_path, level):
    """b(x) - a(x) for a(x) - b(x): the two Linears also run in the other order, and pair by
    what they consume (their weights), not by their call counters."""
    r = pair(tmp_path, "swapped", level)
    fd = r.first_divergence
    assert fd.key == "Tensor.__sub__.0.forward"
    assert "wired differently" in fd.cause
    linears = {(x.golden_key, x.target_key) for x in r.rows if x.golden_key and x.golden_key.startswith("Functional.linear")}
    assert {("Functional.linear.2.forward", "Functional.linear.3.forward"),
            ("Functional.linear.3.forward", "Functional.linear.2.forward")} <= linears


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("variant", ["noop", "decomp"])
def test_no_op_calls_and_other_decompositions_raise_nothing(tmp_path, variant, level):
    r = pair(tmp_path, variant, level)
    assert r.first_divergence is None, r.first_divergence
    assert r.verdict == "pass", [(x.golden_key, x.target_key, x.arg, x.reason) for x in r.rows if x.verdict != "pass"]
    if variant == "noop":                                     # the extra calls are shown, as harmless
        one_sided = [x for x in r.rows if x.golden_key is None]
        assert one_sided and all("lossless" in x.reason for x in one_sided)
    else:                                                     # silu <-> x * sigmoid(x): one group
        groups = {(x.golden_key, x.target_key) for x in r.rows if x.target_key and "+" in x.target_key}
        assert ("Functional.silu.0.forward", "Torch.sigmoid.0.forward+Tensor.__mul__.0.forward") in groups


class Scatter(nn.Module):
    """MoE-style routing: a scratch buffer not made by any recorded call (torch.empty_like in
    Mixtral; here numpy, so its prior contents are chosen) is written through ``__setitem__``."""

    def __init__(self, junk: float, rows: slice):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.junk, self.rows = junk, rows

    def forward(self, x):
        buf = torch.from_numpy(np.full((6, 4), self.junk, np.float32))
        y = self.fc(x)
        buf[self.rows] = y[self.rows]
        return buf.sum()


def _scatter_pair(tmp_path, rows):
    paths = []
    for name, junk in (("g", 0.0), ("t", 5.0)):
        torch.manual_seed(0)
        model = Scatter(junk, rows)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / name), task="tensor", level="L1", step=[0])
        dbg.start(model)
        model(torch.randn(6, 4)).backward()
        dbg.stop()
        dbg.step()
        dbg.close()
        paths.append(tmp_path / name)
    return compare(*paths, verbose=False)


def test_a_buffer_wholly_overwritten_in_place_is_no_divergence(tmp_path):
    r = _scatter_pair(tmp_path, slice(None))
    assert r.first_divergence is None, r.first_divergence
    assert _row(r, "Tensor.__setitem__.0.forward", "input.0").failed          # what it held did differ
    assert all(x.verdict == "pass" for x in r.rows if x.role == "output")


def test_a_buffer_partly_overwritten_in_place_is_named_at_the_write(tmp_path):
    r = _scatter_pair(tmp_path, slice(0, 3))                 # rows 3..5 keep what the buffer held
    assert r.first_divergence is not None and r.first_divergence.key == "Tensor.__setitem__.0.forward"
