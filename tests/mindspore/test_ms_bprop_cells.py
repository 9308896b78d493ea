"""A Cell that defines ``bprop`` (MindSpore ignores a forward hook on it): its call is recorded
forward and backward, the Cells after it keep their own parents, its backward record holds what
its bprop returned, and training stays bit-identical."""
import numpy as np
import pytest

from ts_core import PrecisionDebugger

from ..conftest import load_dump, load_json, require
from .lazy import helpers, ms, nn, ops

pytestmark = require("mindspore")


def _net():
    class ScaledTanh(nn.Cell):
        """tanh whose hand-written backward is twice the true one (so it is told apart)."""

        def construct(self, x):
            return ops.tanh(x)

        def bprop(self, x, out, dout):
            return (dout * (1 - out * out) * 2.0,)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Dense(6, 5), ScaledTanh(), nn.Dense(5, 3)

        def construct(self, x):
            return self.fc2(self.act(self.fc1(x)))

    ms.set_seed(0)
    return Net()


def _grads(net, x, dbg=None):
    weights = net.trainable_params()
    if dbg is not None:
        dbg.start(net)
    loss, (gx, gw) = ms.value_and_grad(lambda v: (net(v) ** 2).mean(), 0, weights)(x)
    if dbg is not None:
        dbg.stop()
        dbg.close()
    return [loss.asnumpy().tobytes(), gx.asnumpy().tobytes()] + [g.asnumpy().tobytes() for g in gw]


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_bprop_cell_is_recorded_at_its_place_and_bit_identical(dump_root, level):
    x = helpers.tensor((4, 6), seed=0)
    ref = _grads(_net(), x)
    net = _net()
    cls = type(net.act)
    h = net.fc1(x).asnumpy()
    got = _grads(net, x, PrecisionDebugger(dump_path=dump_root, task="tensor", level=level, step=[0]))
    assert got == ref
    assert type(net.act) is cls                  # the hook's class is gone after close()

    rank = helpers.rank_dir(dump_root)
    data = load_dump(rank)["data"]
    construct = load_json(rank, "construct.json")
    act_f, act_b = "Cell.act.ScaledTanh.forward.0", "Cell.act.ScaledTanh.backward.0"
    # The Cell after it is not its child (its end was recorded), forward and backward.
    for key in ("Cell.fc2.Dense.forward.0", "Cell.fc2.Dense.backward.0", act_f, act_b):
        assert construct[key] is None, (key, construct[key])
    out = helpers.npy(rank, data[act_f]["output"][0])
    np.testing.assert_allclose(out, np.tanh(h), rtol=1e-6, atol=1e-7)
    dout = helpers.npy(rank, data[act_b]["input"][0])
    din = helpers.npy(rank, data[act_b]["output"][0])
    np.testing.assert_array_equal(din, (dout * (1 - out * out) * np.float32(2.0)).astype(np.float32))
