"""One AdamWeightDecay step of each MindSpore port (Dense, Conv2d + BatchNorm, LayerNorm +
attention block) at L0 and mix: loss, gradients and updated parameters bit-identical with the
tool on, and every leaf Cell recorded forward and backward. Plus a Cell that uses its input
several times on a residual stream: bit-identical, and its backward record is its own share of
the input's gradient (see docs/dump-format.md)."""
import numpy as np
import pytest

from ts_core import PrecisionDebugger

from ..conftest import load_dump, require
from .lazy import ms, nn, ops

pytestmark = require("mindspore")


def _port(name):
    from .ports import copy_weights, make_input, ms_model, torch_model

    net = ms_model(name)
    copy_weights(torch_model(name), net)
    return net, ms.Tensor(make_input(name))


def _step(net, x, debugger=None):
    """value_and_grad + AdamWeightDecay; returns loss, gradients and updated parameters as bytes."""
    weights = net.trainable_params()
    opt = nn.AdamWeightDecay(weights, learning_rate=1e-3)

    def loss_fn(inp):
        out = net(inp)
        return (out * out).mean()

    grad_fn = ms.value_and_grad(loss_fn, None, weights)
    if debugger is not None:
        debugger.start(net)
    loss, grads = grad_fn(x)
    opt(grads)
    if debugger is not None:
        debugger.stop()
        debugger.step()
    # Every parameter, the BatchNorm moving statistics (written by a Primitive we tap around) too.
    return [loss.asnumpy().tobytes()] + [g.asnumpy().tobytes() for g in grads] + \
        [p.asnumpy().tobytes() for p in net.get_parameters()]


@pytest.mark.parametrize("mode", ["statistics", "md5", "tensor"])
@pytest.mark.parametrize("level", ["L0", "mix"])
@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_port_step_is_bit_identical_and_recorded(dump_root, name, level, mode):
    ref = _step(*_port(name))
    net, x = _port(name)
    extra = {"summary_mode": "md5"} if mode == "md5" else {}
    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor" if mode == "tensor" else "statistics",
                            level=level, step=[0], **extra)
    got = _step(net, x, dbg)
    dbg.close()
    assert got == ref
    data = load_dump(f"{dump_root}/step0/rank")["data"]
    leaves = [p for p, c in net.cells_and_names() if p and not list(c.cells())]
    for path in leaves:
        cell = dict(net.cells_and_names())[path]
        base = f"Cell.{path}.{type(cell).__name__}"
        assert f"{base}.forward.0" in data and f"{base}.backward.0" in data, base


def _residual_net():
    """Built on first use: MindSpore is imported lazily in this folder."""
    class RMSNorm(nn.Cell):
        def construct(self, x):                 # x used three times inside
            return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + 1e-6)

    class Net(nn.Cell):
        def __init__(self, reuse_after: bool):
            super().__init__()
            self.inp, self.norm, self.out = nn.Dense(333, 333), RMSNorm(), nn.Dense(333, 4)
            self.reuse_after = reuse_after

        def construct(self, x):
            h = self.inp(x)
            if self.reuse_after:
                return self.out(h + self.norm(h) * 3.0)     # h used again after the Cell
            s = ops.sin(h)                                  # h used before the Cell only
            return self.out(self.norm(h) * 3.0 + s)
    return Net


def _residual_step(reuse_after, dump_root=None, level="L0", task="statistics"):
    ms.set_seed(0)
    net = _residual_net()(reuse_after)
    x = ms.Tensor(np.random.default_rng(0).standard_normal((64, 333)).astype(np.float32))
    dbg = None
    if dump_root is not None:
        dbg = PrecisionDebugger(dump_path=dump_root, task=task, level=level, step=[0])
    out = _step(net, x, dbg)
    if dbg is not None:
        dbg.close()
    return out


def test_multi_use_cell_whose_input_is_not_used_after_it_is_bit_identical(dump_root):
    assert _residual_step(False, dump_root) == _residual_step(False)


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_multi_use_cell_on_a_residual_stream_is_bit_identical(dump_root, level):
    assert _residual_step(True, dump_root, level) == _residual_step(True)


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_multi_use_cell_on_a_residual_stream_records_its_own_share(dump_root, level):
    """The RMSNorm Cell's input gradient is the sum of its three uses: the vjp of the Cell alone,
    not h's whole gradient (which also holds the residual's share)."""
    _residual_step(True, dump_root, level, task="tensor")
    ms.set_seed(0)
    net = _residual_net()(True)
    x = ms.Tensor(np.random.default_rng(0).standard_normal((64, 333)).astype(np.float32))
    h = net.inp(x)
    n = net.norm(h)
    g_n = ms.grad(lambda v: _sq_mean(net.out(h + v * 3.0)))(n)       # independent references
    _, vjp = ms.vjp(net.norm, h)
    g_h_share = vjp(g_n)[0].asnumpy()
    g_h_whole = ms.grad(lambda v: _sq_mean(net.out(v + net.norm(v) * 3.0)))(h).asnumpy()

    rank = f"{dump_root}/step0/rank"
    rec = load_dump(rank)["data"]["Cell.norm.RMSNorm.backward.0"]
    got_out = np.load(f"{rank}/dump_tensor_data/{rec['input'][0]['data_name']}")
    got_in = np.load(f"{rank}/dump_tensor_data/{rec['output'][0]['data_name']}")
    np.testing.assert_allclose(got_out, g_n.asnumpy(), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(got_in, g_h_share, rtol=1e-4, atol=1e-8)
    assert not np.allclose(got_in, g_h_whole, rtol=1e-3)      # the share, not the whole gradient


def _sq_mean(out):
    return (out * out).mean()


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_batchnorm_records_its_input_gradient(dump_root, level):
    """nn.BatchNorm2d reads its input inside a Primitive with side effects (BatchNorm updates the
    moving statistics), which gets no tap of its own: its use of the Cell's input is still
    tapped, so the Cell's record holds its input's gradient (checked against ms.grad)."""
    net, x = _port("cnn")
    h = net.conv(x)

    def rest(v):
        return _sq_mean(net.fc(net.flatten(net.pool(net.relu(net.bn(v))))))
    g_h = ms.grad(rest)(h).asnumpy()                    # training mode: batch statistics
    g_out = ms.grad(lambda v: _sq_mean(net.fc(net.flatten(net.pool(net.relu(v))))))(net.bn(h)).asnumpy()

    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level=level, step=[0])
    _step(net, x, dbg)
    dbg.close()
    rank = f"{dump_root}/step0/rank"
    rec = load_dump(rank)["data"]["Cell.bn.BatchNorm2d.backward.0"]
    assert len(rec["output"]) == 1
    got_in = np.load(f"{rank}/dump_tensor_data/{rec['output'][0]['data_name']}")
    got_out = np.load(f"{rank}/dump_tensor_data/{rec['input'][0]['data_name']}")
    np.testing.assert_allclose(got_out, g_out, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(got_in, g_h, rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_attention_block_records_each_cells_own_share(dump_root, level):
    """The attention port: Attention uses its input three times (q, k, v), ln2's input is also
    the residual. Each record's input gradient is the vjp of that Cell alone at the gradient of
    its output, both computed here with ms.grad / ms.vjp."""
    net, x = _port("transformer")
    a_in = net.ln1(x)
    x1 = x + net.attn(a_in)
    g_attn_out = ms.grad(lambda a: _sq_mean((x + a) + net.mlp(net.ln2(x + a))))(net.attn(a_in))
    g_attn_in = ms.vjp(net.attn, a_in)[1](g_attn_out)[0].asnumpy()
    g_ln2_out = ms.grad(lambda v: _sq_mean(x1 + net.mlp(v)))(net.ln2(x1))
    g_ln2_in = ms.vjp(net.ln2, x1)[1](g_ln2_out)[0].asnumpy()

    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level=level, step=[0])
    _step(net, x, dbg)
    dbg.close()
    rank = f"{dump_root}/step0/rank"
    data = load_dump(rank)["data"]

    def grads(key):
        rec = data[key]
        return [np.load(f"{rank}/dump_tensor_data/{s['data_name']}") for s in (rec["input"][0], rec["output"][0])]
    out, inp = grads("Cell.attn.Attention.backward.0")
    np.testing.assert_allclose(out, g_attn_out.asnumpy(), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(inp, g_attn_in, rtol=1e-4, atol=1e-8)
    out, inp = grads("Cell.ln2.LayerNorm.backward.0")
    np.testing.assert_allclose(out, g_ln2_out.asnumpy(), rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(inp, g_ln2_in, rtol=1e-4, atol=1e-8)
    assert data["Cell.ln1.LayerNorm.backward.0"]["output"] == []      # fed by data, as in torch
