"""Model.train + MsprobeStep dumps exactly the configured steps; MsprobeInitStep gives a resumed
run its true step numbers."""
import os

import numpy as np
import pytest

from ts_core import PrecisionDebugger

from ..conftest import load_dump, require
from .lazy import Lazy, helpers, nn

ds = Lazy("mindspore.dataset")
train = Lazy("mindspore.train")
integ = Lazy("ts_integrations.mindspore")

pytestmark = require("mindspore")

BATCHES = 4         # per epoch


def _dataset():
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((2 * BATCHES, 6)).astype(np.float32)
    ys = rng.standard_normal((2 * BATCHES, 3)).astype(np.float32)
    return ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False).batch(2)


def _model(net=None):
    net = net or helpers.MLP()
    return net, train.Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01))


def _steps_dumped(root):
    return sorted(int(d[4:]) for d in os.listdir(root)) if os.path.isdir(root) else []


def test_msprobe_step_dumps_exactly_the_configured_steps(dump_root):
    net, model = _model()
    counter = helpers.StepCounter()
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[1, 6])
    model.train(2, _dataset(), callbacks=[counter, integ.MsprobeStep(dbg)], dataset_sink_mode=False)
    dbg.close()
    assert counter.seen == list(range(1, 2 * BATCHES + 1))       # cur_step_num is 1-based, cumulative
    assert _steps_dumped(dump_root) == [1, 6]                    # dump step = cur_step_num - 1
    for step in (1, 6):
        data = load_dump(helpers.rank_dir(dump_root, step))["data"]
        # the network came from run_context (no model was given), named under the backbone
        assert "Cell.fc1.Dense.forward.0" in data and "Cell.fc1.Dense.forward.1" not in data
        assert "Cell.fc2.Dense.backward.0" in data and "Cell.fc1.Dense.parameters_grad.0" in data
        assert not any("_backbone" in k or "network" in k for k in data)


def test_msprobe_step_at_l1_and_mix(dump_root):
    for level in ("L1", "mix"):
        root = os.path.join(dump_root, level)
        _, model = _model()
        dbg = PrecisionDebugger(dump_path=root, level=level, step=[0])
        model.train(1, _dataset(), callbacks=[integ.MsprobeStep(dbg)], dataset_sink_mode=False)
        dbg.close()
        assert _steps_dumped(root) == [0]
        data = load_dump(helpers.rank_dir(root, 0))["data"]
        has_cells = any(k.startswith("Cell.") for k in data)
        assert has_cells == (level == "mix")
        assert any(k.startswith("Tensor.") or k.startswith("Functional.") for k in data)
        assert any(k.endswith(".backward") for k in data)


def test_network_wrapped_in_with_loss_cell_is_named_by_backbone(dump_root):
    net = helpers.MLP()
    wrapped = nn.WithLossCell(net, nn.MSELoss())
    assert integ.backbone_of(nn.TrainOneStepCell(wrapped, nn.SGD(net.trainable_params(), 0.1))) is net
    model = train.Model(wrapped, optimizer=nn.SGD(net.trainable_params(), 0.01))
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[2])
    model.train(1, _dataset(), callbacks=[integ.MsprobeStep(dbg)], dataset_sink_mode=False)
    dbg.close()
    data = load_dump(helpers.rank_dir(dump_root, 2))["data"]
    assert "Cell.fc2.Dense.forward.0" in data


def test_resumed_run_with_initial_epoch_dumps_true_step_numbers(dump_root):
    net, model = _model()
    # without MsprobeInitStep: the resumed run starts counting at 0 again (msprobe's behaviour)
    plain = os.path.join(dump_root, "plain")
    dbg = PrecisionDebugger(dump_path=plain, level="L0", step=[0, 9])
    model.train(3, _dataset(), callbacks=[integ.MsprobeStep(dbg)], dataset_sink_mode=False, initial_epoch=2)
    dbg.close()
    assert _steps_dumped(plain) == [0]

    fixed = os.path.join(dump_root, "fixed")
    dbg = PrecisionDebugger(dump_path=fixed, level="L0", step=[0, 9])
    init = integ.MsprobeInitStep()
    counter = helpers.StepCounter()
    # MsprobeInitStep may come after MsprobeStep in the list
    model.train(3, _dataset(), callbacks=[counter, integ.MsprobeStep(dbg), init], dataset_sink_mode=False,
                initial_epoch=2)
    dbg.close()
    assert counter.seen == [1, 2, 3, 4]                 # MindSpore restarts cur_step_num
    assert init.init_step == 2 * BATCHES                # epochs 0 and 1 were done before
    assert _steps_dumped(fixed) == [9]                  # the 2nd step of epoch 2 is global step 9
    assert "Cell.fc1.Dense.forward.0" in load_dump(helpers.rank_dir(fixed, 9))["data"]


def test_restored_step_counter_is_used(dump_root):
    _, model = _model()
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[14])
    init = integ.MsprobeInitStep()
    model.train(1, _dataset(), callbacks=[helpers.RestoreStepCounter(13), init, integ.MsprobeStep(dbg)], dataset_sink_mode=False)
    dbg.close()
    assert init.init_step == 13
    assert _steps_dumped(dump_root) == [14]


def test_msprobe_step_rejects_wrong_arguments():
    with pytest.raises(TypeError):
        integ.MsprobeStep(object())
    with pytest.raises(TypeError):
        integ.MsprobeStep(PrecisionDebugger(dump_path="unused", level="L0"), model=3)


def test_early_start_with_the_net_then_msprobe_step(dump_root):
    """msprobe's documented pattern: debugger.start(net) once, then Model.train + MsprobeStep."""
    net = helpers.MLP()
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0, 1])
    dbg.start(net)
    model = train.Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01))   # built after start()
    model.train(1, _dataset(), callbacks=[integ.MsprobeStep(dbg)], dataset_sink_mode=False)
    dbg.close()
    assert _steps_dumped(dump_root) == [0, 1]
    for step in (0, 1):
        data = load_dump(helpers.rank_dir(dump_root, step))["data"]
        fc1 = [k for k in data if k.startswith("Cell.fc1.Dense.forward")]
        assert fc1 == ["Cell.fc1.Dense.forward.0"], fc1          # one training step, nothing else
        assert "Cell.fc1.Dense.parameters_grad.0" in data
        assert sum(k.startswith("Primitive.matmul.MatMul") and k.endswith("forward") for k in data) == 2
