"""migrator.api_dump_init/start/stop/compare: TroubleShooter layout from PrecisionDebugger records."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .isolate import in_child_process, needs_mindspore as _needs_mindspore

from .nets import X, numpy_forward, run_ms, run_torch, weights


def _info(out, prefix):
    with open(Path(out) / "rank0" / f"{prefix}_api_dump_info.json") as f:
        return json.load(f)


def _npy(out, prefix, name):
    return np.load(Path(out) / "rank0" / f"{prefix}_api_dump" / f"{name}.npy")


def test_torch_layout_values_dropout_and_restore(tmp_path):
    import torch
    w = weights()
    originals = (torch.nn.functional.relu, torch.Tensor.__mul__, torch.Tensor.sum)
    net = run_torch(tmp_path, w)
    rank0 = tmp_path / "rank0"
    assert sorted(p.name for p in rank0.iterdir()) == ["torch_api_dump", "torch_api_dump_info.json",
                                                       "torch_api_dump_stack.json"]
    h, o, y = numpy_forward(w)
    np.testing.assert_allclose(_npy(tmp_path, "torch", "NN_Linear_0_forward_input.0"), X)
    np.testing.assert_allclose(_npy(tmp_path, "torch", "NN_ReLU_0_forward_output.0"), h, rtol=1e-5, atol=1e-6)
    # dropout ran with p=0 while dumping: output == input
    np.testing.assert_array_equal(_npy(tmp_path, "torch", "NN_Dropout_0_forward_output.0"),
                                  _npy(tmp_path, "torch", "NN_Dropout_0_forward_input.0"))
    np.testing.assert_allclose(_npy(tmp_path, "torch", "NN_Linear_1_forward_output.0"), o, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_npy(tmp_path, "torch", "Tensor___mul___0_forward_output.0"), y, rtol=1e-5, atol=1e-6)
    # backward: grad of fc2's input = W2^T (2 * 1[o > 0])
    g_o = 2.0 * (o > 0)
    np.testing.assert_allclose(_npy(tmp_path, "torch", "NN_Linear_1_backward_input.0"), g_o)
    np.testing.assert_allclose(_npy(tmp_path, "torch", "NN_Linear_1_backward_output.0"), g_o @ w["fc2.weight"],
                               rtol=1e-5, atol=1e-6)
    # the inner F.linear of nn.Linear is not listed separately; the container is not listed
    names = [e[0] for e in _info(tmp_path, "torch")]
    assert not any(n.startswith(("Functional_linear", "NN_Net", "NN_Sequential")) for n in names)
    first = _info(tmp_path, "torch")[0]
    assert first[0] == "NN_Linear_0_forward_input.0" and first[3] == "torch.float32" and first[4] == [2, 3]
    np.testing.assert_allclose(first[5], [X.max(), X.min(), X.mean()], rtol=1e-6)
    stack = json.loads((rank0 / "torch_api_dump_stack.json").read_text())
    assert "NN_Linear_0_forward" in stack and any("nets.py" in line for line in stack["NN_Linear_0_forward"])
    assert not any(k.endswith("backward") for k in stack)
    # restored: dropout p, and no patch left on torch functions
    assert net.drop.p == 0.5
    assert (torch.nn.functional.relu, torch.Tensor.__mul__, torch.Tensor.sum) == originals
    assert not net.fc._forward_hooks and not net.fc._forward_pre_hooks


def test_torch_inplace_input_recorded_before_mutation(tmp_path):
    import torch
    from ts_core.compat import migrator

    class M(torch.nn.Module):
        def forward(self, x):
            y = x * 1.0
            y.add_(1.0)
            return y

    migrator.api_dump_init(M(), str(tmp_path))
    migrator.api_dump_start()
    M()(torch.from_numpy(X.copy()))
    migrator.api_dump_stop()
    np.testing.assert_array_equal(_npy(tmp_path, "torch", "Tensor_add__0_forward_input.0"), X)
    np.testing.assert_array_equal(_npy(tmp_path, "torch", "Tensor_add__0_forward_output.0"), X + 1)


def test_torch_bfloat16(tmp_path):
    import torch
    from ts_core.compat import migrator
    lin = torch.nn.Sequential(torch.nn.Linear(3, 2)).to(torch.bfloat16)
    migrator.api_dump_init(lin, str(tmp_path))
    migrator.api_dump_start()
    x = torch.from_numpy(X.copy()).to(torch.bfloat16)
    out = lin(x)
    migrator.api_dump_stop()
    a = _npy(tmp_path, "torch", "NN_Linear_0_forward_output.0")
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, out.float().detach().numpy())
    assert _info(tmp_path, "torch")[1][3] == "torch.bfloat16"


def test_modes_and_dump_types(tmp_path):
    w = weights()
    run_torch(tmp_path / "list", w, mode="list", scope=["NN_Linear_1_forward", "Tensor_sum_0"])
    assert {e[0].split("_forward")[0].split("_backward")[0] for e in _info(tmp_path / "list", "torch")} == \
        {"NN_Linear_1", "Tensor_sum_0"}
    run_torch(tmp_path / "range", w, mode="range", scope=["NN_ReLU_0", "NN_Linear_1"])
    assert [e[0] for e in _info(tmp_path / "range", "torch") if "_forward_output" in e[0]] == \
        ["NN_ReLU_0_forward_output.0", "NN_Dropout_0_forward_output.0", "NN_Linear_1_forward_output.0"]
    run_torch(tmp_path / "api", w, mode="api_list", scope=["relu"])
    assert {e[0].split("_forward")[0].split("_backward")[0] for e in _info(tmp_path / "api", "torch")} == \
        {"NN_ReLU_0", "Functional_relu_0"}
    run_torch(tmp_path / "stats", w, dump_type="statistics")
    assert not list((tmp_path / "stats" / "rank0" / "torch_api_dump").iterdir())
    assert all(v is not None for v in _info(tmp_path / "stats", "torch")[0][5])
    run_torch(tmp_path / "stack", w, dump_type="stack")
    assert not list((tmp_path / "stack" / "rank0" / "torch_api_dump").iterdir())
    assert _info(tmp_path / "stack", "torch")[0][5] == [None, None, None]
    run_torch(tmp_path / "npy", w, dump_type="npy")
    assert _info(tmp_path / "npy", "torch")[0][5] == [None, None, None]
    assert (tmp_path / "npy" / "rank0" / "torch_api_dump" / "NN_Linear_0_forward_input.0.npy").is_file()
    from ts_core.compat import migrator
    with pytest.raises(ValueError, match="dump_type"):
        migrator.api_dump_start(dump_type="bogus")


def _read_csv(p):
    with open(p, newline="") as f:
        return list(csv.reader(f))


def test_same_framework_compare_and_perturbed_weight(tmp_path):
    from ts_core.compat import migrator
    w = weights()
    run_torch(tmp_path / "a", w)
    run_torch(tmp_path / "b", w)
    r = migrator.api_dump_compare(str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "cmp"))
    assert r["forward"] and all(row[4] is True for row in r["forward"] + r["backward"])
    for f in ("ts_api_mapping.csv", "ts_api_forward_compare.csv", "ts_api_backward_compare.csv"):
        assert (tmp_path / "cmp" / f).is_file()
    w2 = dict(w)
    w2["fc2.weight"] = w["fc2.weight"] * 1.01
    run_torch(tmp_path / "c", w2)
    r = migrator.api_dump_compare(str(tmp_path / "a"), str(tmp_path / "c"))
    fwd = {row[0]: row[4] for row in r["forward"]}
    assert fwd["NN_Linear_0_forward_output.0"] and fwd["NN_Dropout_0_forward_output.0"]
    assert fwd["NN_Linear_1_forward_input.0"] is True
    assert fwd["NN_Linear_1_forward_output.0"] is False and fwd["Functional_relu_0_forward_input.0"] is False
    bwd = {row[0]: row[4] for row in r["backward"]}
    assert bwd["NN_Linear_1_backward_output.0"] is False      # W2^T g changes with W2
    assert bwd["Tensor_sum_0_backward_input.0"] is True


def test_statistics_only_compare_and_steps(tmp_path):
    from ts_core.compat import migrator
    w = weights()
    run_torch(tmp_path / "a", w, steps=2, dump_type="statistics")
    run_torch(tmp_path / "b", w, steps=2, dump_type="statistics")
    r = migrator.api_dump_compare(str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "cmp"))
    assert len(r["forward"]) == 2
    assert all(row[4] is True for s in r["forward"] for row in s)
    assert sorted(os.listdir(tmp_path / "cmp")) == sorted(
        f"ts_api_{k}_{s}.csv" for k in ("mapping", "forward_compare", "backward_compare") for s in (0, 1))
    # the second step's names continue the counters
    assert _read_csv(tmp_path / "cmp" / "ts_api_mapping_1.csv")[1] == ["NN_Linear_2", "NN_Linear_2"]


@in_child_process
def test_torch_vs_mindspore_all_true_then_perturbed(tmp_path):
    _needs_mindspore()
    from ts_core.compat import migrator
    w = weights()
    run_ms(tmp_path / "ms", w)
    run_torch(tmp_path / "pt", w)
    assert (tmp_path / "ms" / "rank0" / "mindspore_api_dump" / "NN_Dense_0_forward_output.0.npy").is_file()
    r = migrator.api_dump_compare(str(tmp_path / "ms"), str(tmp_path / "pt"), str(tmp_path / "cmp"))
    assert ("NN_Dense_0", "NN_Linear_0") in r["mapping"] and ("NN_Dense_1", "NN_Linear_1") in r["mapping"]
    assert len(r["forward"]) == 14 and all(row[4] is True for row in r["forward"])
    assert len(r["backward"]) == 14 and all(row[4] is True for row in r["backward"])
    head = _read_csv(tmp_path / "cmp" / "ts_api_forward_compare.csv")[0]
    assert head[:2] == ["ORIGIN NET (mindspore)", "TARGET NET (torch)"]
    w2 = dict(w)
    w2["fc.bias"] = w["fc.bias"] + 0.05
    run_torch(tmp_path / "pt2", w2)
    r = migrator.api_dump_compare(str(tmp_path / "ms"), str(tmp_path / "pt2"))
    fwd = {row[0]: row[4] for row in r["forward"]}
    assert fwd["NN_Dense_0_forward_input.0"] is True
    assert fwd["NN_Dense_0_forward_output.0"] is False


@in_child_process
def test_torch_vs_mindspore_extra_call_and_renamed_layers(tmp_path):
    """The port makes one call torch does not (a reshape after fc) and its layers are Dense where
    torch's are Linear: paired through torch_mapping.yaml and the compare's aligner, the extra
    call stays alone and everything after it still pairs (and agrees), in either direction."""
    _needs_mindspore()
    from ts_core.compat import migrator
    w = weights()
    run_ms(tmp_path / "ms", w, extra_reshape=True)
    run_torch(tmp_path / "pt", w)
    expected = [("NN_Dense_0", "NN_Linear_0"), ("Functional_reshape_0", None), ("NN_ReLU_0", "NN_ReLU_0"),
                ("NN_Dropout_0", "NN_Dropout_0"), ("NN_Dense_1", "NN_Linear_1"),
                ("Functional_relu_0", "Functional_relu_0"), ("Tensor___mul___0", "Tensor___mul___0"),
                ("Tensor_sum_0", "Tensor_sum_0")]
    r = migrator.api_dump_compare(str(tmp_path / "ms"), str(tmp_path / "pt"))
    assert r["mapping"] == expected
    rows = {row[0]: row for row in r["forward"] + r["backward"]}
    assert rows["Functional_reshape_0_forward_output.0"][1] is None
    paired = [row for row in r["forward"] + r["backward"] if row[1] is not None]
    assert len(paired) == 28 and all(row[4] is True for row in paired)
    assert rows["NN_Dense_1_forward_output.0"][1] == "NN_Linear_1_forward_output.0"
    assert rows["NN_Dense_0_backward_output.0"][1] == "NN_Linear_0_backward_output.0"
    r = migrator.api_dump_compare(str(tmp_path / "pt"), str(tmp_path / "ms"), ignore_unmatched=True)
    assert r["mapping"] == [(b, a) for a, b in expected if b is not None]
    assert all(row[4] is True for row in r["forward"] + r["backward"])


def test_python_dash_c(tmp_path):
    code = ("import torch; from ts_core.compat import migrator; "
            "net = torch.nn.Sequential(torch.nn.Linear(3, 2)); migrator.api_dump_init(net, %r); migrator.api_dump_start(); "
            "net(torch.ones(1, 3)).relu(); migrator.api_dump_stop()") % str(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    names = [e[0] for e in _info(tmp_path, "torch")]
    assert names[:2] == ["NN_Linear_0_forward_input.0", "NN_Linear_0_forward_output.0"]
    assert "Tensor_relu_0_forward_output.0" in names


@in_child_process
def test_mindspore_bfloat16_and_layout(tmp_path):
    _needs_mindspore()
    import mindspore as ms
    from ts_core.backends.mindspore._runtime import warm_up
    from ts_core.compat import migrator
    warm_up()

    class Scale(ms.nn.Cell):          # no bfloat16 ReLU kernel on CPU: a leaf Cell of our own
        def construct(self, x):
            return x * 3

    class Net(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.scale = Scale()

        def construct(self, x):
            return self.scale(x) + x

    net = Net()
    migrator.api_dump_init(net, str(tmp_path))
    migrator.api_dump_start()
    x = ms.Tensor(X.copy()).astype(ms.bfloat16)
    out = net(x)
    migrator.api_dump_stop()
    assert sorted(p.name for p in (tmp_path / "rank0").iterdir()) == [
        "mindspore_api_dump", "mindspore_api_dump_info.json", "mindspore_api_dump_stack.json"]
    xf = x.astype(ms.float32).asnumpy()
    a = _npy(tmp_path, "mindspore", "NN_Scale_0_forward_output.0")
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, (x * 3).astype(ms.float32).asnumpy())
    np.testing.assert_array_equal(_npy(tmp_path, "mindspore", "NN_Scale_0_forward_input.0"), xf)
    np.testing.assert_array_equal(_npy(tmp_path, "mindspore", "Tensor___add___0_forward_output.0"),
                                  out.astype(ms.float32).asnumpy())
    info = {e[0]: e for e in _info(tmp_path, "mindspore")}
    assert "bfloat16" in info["NN_Scale_0_forward_input.0"][3].lower()
    assert not any(n.startswith("Tensor___mul__") for n in info)    # inside the leaf Cell


def test_api_inside_container_is_listed_inside_leaf_is_not(tmp_path):
    import torch
    from ts_core.compat import migrator

    class Block(torch.nn.Module):          # a container: its own API calls are listed
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.tanh(self.lin(x))

    net = torch.nn.Sequential(Block(), Block())
    migrator.api_dump_init(net, str(tmp_path))
    migrator.api_dump_start()
    x = torch.from_numpy(X.copy())
    out = net(x)
    migrator.api_dump_stop()
    order = [e[0] for e in _info(tmp_path, "torch") if e[0].endswith("forward_output.0")]
    assert order == ["NN_Linear_0_forward_output.0", "Functional_tanh_0_forward_output.0",
                     "NN_Linear_1_forward_output.0", "Functional_tanh_1_forward_output.0"]
    np.testing.assert_allclose(_npy(tmp_path, "torch", "Functional_tanh_1_forward_output.0"),
                               out.detach().numpy(), rtol=1e-6)


def test_unmatched_rows_and_compare_statedict(tmp_path):
    from ts_core.compat import migrator
    w = weights()
    run_torch(tmp_path / "a", w)
    run_torch(tmp_path / "b", w, mode="list", scope=["NN_Linear_0", "NN_Linear_1"])
    r = migrator.api_dump_compare(str(tmp_path / "a"), str(tmp_path / "b"))
    assert ("NN_ReLU_0", None) in r["mapping"]
    rows = {row[0]: row for row in r["forward"]}
    assert rows["NN_ReLU_0_forward_output.0"][1] is None and rows["NN_ReLU_0_forward_output.0"][4] is None
    assert rows["NN_Linear_1_forward_output.0"][4] is True
    r = migrator.api_dump_compare(str(tmp_path / "a"), str(tmp_path / "b"), ignore_unmatched=True)
    assert r["mapping"] == [("NN_Linear_0", "NN_Linear_0"), ("NN_Linear_1", "NN_Linear_1")]
    assert all(row[1] is not None and row[4] is True for row in r["forward"] + r["backward"])

    import torch
    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    migrator.api_dump_init(net, str(tmp_path / "sd"), compare_statedict=True)
    sd = np.load(tmp_path / "sd" / "rank0" / "pt_net.npz", allow_pickle=False)
    np.testing.assert_array_equal(sd["0.weight"], net[0].weight.detach().numpy())
