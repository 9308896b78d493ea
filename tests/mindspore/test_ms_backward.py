"""Backward records equal gradients computed independently with mindspore.grad, without the tool."""
import numpy as np
import pytest

from ts_core import PrecisionDebugger

from ..conftest import load_dump, require
from .lazy import helpers, ms, ops

pytestmark = require("mindspore")


def _loss(out):
    return (out * out).mean()


def test_cell_primitive_and_param_grads_equal_mindspore_grad(dump_root):
    net = helpers.MLP()
    x = helpers.tensor((5, 6), seed=0)
    weights = net.trainable_params()

    # Independent references: gradients w.r.t. every intermediate activation.
    h1 = net.fc1(x)
    a1 = net.act(h1)
    out = net.fc2(a1)
    g_out = ms.grad(_loss)(out)
    g_a1 = ms.grad(lambda a: _loss(net.fc2(a)))(a1)
    g_h1 = ms.grad(lambda h: _loss(net.fc2(net.act(h))))(h1)
    g_x = ms.grad(lambda v: _loss(net(v)))(x)
    ref_w = dict(zip([p.name for p in weights], ms.grad(lambda v: _loss(net(v)), None, weights)(x)))

    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="mix", step=[0])
    dbg.start(net)
    loss, (gx, gw) = ms.value_and_grad(lambda v: _loss(net(v)), 0, weights)(x)
    dbg.stop()
    dbg.close()
    rank = helpers.rank_dir(dump_root)
    data = load_dump(rank)["data"]

    eq = np.testing.assert_array_equal
    fc2 = data["Cell.fc2.Dense.backward.0"]
    eq(helpers.npy(rank, fc2["input"][0]), g_out.asnumpy())
    eq(helpers.npy(rank, fc2["output"][0]), g_a1.asnumpy())
    act = data["Cell.act.ReLU.backward.0"]
    eq(helpers.npy(rank, act["input"][0]), g_a1.asnumpy())
    eq(helpers.npy(rank, act["output"][0]), g_h1.asnumpy())
    fc1 = data["Cell.fc1.Dense.backward.0"]          # grad_position=0: x's gradient is computed
    eq(helpers.npy(rank, fc1["output"][0]), g_x.asnumpy())
    eq(gx.asnumpy(), g_x.asnumpy())

    # Primitive level (Dense's MatMul): gradients of (input, weight) in argument order.
    mm = data["Primitive.matmul.MatMul.1.backward"]
    eq(helpers.npy(rank, mm["output"][0]), g_a1.asnumpy())
    eq(helpers.npy(rank, mm["output"][1]), ref_w["fc2.weight"])
    bias_add = data["Primitive.bias_add.BiasAdd.1.backward"]
    eq(helpers.npy(rank, bias_add["output"][1]), ref_w["fc2.bias"])

    for cell, pname, full in (("fc1", "weight", "fc1.weight"), ("fc2", "bias", "fc2.bias")):
        pg = data[f"Cell.{cell}.Dense.parameters_grad.0"][pname]
        assert isinstance(pg, list) and len(pg) == 1
        eq(helpers.npy(rank, pg[0]), ref_w[full])
    for p, g in zip(weights, gw):
        eq(g.asnumpy(), ref_w[p.name])


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_first_layer_fed_by_data_has_output_grads_only(dump_root, level):
    """MindSpore computes no gradient for a data input nobody asked for: the record keeps the
    gradient of the Cell's output and an empty list for its input (as the torch backend does
    for inputs that do not require grad). At mix the Dense's MatMul taps the data together with
    the weight, whose gradient is asked for: the Cell must still not take the data's."""
    net = helpers.MLP()
    x = helpers.tensor((4, 6), seed=1)
    weights = net.trainable_params()
    g_h1 = ms.grad(lambda h: _loss(net.fc2(net.act(h))))(net.fc1(x))

    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level=level, step=[0])
    dbg.start(net)
    ms.value_and_grad(lambda v: _loss(net(v)), None, weights)(x)
    dbg.stop()
    dbg.close()
    rank = helpers.rank_dir(dump_root)
    data = load_dump(rank)["data"]
    fc1 = data["Cell.fc1.Dense.backward.0"]
    assert fc1["output"] == []
    np.testing.assert_array_equal(helpers.npy(rank, fc1["input"][0]), g_h1.asnumpy())
    keys = list(data)
    # completed at the end of the step, still before the parameter gradients
    assert keys.index("Cell.fc1.Dense.backward.0") < keys.index("Cell.fc1.Dense.parameters_grad.0")


def test_api_backward_equals_grad(dump_root):
    x = helpers.tensor((3, 4), seed=2)
    w = helpers.tensor((4, 5), seed=3)

    def f(a, b):
        h = ops.matmul(a, b)
        return (ops.tanh(h) * 3.0).sum()

    h = ops.matmul(x, w)
    g_h = ms.grad(lambda v: (ops.tanh(v) * 3.0).sum())(h)
    g_tanh_out = ms.grad(lambda v: (v * 3.0).sum())(ops.tanh(h))
    ref_x, ref_w = ms.grad(f, (0, 1))(x, w)

    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="L1", step=[0], framework="mindspore")
    dbg.start()
    gx, gw = ms.grad(f, (0, 1))(x, w)
    dbg.stop()
    dbg.close()
    rank = helpers.rank_dir(dump_root)
    data = load_dump(rank)["data"]
    mm = data["Functional.matmul.0.backward"]
    np.testing.assert_array_equal(helpers.npy(rank, mm["input"][0]), g_h.asnumpy())
    np.testing.assert_array_equal(helpers.npy(rank, mm["output"][0]), ref_x.asnumpy())
    np.testing.assert_array_equal(helpers.npy(rank, mm["output"][1]), ref_w.asnumpy())
    tanh = data["Functional.tanh.0.backward"]
    np.testing.assert_array_equal(helpers.npy(rank, tanh["input"][0]), g_tanh_out.asnumpy())
    np.testing.assert_array_equal(helpers.npy(rank, tanh["output"][0]), g_h.asnumpy())
    np.testing.assert_array_equal(gx.asnumpy(), ref_x.asnumpy())
    assert "Tensor.__mul__.0.backward" in data and "Tensor.sum.0.backward" in data


def test_debug_save_records_value_and_gradient(dump_root):
    x = helpers.tensor((2, 3), seed=4)

    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="debug", step=[0],
                            framework="mindspore")

    def f(v):
        h = ops.sin(v)
        dbg.save(h, "hidden")
        return (h * h).sum()

    ref = ms.grad(lambda h: (h * h).sum())(ops.sin(x))
    dbg.start()
    ms.grad(f)(x)
    dbg.stop()
    dbg.close()
    rank = helpers.rank_dir(dump_root)
    data = load_dump(rank)["data"]
    np.testing.assert_array_equal(helpers.npy(rank, data["hidden.0.debug"]), ops.sin(x).asnumpy())
    np.testing.assert_array_equal(helpers.npy(rank, data["hidden_grad.0.debug"]), ref.asnumpy())


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_nested_cells_sharing_an_input_complete_innermost_first(dump_root, level):
    """encoder and its first Dense have the same input: both records hold its gradient, and the
    inner Cell's is written first (as autodiff reaches it first), so compare names the inner one."""
    net = helpers.Outer()
    x = helpers.tensor((3, 4), seed=4)
    g_x = ms.grad(lambda v: _loss(net(v)))(x)

    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level=level, step=[0])
    dbg.start(net)
    ms.grad(lambda v: _loss(net(v)))(x)
    dbg.stop()
    dbg.close()
    rank = helpers.rank_dir(dump_root)
    data = load_dump(rank)["data"]
    inner, outer = "Cell.encoder.0.Dense.backward.0", "Cell.encoder.SequentialCell.backward.0"
    for key in (inner, outer):
        np.testing.assert_array_equal(helpers.npy(rank, data[key]["output"][0]), g_x.asnumpy())
    keys = list(data)
    assert keys.index(inner) < keys.index(outer)
