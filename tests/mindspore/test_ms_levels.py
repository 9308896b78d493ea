"""Keys at L0 / L1 / mix, construct.json, Primitive capture through Cells, backend selection,
custom APIs."""
import warnings

import numpy as np
import pytest

from ts_core import PrecisionDebugger

from ..conftest import load_dump, load_json, require
from .lazy import helpers, ms, ops

pytestmark = require("mindspore")


def _run(dump_root, level, model_arg=True, grad=True, **kw):
    net = helpers.Outer()
    x = helpers.tensor((3, 4), seed=0)
    dbg = PrecisionDebugger(dump_path=dump_root, level=level, step=[0], framework="mindspore", **kw)
    dbg.start(net if model_arg else None)
    if grad:
        ms.value_and_grad(lambda v: net(v).sum(), None, net.trainable_params())(x)
    else:
        net(x)
    dbg.stop()
    dbg.close()
    rank = helpers.rank_dir(dump_root)
    return load_dump(rank), load_json(rank, "construct.json"), load_json(rank, "stack.json")


def test_l0_cells_forward_backward_parameters_and_construct(dump_root):
    dump, construct, stack = _run(dump_root, "L0")
    data = dump["data"]
    assert dump["level"] == "L0" and dump["framework"] == "mindspore"
    assert all(k.startswith("Cell.") for k in data)
    for key in ("Cell.encoder.SequentialCell.forward.0", "Cell.encoder.0.Dense.forward.0",
                "Cell.encoder.1.ReLU.forward.0", "Cell.head.Dense.forward.0",
                "Cell.head.Dense.backward.0", "Cell.encoder.0.Dense.backward.0",
                "Cell.head.Dense.parameters_grad.0", "Cell.encoder.0.Dense.parameters_grad.0"):
        assert key in data, sorted(data)
    fwd = data["Cell.head.Dense.forward.0"]
    assert set(fwd) == {"input_args", "input_kwargs", "output", "parameters"}
    assert set(fwd["parameters"]) == {"weight", "bias"}
    assert fwd["output"][0]["type"] == "mindspore.Tensor" and fwd["output"][0]["dtype"] == "Float32"
    assert set(data["Cell.head.Dense.parameters_grad.0"]) == {"weight", "bias"}
    assert construct["Cell.encoder.0.Dense.forward.0"] == "Cell.encoder.SequentialCell.forward.0"
    assert construct["Cell.encoder.0.Dense.backward.0"] == "Cell.encoder.SequentialCell.backward.0"
    assert construct["Cell.head.Dense.forward.0"] is None
    stack_keys = {k for entry in stack.values() for k in entry[0]}
    assert "Cell.head.Dense.forward.0" in stack_keys
    frames = [f for entry in stack.values() for f in entry[1]]
    assert any("test_ms_levels.py" in f for f in frames)
    assert not any("site-packages/mindspore/" in f.split(",")[0] for f in frames)   # framework frames dropped


def test_l1_without_model_records_apis_only(dump_root):
    dump, construct, _ = _run(dump_root, "L1", model_arg=False)
    data = dump["data"]
    for key in ("Mint.matmul.0.forward", "Functional.eye.0.forward", "Tensor.__add__.0.forward",
                "MintFunctional.relu.0.forward", "Mint.matmul.0.backward", "MintFunctional.relu.0.backward"):
        assert key in data, sorted(data)
    assert not any(k.startswith(("Cell.", "Primitive.")) for k in data)
    assert construct == {}


def test_l1_with_model_captures_primitives_called_by_cells(dump_root):
    dump, construct, _ = _run(dump_root, "L1")
    data = dump["data"]
    for key in ("Primitive.matmul.MatMul.0.forward", "Primitive.bias_add.BiasAdd.0.forward",
                "Primitive.relu.ReLU.0.forward", "Primitive.matmul.MatMul.1.forward",
                "Primitive.matmul.MatMul.0.backward", "Mint.matmul.0.forward"):
        assert key in data, sorted(data)
    mm = data["Primitive.matmul.MatMul.0.forward"]
    assert [a["shape"] for a in mm["input_args"]] == [[3, 4], [4, 4]]
    assert not any(k.startswith("Cell.") for k in data)
    assert construct == {}


def test_mix_nests_apis_and_primitives_under_cells(dump_root):
    dump, construct, _ = _run(dump_root, "mix")
    data = dump["data"]
    assert "Cell.head.Dense.forward.0" in data and "Mint.matmul.0.forward" in data
    assert construct["Primitive.matmul.MatMul.0.forward"] == "Cell.encoder.0.Dense.forward.0"
    assert construct["Primitive.relu.ReLU.0.forward"] == "Cell.encoder.1.ReLU.forward.0"
    assert construct["Mint.matmul.0.forward"] is None
    assert construct["Primitive.matmul.MatMul.1.forward"] == "Cell.head.Dense.forward.0"


def test_list_of_models_and_forward_only(dump_root):
    a, b = helpers.MLP(), helpers.MLP()
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[0], data_mode=["forward"])
    dbg.start([a, b])
    x = helpers.tensor((2, 6), seed=1)

    def loss(v):
        h = a(v)
        return b(ops.concat((h, h), 1)).sum()

    ms.value_and_grad(loss, None, a.trainable_params() + b.trainable_params())(x)
    dbg.stop()
    dbg.close()
    data = load_dump(helpers.rank_dir(dump_root))["data"]
    assert "Cell.0.fc1.Dense.forward.0" in data and "Cell.1.fc2.Dense.forward.0" in data
    assert not any("backward" in k or "parameters_grad" in k for k in data)


def test_list_filter_and_repeated_calls(dump_root):
    net = helpers.MLP()
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0], list=["Cell.fc2"])
    dbg.start(net)
    for s in range(2):
        net(helpers.tensor((2, 6), seed=s))
    dbg.stop()
    dbg.close()
    data = load_dump(helpers.rank_dir(dump_root))["data"]
    assert {"Cell.fc2.Dense.forward.0", "Cell.fc2.Dense.forward.1",
            "Primitive.matmul.MatMul.1.forward", "Primitive.matmul.MatMul.3.forward"} <= set(data)
    assert not any(k.startswith("Cell.fc1") or k.startswith("Cell.act") for k in data)


def test_backend_is_chosen_from_the_cell_and_from_the_config(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[0])
    dbg.start(helpers.MLP())
    assert dbg._backend.framework == "mindspore"
    dbg.close()
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0], framework="mindspore")
    dbg.start()
    ops.relu(helpers.tensor((2, 2)))
    dbg.stop()
    dbg.close()
    assert "Functional.relu.0.forward" in load_dump(helpers.rank_dir(dump_root))["data"]
    with pytest.raises(TypeError):
        PrecisionDebugger(dump_path=dump_root, level="L0", framework="mindspore").start(object())


def test_register_and_restore_custom_api(dump_root):
    import types

    mod = types.SimpleNamespace(twice=lambda t: t * 2)
    orig = mod.twice
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0], framework="mindspore")
    dbg.register_custom_api(mod, "twice", "MyOps")
    dbg.start()
    mod.twice(helpers.tensor((2, 2)))
    dbg.restore_custom_api(mod, "twice")
    assert mod.twice is orig
    mod.twice(helpers.tensor((2, 2)))
    dbg.stop()
    dbg.close()
    data = load_dump(helpers.rank_dir(dump_root))["data"]
    assert "MyOps.twice.0.forward" in data and "MyOps.twice.1.forward" not in data


def test_jit_function_still_runs_with_patches(dump_root):
    @ms.jit
    def f(a, b):
        return ops.relu(a) + b * 2

    a, b = helpers.tensor((2, 3), seed=2), helpers.tensor((2, 3), seed=3)
    ref = f(a, b).asnumpy()
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0], framework="mindspore")
    dbg.start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = f(a, b).asnumpy()
    dbg.stop()
    dbg.close()
    np.testing.assert_array_equal(got, ref)


def test_outside_configured_steps_nothing_is_installed(dump_root):
    net = helpers.MLP()
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[1])
    dbg.start(net)
    net(helpers.tensor((2, 6)))
    dbg.stop()
    assert dbg.dump_dirs == [] and ops.relu.__name__ == "relu" and not hasattr(ops.relu, "__tsprobe_orig__")
    dbg.step()
    dbg.start(net)
    net(helpers.tensor((2, 6)))
    dbg.stop()
    dbg.step()          # the last configured step: everything restored
    assert not hasattr(ops.relu, "__tsprobe_orig__") and type(net.fc1.matmul) is ms.ops.MatMul
    assert "Cell.fc1.Dense.forward.0" in load_dump(helpers.rank_dir(dump_root, 1))["data"]
    dbg.close()


def test_token_range_records_only_the_chosen_forward_iterations(dump_root):
    net = helpers.MLP()
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[0])
    dbg.start(net, token_range=[1, 2])
    for s in range(4):
        net(helpers.tensor((1, 6), seed=s))
    dbg.stop()
    dbg.close()
    data = load_dump(helpers.rank_dir(dump_root))["data"]
    assert sorted(k for k in data if k.startswith("Cell.fc1")) == ["Cell.fc1.Dense.forward.0",
                                                                   "Cell.fc1.Dense.forward.1"]
    np.testing.assert_allclose(data["Cell.fc1.Dense.forward.0"]["input_args"][0]["Max"],
                               helpers.tensor((1, 6), seed=1).asnumpy().max(), rtol=1e-6)


def test_graph_mode_warns_that_nothing_is_recorded_inside(dump_root):
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[0])
        with pytest.warns(UserWarning, match="GRAPH_MODE"):
            dbg.start(helpers.MLP())
        dbg.close()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_is_hooked_and_a_dropped_cell_is_freed_while_the_debugger_is_open(dump_root):
    import gc
    import weakref

    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0])
    net, other = helpers.Outer(), helpers.MLP()
    dbg.start(net)
    ms.value_and_grad(lambda v: net(v).sum(), None, net.trainable_params())(helpers.tensor((3, 4)))
    dbg.stop()
    assert dbg.is_hooked(net) and dbg.is_hooked() and not dbg.is_hooked(other)
    ref = weakref.ref(net)
    del net
    gc.collect()
    assert ref() is None                 # Cell hooks and Primitive patches did not keep it alive
    assert not dbg.is_hooked()
    dbg.close()
    assert "Cell.head.Dense.parameters_grad.0" in load_dump(helpers.rank_dir(dump_root))["data"]
