"""What tsprobe writes under mindtorch (seed 002's MSAdapter scenario): torch-style keys at every
level, ``"framework": "mindtorch"``, the usual layout, forward and backward of value_and_grad
training, values checked against numpy and against real torch's autograd, and bit-identical
training with the tool on."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from . import models
from .jobs import STEPS, TOY_RUNS, toy_id

L0_KEYS = [f"Module.{m}.forward.0" for m in ("linear1.Linear", "norm.LayerNorm", "linear2.Linear")] \
    + [f"Module.{m}.backward.0" for m in ("linear2.Linear", "norm.LayerNorm", "linear1.Linear")]
L0_PARAM_GRADS = [f"Module.{m}.parameters_grad.0" for m in ("linear1.Linear", "norm.LayerNorm", "linear2.Linear")]
# Net.forward then the loss ((out - y) ** 2).mean(), in call order
L1_CALLS = ["Functional.linear.0", "Functional.gelu.0", "Functional.layer_norm.0", "Tensor.__add__.0",
            "Functional.linear.1", "Functional.relu.0", "Tensor.__sub__.0", "Tensor.__pow__.0", "Tensor.mean.0"]


def _load(rank: str, name: str = "dump.json") -> dict:
    with open(os.path.join(rank, name), encoding="utf-8") as f:
        return json.load(f)


def _npy(rank: str, summary: dict) -> np.ndarray:
    return np.load(os.path.join(rank, "dump_tensor_data", summary["data_name"]))


def _toy_numpy(root: str, step: int = 0):
    """The toy's step-`step` forward in numpy from the saved weights (step 0 only: later steps
    run on updated weights): (x, y, linear1 output, output)."""
    with np.load(os.path.join(root, "weights_toy.npz")) as w:
        w = {k: w[k].astype(np.float64) for k in w.files}
    x, y = models.batch("toy", step)
    x1 = x.astype(np.float64) @ w["linear1.weight"].T + w["linear1.bias"]
    g = 0.5 * x1 * (1.0 + np.vectorize(math.erf)(x1 / math.sqrt(2.0)))
    mu, var = g.mean(-1, keepdims=True), g.var(-1, keepdims=True)
    h = (g - mu) / np.sqrt(var + 1e-5) * w["norm.weight"] + w["norm.bias"] + x1
    out = np.maximum(h @ w["linear2.weight"].T + w["linear2.bias"], 0.0)
    return x, y, x1, out


@pytest.mark.parametrize("level,task", TOY_RUNS)
def test_layout_framework_and_files(runs, level, task):
    for step in range(STEPS):
        rank = runs.rank_dir("mindtorch", toy_id(level, task), step)
        dump = _load(rank)
        assert (dump["framework"], dump["level"], dump["task"]) == ("mindtorch", level, task)
        assert os.path.isfile(os.path.join(rank, "stack.json")) and os.path.isfile(os.path.join(rank, "construct.json"))
        tensors = [s for rec in dump["data"].values() for s in _summaries(rec)]
        assert tensors and all(s["type"] == "mindspore.Tensor" for s in tensors)
        if task == "tensor":
            assert all(os.path.isfile(os.path.join(rank, "dump_tensor_data", s["data_name"])) for s in tensors)
        else:
            assert not os.path.exists(os.path.join(rank, "dump_tensor_data"))
            assert all(isinstance(s["Max"], float) for s in tensors if s["shape"] != [0])


def _summaries(value):
    if isinstance(value, dict):
        if value.get("type") == "mindspore.Tensor":
            yield value
        else:
            for v in value.values():
                yield from _summaries(v)
    elif isinstance(value, list):
        for v in value:
            yield from _summaries(v)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_keys_per_level(runs, task):
    """Torch's names for every module and API: L0 modules (forward, backward, parameter
    gradients), L1 APIs (forward and backward), mix both."""
    keys = {level: list(_load(runs.rank_dir("mindtorch", toy_id(level, task)))["data"]) for level in ("L0", "L1", "mix")}
    assert keys["L0"][:len(L0_KEYS)] == L0_KEYS and sorted(keys["L0"][len(L0_KEYS):]) == sorted(L0_PARAM_GRADS)
    assert [k for k in keys["L1"] if k.endswith(".forward")] == [f"{c}.forward" for c in L1_CALLS]
    assert [k for k in keys["L1"] if k.endswith(".backward")] == [f"{c}.backward" for c in reversed(L1_CALLS)]
    assert len(keys["L1"]) == 2 * len(L1_CALLS)
    assert set(keys["mix"]) == set(keys["L0"]) | set(keys["L1"])
    construct = _load(runs.rank_dir("mindtorch", toy_id("mix", task)), "construct.json")
    assert construct["Functional.linear.0.forward"] == "Module.linear1.Linear.forward.0"
    assert construct["Module.linear1.Linear.forward.0"] is None
    assert _load(runs.rank_dir("mindtorch", toy_id("L1", task)), "construct.json") == {}


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_tensor_files_match_numpy(runs, level):
    rank = runs.rank_dir("mindtorch", toy_id(level, "tensor"))
    data = _load(rank)["data"]
    x, _, x1, out = _toy_numpy(runs.root)
    linear = data["Functional.linear.0.forward"]
    np.testing.assert_array_equal(_npy(rank, linear["input_args"][0]), x)
    np.testing.assert_allclose(_npy(rank, linear["output"][0]), x1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_npy(rank, data["Functional.relu.0.forward"]["output"][0]), out, rtol=1e-5, atol=1e-6)


def test_statistics_match_numpy(runs):
    rank = runs.rank_dir("mindtorch", toy_id("L1", "statistics"))
    summary = _load(rank)["data"]["Functional.linear.0.forward"]["output"][0]
    _, _, x1, _ = _toy_numpy(runs.root)
    assert summary["dtype"].lower().endswith("float32") and summary["shape"] == list(x1.shape)
    expected = [x1.max(), x1.min(), x1.mean(), np.linalg.norm(x1)]
    np.testing.assert_allclose([summary[k] for k in ("Max", "Min", "Mean", "Norm")], expected, rtol=1e-5, atol=1e-6)


def test_parameter_gradients_match_real_torch(runs):
    """parameters_grad of the last step equals the gradient real torch's autograd computed (the
    torch side's p.grad); both sides start from the same weights and update them alike."""
    rank = runs.rank_dir("mindtorch", toy_id("L0", "tensor"), STEPS - 1)
    data = _load(rank)["data"]
    with np.load(runs.result("torch", toy_id("L0", "tensor"))["state"]) as torch_state:
        for module, names in (("linear1.Linear", ("weight", "bias")), ("norm.LayerNorm", ("weight", "bias")),
                              ("linear2.Linear", ("weight", "bias"))):
            rec = data[f"Module.{module}.parameters_grad.0"]
            assert set(rec) == set(names)
            for pname in names:
                expected = torch_state[f"grad.{module.split('.')[0]}.{pname}"]
                np.testing.assert_allclose(_npy(rank, rec[pname][0]), expected, rtol=1e-4, atol=1e-6)


def test_backward_records_hold_the_gradients_torch_would(runs):
    """Module backward: the gradient of the output in, the gradients of the inputs that require
    grad out; the first Linear's input is data, so it has none (as in torch)."""
    rank = runs.rank_dir("mindtorch", toy_id("mix", "tensor"))
    data = _load(rank)["data"]
    assert data["Module.linear1.Linear.backward.0"]["output"] == []
    # Functional.linear.0's inputs are (x, weight, bias): gradients of weight and bias only
    assert [s["shape"] for s in data["Functional.linear.0.backward"]["output"]] == [[4, 8], [4]]
    # Functional.linear.1's input requires grad: three gradients, the first of shape (10, 4)
    assert [s["shape"] for s in data["Functional.linear.1.backward"]["output"]] == [[10, 4], [2, 4], [2]]
    # the mean's input gradient is 1/numel everywhere
    mean_in = _npy(rank, data["Tensor.mean.0.backward"]["output"][0])
    np.testing.assert_allclose(mean_in, np.full((10, 2), 1 / 20, np.float32), rtol=1e-6)


def test_debug_level_saves_value_and_gradient(runs):
    rank = runs.rank_dir("mindtorch", "toy_debug")
    dump = _load(rank)
    assert dump["framework"] == "mindtorch" and dump["level"] == "debug"
    assert list(dump["data"]) == ["out.0.debug", "out_grad.0.debug"]
    _, y, _, out = _toy_numpy(runs.root)
    saved = _npy(rank, dump["data"]["out.0.debug"])
    np.testing.assert_allclose(saved, out, rtol=1e-5, atol=1e-6)
    # d mean((out - y)^2) / d out = 2 (out - y) / numel, from the saved output (numpy only)
    np.testing.assert_allclose(_npy(rank, dump["data"]["out_grad.0.debug"]),
                               2 * (saved - y) / saved.size, rtol=1e-5, atol=1e-7)


def test_stack_points_at_the_users_code(runs):
    rank = runs.rank_dir("mindtorch", toy_id("mix", "statistics"))
    stacks = _load(rank, "stack.json")
    frames = next(entry[1] for entry in stacks.values() if "Functional.gelu.0.forward" in entry[0])
    assert "h = self.norm(F.gelu(x1)) + x1" in frames[0] and "models.py" in frames[0]
    assert not any("site-packages/mindtorch" in f or "site-packages/mindspore" in f for f in frames)


def _same_bits(a: dict, b: dict) -> list:
    """The arrays of two state files whose bits differ."""
    with np.load(a["state"]) as sa, np.load(b["state"]) as sb:
        assert sorted(sa.files) == sorted(sb.files)
        return [k for k in sa.files if sa[k].dtype != sb[k].dtype or sa[k].tobytes() != sb[k].tobytes()]


@pytest.mark.parametrize("traced,plain", [(toy_id("L0", "tensor"), "toy_none"), ("gpt2_mix", "gpt2_none")])
def test_the_tool_never_changes_the_numbers(runs, traced, plain):
    """Losses, gradients and updated parameters bit-identical with and without the debugger
    (the toy at L0 over two steps; GPT-2 at mix, every module and API call tapped)."""
    a, b = runs.result("mindtorch", traced), runs.result("mindtorch", plain)
    assert a["losses"] == b["losses"]
    assert _same_bits(a, b) == []


def test_a_composite_call_sharing_its_input_may_regroup_a_gradient_sum(runs):
    """The one known exception (docs/mindtorch.md): on CPU mindtorch computes exact GELU from
    mul/erf/div, using its input twice, and the toy's linear1 output also feeds the residual add.
    The gradient tap on gelu's input sums gelu's two contributions before the residual's joins
    them, where MindSpore alone adds all three in arrival order: linear1's gradients move in their
    last digits (here < 1e-7 absolute). The forward and every other gradient stay bit-identical."""
    a, b = runs.result("mindtorch", toy_id("mix", "tensor")), runs.result("mindtorch", "toy_none")
    assert a["losses"][0] == b["losses"][0]
    differ = _same_bits(a, b)
    assert differ and set(differ) <= {"grad.linear1.weight", "grad.linear1.bias", "param.linear1.weight",
                                      "param.linear1.bias"}
    with np.load(a["state"]) as sa, np.load(b["state"]) as sb:
        for k in differ:
            np.testing.assert_allclose(sa[k], sb[k], rtol=1e-5, atol=1e-7)


def test_parameter_gradient_per_backward_or_accumulated(runs):
    """d sum(W x + b) / d b = the batch size (4) per backward. The parameter hook records each
    backward's gradient (the last one of the step); record_param_grads() re-reads p.grad, which
    mindtorch's value_and_grad accumulates over the step's two calls."""
    dump_root = runs.result("mindtorch", "accumulate")["dump"]
    grads = [_load(os.path.join(dump_root, f"step{s}", "rank"))["data"]["Module.0.Linear.parameters_grad.0"]
             for s in (0, 1)]
    assert [g["bias"][0]["Max"] for g in grads] == [4.0, 8.0]
    assert [g["weight"][0]["Min"] for g in grads] == [4.0, 8.0]


def test_the_scenario_is_detected(runs):
    seen = runs.result("mindtorch", "detect")
    assert seen["module"] == seen["tensor"] == seen["none"] == seen["list"] == "mindtorch"
    assert "mindtorch" in seen["bad_model_error"] and "object" in seen["bad_model_error"]
    dump = _load(seen["no_model_dump"])
    assert dump["framework"] == "mindtorch" and list(dump["data"]) == ["Torch.matmul.0.forward"]


def test_seed_002_example_runs_as_written(runs):
    """Seed 002's script: mindspore.value_and_grad(train_step, grad_position=0) over three
    batches. Every step is dumped with torch's names; backward reaches the records (MindSpore's
    default output gradient is all ones); the parameters are not differentiated there, so their
    taps never fire and no parameters_grad is written."""
    dump_root = runs.result("mindtorch", "seed002")["dump"]
    for step in range(3):
        rank = os.path.join(dump_root, f"step{step}", "rank")
        dump = _load(rank)
        assert dump["framework"] == "mindtorch"
        forward = ["Functional.linear.0.forward", "Module.linear1.Linear.forward.0", "Functional.linear.1.forward",
                   "Module.linear2.Linear.forward.0", "Functional.relu.0.forward"]
        assert [k for k in dump["data"] if k.endswith("forward") or ".forward." in k] == forward
        data = dump["data"]
        ones = data["Functional.relu.0.backward"]["input"][0]
        assert (ones["Max"], ones["Min"], ones["shape"]) == (1.0, 1.0, [10, 2])
        # linear2's input leads to the differentiated input: its gradient is there
        assert [s["shape"] for s in data["Functional.linear.1.backward"]["output"]] == [[10, 4]]
        assert not any("parameters_grad" in k for k in data)
