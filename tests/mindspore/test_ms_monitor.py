"""Monitor mode with MindSpore ``Model.train`` + ``MsprobeStep`` (issue 16): a NaN injected at a
known cell and step is caught at that step and named; the loss logged is the training loss;
``on_trigger: stop`` stops ``Model.train``."""
import json
import math
import os

import numpy as np

from ts_core import PrecisionDebugger

from ..conftest import require
from .lazy import Lazy, nn

ds = Lazy("mindspore.dataset")
train = Lazy("mindspore.train")
integ = Lazy("ts_integrations.mindspore")

pytestmark = require("mindspore")


def _net_and_poisoner(at):
    """An MLP with a Scale cell, and a callback making Scale's output NaN at step `at`."""

    class Scale(nn.Cell):
        def __init__(self):
            super().__init__()
            self.factor = 1.0

        def construct(self, x):
            return x * self.factor

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(6, 8)
            self.scale = Scale()
            self.fc2 = nn.Dense(8, 3)

        def construct(self, x):
            return self.fc2(self.scale(self.fc1(x)))

    class Poisoner(train.Callback):
        def __init__(self, net):
            super().__init__()
            self.net, self.losses = net, []

        def on_train_step_begin(self, run_context):
            step = run_context.original_args().cur_step_num - 1
            self.net.scale.factor = math.nan if step == at else 1.0

        def on_train_step_end(self, run_context):
            self.losses.append(float(run_context.original_args().net_outputs.asnumpy()))

    net = Net()
    return net, Poisoner(net)


def test_model_train_nan_caught_named_and_stopped(dump_root):
    rng = np.random.default_rng(0)
    data = ds.NumpySlicesDataset({"x": rng.standard_normal((16, 6)).astype(np.float32),
                                  "y": rng.standard_normal((16, 3)).astype(np.float32)}, shuffle=False).batch(2)
    net, poisoner = _net_and_poisoner(at=4)
    model = train.Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01))
    dbg = PrecisionDebugger(dump_path=dump_root, monitor={"keep_steps": 2, "on_trigger": "stop",
                                                          "loss_spike": None})
    model.train(1, data, callbacks=[poisoner, integ.MsprobeStep(dbg)], dataset_sink_mode=False)
    dbg.close()
    with open(os.path.join(dump_root, "monitor.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]          # stopped after the captured step
    for r, loss in zip(rows[:4], poisoner.losses):
        assert r["loss"] == loss and "trigger" not in r
    first = rows[4]["capture"]["first"]
    assert first["key"] == "Cell.scale.Scale.forward.0" and first["direction"] == "forward"
    assert first["tensor"] == "Cell.scale.Scale.forward.0.output.0"
    assert sorted(d for d in os.listdir(dump_root) if d.startswith("step")) == ["step3", "step4"]
    assert os.path.isfile(os.path.join(dump_root, "step4", "rank", "dump.json"))


def test_model_train_bit_identical_with_monitor(dump_root):
    import mindspore as ms

    rng = np.random.default_rng(1)
    xs, ys = rng.standard_normal((12, 6)).astype(np.float32), rng.standard_normal((12, 3)).astype(np.float32)
    params = []
    for monitored in (False, True):
        ms.set_seed(0)
        net, _ = _net_and_poisoner(at=-1)
        model = train.Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9))
        callbacks = []
        if monitored:
            dbg = PrecisionDebugger(dump_path=dump_root, monitor={"backward": True})
            callbacks.append(integ.MsprobeStep(dbg))
        data = ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False).batch(2)
        model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
        if monitored:
            dbg.close()
        params.append({p.name: p.asnumpy().copy() for p in net.trainable_params()})
    bare, watched = params
    assert bare.keys() == watched.keys() and len(bare) == 4
    for name in bare:
        assert np.array_equal(bare[name], watched[name]), name
    with open(os.path.join(dump_root, "monitor.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 6 and all(r["nonfinite"] == {"forward": 0, "backward": 0, "parameters_grad": 0} for r in rows)
    assert all(r["grad_norm"] > 0 for r in rows)


def test_model_train_sink_mode_on_cpu_is_monitored(dump_root):
    """On CPU MindSpore trains ``dataset_sink_mode=True`` without sinking (one step and one
    callback at a time): the monitor catches the NaN as without sink mode."""
    rng = np.random.default_rng(0)
    data = ds.NumpySlicesDataset({"x": rng.standard_normal((16, 6)).astype(np.float32),
                                  "y": rng.standard_normal((16, 3)).astype(np.float32)}, shuffle=False).batch(2)
    net, poisoner = _net_and_poisoner(at=2)
    model = train.Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01))
    dbg = PrecisionDebugger(dump_path=dump_root, monitor={"keep_steps": 1, "on_trigger": "stop", "loss_spike": None})
    model.train(1, data, callbacks=[poisoner, integ.MsprobeStep(dbg)], dataset_sink_mode=True)
    dbg.close()
    with open(os.path.join(dump_root, "monitor.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["loss"] for r in rows[:2]] == poisoner.losses[:2]
    assert rows[2]["capture"]["first"]["key"] == "Cell.scale.Scale.forward.0"


def test_sink_in_graph_mode_is_a_clear_error(dump_root):
    """A real sink in GRAPH_MODE (Ascend/GPU) gives one callback per sink of sink_size steps:
    the monitor refuses it at on_train_begin, naming what to change. This machine has no
    Ascend/GPU, so the callback parameters are set here as MindSpore's
    ``Model._train_dataset_sink_process`` sets them before ``on_train_begin``; the same
    parameters in PYNATIVE_MODE (sink mode steps in Python there) or without the monitor pass."""
    import mindspore as ms
    import pytest
    from mindspore.train.callback import RunContext, _InternalCallbackParam

    net, _ = _net_and_poisoner(at=-1)

    def begin(mode, monitor):
        cb_params = _InternalCallbackParam()
        cb_params.network = net
        cb_params.dataset_sink_mode = True
        cb_params.sink_size = 4
        kwargs = {"monitor": {}} if monitor else {"step": [0]}
        dbg = PrecisionDebugger(dump_path=dump_root, **kwargs)
        ms.set_context(mode=mode)
        try:
            integ.MsprobeStep(dbg).on_train_begin(RunContext(cb_params))
        finally:
            ms.set_context(mode=ms.PYNATIVE_MODE)
            dbg.close()

    with pytest.raises(ValueError, match=r"dataset_sink_mode=True\) in GRAPH_MODE.*sink_size=4.*"
                                         r"dataset_sink_mode=False.*PYNATIVE_MODE"):
        begin(ms.GRAPH_MODE, monitor=True)
    begin(ms.PYNATIVE_MODE, monitor=True)
    begin(ms.GRAPH_MODE, monitor=False)        # a regular dump keeps its warning (device target CPU here: none)
