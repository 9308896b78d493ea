"""With the tool on, loss and gradients are bit-identical; inputs are recorded before in-place
ops; nested and internal calls are not recorded; close() leaves no patch or hook behind."""
import numpy as np
import pytest

from ts_core import PrecisionDebugger

from ..conftest import load_dump, require
from .lazy import Lazy, helpers, mint, ms, nn, ops

api_hooks = Lazy("ts_core.backends.mindspore.api_hooks")

pytestmark = require("mindspore")


def _train(net, xs, debugger=None, steps=3):
    """A few SGD steps with value_and_grad; returns every loss and gradient as numpy."""
    weights = net.trainable_params()
    opt = nn.SGD(weights, learning_rate=0.1)

    def loss_fn(x):
        out = net(x)
        return (out * out).mean() + ops.relu(out).sum() * 0.01

    grad_fn = ms.value_and_grad(loss_fn, None, weights)
    trace = []
    for step in range(steps):
        if debugger is not None:
            debugger.start(net)
        loss, grads = grad_fn(xs[step])
        opt(grads)
        if debugger is not None:
            debugger.stop()
            debugger.step()
        trace.append(loss.asnumpy())
        trace.extend(g.asnumpy() for g in grads)
    return trace


@pytest.mark.parametrize("level,task", [("mix", "statistics"), ("mix", "tensor"), ("L0", "statistics"),
                                        ("L1", "statistics")])
def test_loss_and_grads_bit_identical(dump_root, level, task):
    net = helpers.Block()
    init = helpers.params_numpy(net)
    xs = [helpers.tensor((3, 8), seed=s) for s in range(3)]
    ref = _train(net, xs)
    helpers.load_params(net, init)
    dbg = PrecisionDebugger(dump_path=dump_root, task=task, level=level)
    got = _train(net, xs, dbg)
    dbg.close()
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.tobytes() == b.tobytes()
    data = load_dump(helpers.rank_dir(dump_root, 2))["data"]
    assert any(k.endswith("backward") or ".backward." in k for k in data)   # the tool did record


def test_inputs_recorded_before_in_place_mutation(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="L1", step=[0], framework="mindspore")
    t = ms.Tensor(np.zeros((2, 3), np.float32))
    dbg.start()
    t[0] = 5.0                       # Tensor.__setitem__ mutates t on CPU
    dbg.stop()
    dbg.close()
    assert t.asnumpy()[0].tolist() == [5.0, 5.0, 5.0]
    rank = helpers.rank_dir(dump_root)
    rec = load_dump(rank)["data"]["Tensor.__setitem__.0.forward"]
    assert helpers.npy(rank, rec["input_args"][0]).tolist() == [[0.0] * 3] * 2


def test_nested_and_internal_calls_are_not_recorded(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0], framework="mindspore")
    dbg.start()
    x = helpers.tensor((4, 4), seed=5)
    ops.dense(x, helpers.tensor((3, 4), seed=6))          # its implementation calls other ops
    mint.nn.functional.relu(x)
    dbg.stop()
    dbg.close()
    keys = list(load_dump(helpers.rank_dir(dump_root))["data"])
    assert keys == ["Functional.dense.0.forward", "MintFunctional.relu.0.forward"]


def _api_state():
    import importlib

    T = ms.Tensor

    state = {}
    for section, names in api_hooks.load_api_list().items():
        ns, _ = api_hooks.SECTIONS[section]
        owner = T if ns is None else importlib.import_module(ns)
        for n in names:
            state[(section, n)] = owner.__dict__.get(n, "<inherited>") if ns is None else getattr(owner, n, None)
    return state


def _hook_state(net):
    hooks = {}
    for name, cell in net.cells_and_names():
        for attr, v in vars(cell).items():
            if "hook" in attr and (v is None or isinstance(v, dict)):
                hooks[(name, attr)] = len(v or {})      # a hook dict emptied again counts as none
        hooks[(name, "class")] = type(cell)
        for attr, v in vars(cell).items():
            if isinstance(v, ms.ops.Primitive):
                hooks[(name, attr, "primitive class")] = type(v)
    for p in net.get_parameters():
        hooks[(p.name, "param hooks")] = len(p.hooks())
    return hooks


def test_close_restores_every_patch_and_hook(dump_root):
    net = helpers.MLP()
    before_api, before_hooks = _api_state(), _hook_state(net)
    x = helpers.tensor((2, 6), seed=7)
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", task="tensor")
    dbg.start(net)
    ms.value_and_grad(lambda v: net(v).sum(), None, net.trainable_params())(x)
    patched = sum(1 for k, v in _api_state().items() if before_api[k] is not v)
    hooked = _hook_state(net)
    dbg.stop()
    dbg.close()
    assert patched > 500                                    # the patches were really there
    assert hooked != before_hooks                           # and so were the hooks
    assert type(net.fc1.matmul).__name__ == "MatMul"        # same name while patched, restored below
    after_api, after_hooks = _api_state(), _hook_state(net)
    assert [k for k in before_api if before_api[k] is not after_api[k]] == []
    assert after_hooks == before_hooks
    # and nothing records any more
    n_files = len(load_dump(helpers.rank_dir(dump_root))["data"])
    ms.value_and_grad(lambda v: net(v).sum(), None, net.trainable_params())(x)
    ops.relu(x) + 1.0
    assert len(load_dump(helpers.rank_dir(dump_root))["data"]) == n_files


def test_model_train_bit_identical_with_msprobe_step(dump_root):
    import mindspore.dataset as ds
    from mindspore.train import Model

    from ts_integrations.mindspore import MsprobeStep

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((8, 8)).astype(np.float32)
    ys = rng.standard_normal((8, 4)).astype(np.float32)

    def run(callbacks):
        net = helpers.Block()
        helpers.load_params(net, init)
        model = Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.1, 0.9))
        data = ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False).batch(2)
        model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
        return helpers.params_numpy(net)

    init = helpers.params_numpy(helpers.Block())
    ref = run([])
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0, 1, 2, 3])
    got = run([MsprobeStep(dbg)])
    dbg.close()
    assert ref.keys() == got.keys()
    for k in ref:
        assert ref[k].tobytes() == got[k].tobytes(), k
