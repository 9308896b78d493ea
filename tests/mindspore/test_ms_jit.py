"""``mindspore.jit`` regions in PyNative (issue 31): a jit function and a jit Cell inside a net
trained by ``value_and_grad`` and by ``Model.train`` + ``MsprobeStep`` compile and run with
tsprobe on at every level, bit-identical to a run without it; ``Jit.{name}.{n}`` records (ast
capture) hold the regions' boundary values and gradients, checked against numpy; a torch
model against its MindSpore port that uses jit compares clean, and a bug inside a jit region
is named at its Jit record."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ts_core import PrecisionDebugger
from ts_core.dumpfmt import reference_stats

from ..conftest import load_dump, require
from .lazy import Lazy, helpers, ms

jn = Lazy("tests.mindspore.jit_nets")
ds = Lazy("mindspore.dataset")
train = Lazy("mindspore.train")
mnn = Lazy("mindspore.nn")
integ = Lazy("ts_integrations.mindspore")
ports = Lazy("tests.mindspore.ports")

pytestmark = require("mindspore")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LEVELS = ("L0", "L1", "mix")
MODES = ("ast", "bytecode")
STEPS = 2


def _train_value_and_grad(net, x, dbg=None):
    """STEPS steps of value_and_grad (loss = out.sum()) with a manual SGD update; the losses
    and gradients of every step, as numpy."""
    grad_fn = ms.value_and_grad(lambda inp: net(inp).sum(), None, net.trainable_params())
    seen = []
    for _ in range(STEPS):
        if dbg is not None:
            dbg.start(net)
        loss, grads = grad_fn(ms.Tensor(x))
        if dbg is not None:
            dbg.stop()
            dbg.step()
        for p, g in zip(net.trainable_params(), grads):
            p.set_data(p - 0.1 * g)
        seen.append((loss.asnumpy(), [g.asnumpy() for g in grads]))
    return seen


def _same_bits(a, b):
    return all(np.array_equal(la, lb) and len(ga) == len(gb) and all(np.array_equal(u, v) for u, v in zip(ga, gb))
               for (la, ga), (lb, gb) in zip(a, b)) and len(a) == len(b)


_BASELINE = {}


def _baseline(mode):
    if mode not in _BASELINE:
        _BASELINE[mode] = _train_value_and_grad(jn.make_net(mode), jn.make_input())
    return _BASELINE[mode]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", LEVELS)
def test_jit_regions_train_bit_identical_at_every_level(dump_root, mode, level):
    """The crash of issue 31 (the graph parser meeting tsprobe's hooks) is gone at every level
    and capture mode; the losses and gradients are those of a run without tsprobe."""
    task = "tensor" if level == "mix" else "statistics"
    dbg = PrecisionDebugger(dump_path=dump_root, level=level, task=task)
    try:
        seen = _train_value_and_grad(jn.make_net(mode), jn.make_input(), dbg)
    finally:
        dbg.close()
    assert _same_bits(seen, _baseline(mode))
    for step in range(STEPS):
        data = load_dump(helpers.rank_dir(dump_root, step))["data"]
        jits = sorted(k for k in data if k.startswith("Jit."))
        if level == "L0":                       # Cells only: the jit Cell at its own boundary
            assert not jits
            assert {"Cell.inner.Inner.forward.0", "Cell.inner.Inner.backward.0"} <= set(data)
        elif mode == "ast":                     # each region recorded once, forward and backward
            assert jits == ["Jit.Inner.0.backward", "Jit.Inner.0.forward",
                            "Jit.fused.0.backward", "Jit.fused.0.forward"]
        else:                                   # bytecode: no Jit record; what runs in PyNative is per API
            assert not jits
            assert "Primitive.bias_add.BiasAdd.0.forward" in data
        if level == "mix":
            assert "Cell.inner.Inner.forward.0" in data
    # tsprobe put back everything it patched
    from mindspore.graph import api, _parse
    assert "ts_core" not in api._JitExecutor.__call__.__code__.co_filename
    assert "ts_core" not in _parse.hook_wrapper.__code__.co_filename


def test_trace_regions_are_traced_without_tsprobe_inside(tmp_path):
    """capture_mode="trace" builds its graph from the ops its first call runs: with tsprobe's
    taps and statistics traced in, MindSpore failed ("The node adjoint is null"). Traced with
    tsprobe on first, then run again without it: the same bits; nothing inside is recorded.
    In a child process started as a script: MindSpore's trace reads the source line of every
    frame on the stack and fails on one without (pytest's, ``python -m``'s runpy frames), with
    or without tsprobe (jit_trace._get_caller_lines)."""
    script = os.path.join(REPO, "tests", "mindspore", "jit_trace_run.py")
    env = dict(os.environ, TSPROBE_QUIET="1", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, script, str(tmp_path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TRACE ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(line[len("TRACE "):])
    assert sorted(results) == sorted(LEVELS)
    for level, r in results.items():
        assert r["same_bits"] and r["depth_after"] == 0, (level, r)
        keys = r["keys"]
        assert not any(k.startswith("Jit.") or k.startswith("Cell.inner.fc.Dense.forward") for k in keys)
        assert ("Cell.inner.Inner.forward.0" in keys) == (level != "L1"), (level, keys)


def test_jit_function_calling_a_global_cell_compiles_with_its_hooks_hidden(dump_root):
    """The Cells a jit function reads as globals are compiled with it: tsprobe's forward hooks
    on them (L0) are out of their dicts while it compiles (else: 'Graph cycle exists'). The
    tsprobe run comes first, so the graph is compiled under the hooks."""
    net, x = jn.HeadNet(), jn.make_input()
    start = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", task="statistics")
    try:
        with_tool = _train_value_and_grad(net, x, dbg)
    finally:
        dbg.close()
    assert "Cell.head.Dense.parameters_grad.0" in load_dump(helpers.rank_dir(dump_root, 0))["data"]
    helpers.load_params(net, start)
    assert _same_bits(with_tool, _train_value_and_grad(net, x))


def _check(summary, want, rtol=1e-5, atol=1e-6):
    assert summary["shape"] == list(want.shape)
    ref = reference_stats(want)
    for k in ("Max", "Min", "Mean", "Norm"):
        assert summary[k] == pytest.approx(ref[k], rel=rtol, abs=atol), (k, summary[k], ref[k])


def test_jit_records_hold_the_regions_values_and_gradients(dump_root):
    """L1, ast: Jit.fused and Jit.Inner hold the inputs and outputs each region really saw and
    the gradients at its boundary, against the same net computed in float64 numpy."""
    net, x = jn.make_net("ast"), jn.make_input()
    want = jn.reference(net, x)
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", task="tensor", step=[0])
    try:
        _train_value_and_grad(net, x, dbg)
    finally:
        dbg.close()
    rank = helpers.rank_dir(dump_root)
    data = load_dump(rank)["data"]
    fused, inner = data["Jit.fused.0.forward"], data["Jit.Inner.0.forward"]
    assert len(fused["input_args"]) == 2 and len(inner["input_args"]) == 1     # no `self` for the Cell
    _check(fused["input_args"][0], want["h"])
    _check(fused["input_args"][1], want["w"])
    _check(fused["output"][0], want["f"])
    _check(inner["input_args"][0], want["f"])
    _check(inner["output"][0], want["out"])
    np.testing.assert_allclose(helpers.npy(rank, inner["output"][0]), want["out"], rtol=1e-5, atol=1e-6)
    fb, ib = data["Jit.fused.0.backward"], data["Jit.Inner.0.backward"]
    _check(ib["input"][0], want["g_out"])
    _check(ib["output"][0], want["g_f"])
    _check(fb["input"][0], want["g_f"])
    _check(fb["output"][0], want["g_h"])
    _check(fb["output"][1], want["g_w"])
    np.testing.assert_allclose(helpers.npy(rank, fb["output"][1]), want["g_w"], rtol=1e-5, atol=1e-6)


def _dataset():
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((8, 4)).astype(np.float32)
    ys = rng.standard_normal((8, 4)).astype(np.float32)
    return ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False).batch(2)


def _model_train(mode, callbacks=()):
    net = jn.make_net(mode)
    model = train.Model(net, mnn.MSELoss(), mnn.SGD(net.trainable_params(), 0.05))
    model.train(1, _dataset(), callbacks=list(callbacks), dataset_sink_mode=False)
    return {p.name: p.asnumpy() for p in net.get_parameters()}


@pytest.mark.parametrize("mode,level", [("ast", "mix"), ("bytecode", "L1")])
def test_model_train_with_msprobe_step_is_bit_identical(dump_root, mode, level):
    want = _model_train(mode)
    dbg = PrecisionDebugger(dump_path=dump_root, level=level, step=[0, 3])
    try:
        got = _model_train(mode, [integ.MsprobeStep(dbg)])
    finally:
        dbg.close()
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
    for step in (0, 3):
        data = load_dump(helpers.rank_dir(dump_root, step))["data"]
        # MindSpore's optimizers are jit Cells themselves (ast): the update is a Jit record too
        assert "Jit.SGD.0.forward" in data
        if mode == "ast":
            assert {"Jit.fused.0.forward", "Jit.fused.0.backward", "Jit.Inner.0.forward",
                    "Cell.inner.Inner.forward.0"} <= set(data)
        else:
            assert not any(k.startswith(("Jit.fused", "Jit.Inner")) for k in data)
            assert "Functional.sigmoid.0.backward" in data      # left to PyNative by PIJit


# ------------------------------------------------------------ torch vs its MindSpore port with jit
@pytest.fixture(scope="module")
def jit_dumps(tmp_path_factory):
    """The transformer port (ports.py) with a jit function (attention scores) and a jit Cell
    (FeedForward), ast capture, against torch; written once for the module."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("xf_jit")
    made = {}
    for level, bug in (("L1", None), ("mix", None), ("L1", "wrong_scale"), ("mix", "gelu_approx")):
        sub = os.path.join(str(root), f"{level}_{bug}")
        made[level, bug] = ports.dump_pair("transformer", sub, bug=bug, level=level, jit="ast")
    return made


def _compare(dirs):
    from ts_core.compare import compare
    return compare(*dirs, verbose=False)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_torch_vs_port_with_jit_compares_clean(jit_dumps, level):
    result = _compare(jit_dumps[level, None])
    assert result.first_divergence is None
    assert result.verdict == "pass", [(r.golden_key, r.target_key, r.arg, r.reason) for r in result.rows
                                      if r.verdict != "pass"]
    pairs = {(r.golden_key, r.target_key) for r in result.rows if r.golden_key and r.target_key}
    # each Jit record pairs with the run of torch calls it ports, forward and backward
    assert ("Torch.matmul.0.forward+Tensor.__mul__.0.forward", "Jit.attention_scores.0.forward") in pairs
    assert ("Tensor.__mul__.0.backward+Torch.matmul.0.backward", "Jit.attention_scores.0.backward") in pairs
    assert any(t == "Jit.FeedForward.0.forward" and g.startswith("Functional.linear.") for g, t in pairs)
    assert any(t == "Jit.FeedForward.0.backward" for _, t in pairs)
    if level == "mix":     # torch's modules inside the jit Cell: compared at the Jit record
        inside = [r for r in result.rows if r.golden_key == "Module.mlp.fc1.Linear.forward.0"]
        assert inside and all(r.target_key is None and "Jit.FeedForward.0.forward" in r.reason for r in inside)
        assert ("Module.mlp.FeedForward.forward.0", "Cell.mlp.FeedForward.forward.0") in pairs


@pytest.mark.parametrize("level,bug,jit_key", [("L1", "wrong_scale", "Jit.attention_scores.0.forward"),
                                               ("mix", "gelu_approx", "Jit.FeedForward.0.forward")])
def test_bug_inside_a_jit_region_is_named_at_its_jit_record(jit_dumps, level, bug, jit_key):
    fd = _compare(jit_dumps[level, bug]).first_divergence
    assert fd is not None and fd.direction == "forward"
    assert fd.target_key == jit_key
