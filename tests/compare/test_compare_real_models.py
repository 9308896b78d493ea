"""Issue 3 §7: two runs of a real model with a bug at a known place; the first divergence is named exactly."""
import importlib.util
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from ts_core.compare import compare  # noqa: E402

try:
    from ts_core import PrecisionDebugger
except ImportError:  # the dump backend is not there yet
    PrecisionDebugger = None

from compare_models import build, train_step  # noqa: E402

pytestmark = pytest.mark.skipif(PrecisionDebugger is None,
                                reason="ts_core.PrecisionDebugger is not importable (dump backend missing)")
HERE = os.path.dirname(os.path.abspath(__file__))


def dump(path, level="mix", task="tensor", **kw):
    model, x = build(**kw)
    debugger = PrecisionDebugger(dump_path=str(path), task=task, level=level, step=[0])
    debugger.start(model)
    train_step(model, x)
    debugger.stop()
    debugger.step()
    debugger.close()
    return path


def first(tmp_path, level="mix", task="tensor", **kw):
    g = dump(tmp_path / "golden", level, task)
    t = dump(tmp_path / "target", level, task, **kw)
    return compare(g, t, tmp_path / "out", verbose=False)


@pytest.mark.parametrize("level", ["L1", "mix", "L0"])
def test_identical_runs_report_no_divergence(tmp_path, level):
    r = first(tmp_path, level)
    assert r.first_divergence is None
    assert r.counts["error"] == r.counts["warning"] == 0
    assert r.counts["unmatched_golden"] == r.counts["unmatched_target"] == 0
    assert r.counts["matched"] > 20 and r.pairs[0].modes == ["tensor"]


@pytest.mark.parametrize("level,key,cause", [
    ("L1", "Functional.linear.2.forward", "input.1 (not produced by any earlier recorded call"),
    ("mix", "Functional.linear.2.forward", "input.1 (the parameter weight of Module.layers.1.fc1.Linear.forward.0)"),
    ("L0", "Module.layers.1.fc1.Linear.forward.0", "parameters.weight (a parameter)"),
])
def test_perturbed_weight_in_one_layer(tmp_path, level, key, cause):
    fd = first(tmp_path, level, perturb=True).first_divergence
    assert (fd.key, fd.direction) == (key, "forward")
    assert cause in fd.cause
    assert fd.source.endswith("h = self.fc2(self.act(self.fc1(x)))")
    if level == "mix":
        assert fd.module == "Module.layers.1.fc1.Linear.forward.0"


def test_perturbed_weight_statistics_only(tmp_path):
    fd = first(tmp_path, "L0", task="statistics", perturb=True).first_divergence
    assert fd.key == "Module.layers.1.fc1.Linear.forward.0"
    assert fd.statistics_based and fd.reason.startswith("statistics-based")


@pytest.mark.parametrize("level,key,cause", [
    ("mix", "Functional.layer_norm.1.forward", "input.4 (golden 1e-05, target 0.01)"),
    ("L0", "Module.layers.1.norm.LayerNorm.forward.0", "its inputs and parameters match"),
])
def test_layernorm_eps_changed(tmp_path, level, key, cause):
    fd = first(tmp_path, level, bug={"eps": 1e-2}).first_divergence
    assert (fd.key, fd.direction) == (key, "forward") and cause in fd.cause
    assert fd.source.endswith("return self.norm(x + self.gate(h))")


@pytest.mark.parametrize("level,key,cause", [
    ("L1", "Functional.gelu.1.forward", "input.approximate (golden 'none', target 'tanh')"),
    ("L0", "Module.layers.1.act.GELU.forward.0", "its inputs and parameters match"),
])
def test_gelu_approximate_changed(tmp_path, level, key, cause):
    fd = first(tmp_path, level, bug={"approximate": "tanh"}).first_divergence
    assert (fd.key, fd.direction) == (key, "forward") and cause in fd.cause


def test_custom_autograd_function_with_wrong_backward(tmp_path):
    r = first(tmp_path, "L0", bug={"wrong": True})
    fd = r.first_divergence
    assert (fd.key, fd.direction) == ("Module.layers.1.gate.Gate.backward.0", "backward")
    assert "its inputs and parameters match" in fd.cause
    assert all(row.verdict == "pass" for row in r.rows if row.direction == "forward")


def test_wrong_backward_at_api_level_points_at_the_buggy_line(tmp_path):
    """At mix level the ops inside the custom backward are recorded as API calls; the extra
    ``1 - y`` is the call that changes the gradient."""
    fd = first(tmp_path, "mix", bug={"wrong": True}).first_divergence
    assert fd.key == fd.target_key == "Tensor.__rsub__.2.forward"
    assert "only in target" in fd.cause
    assert "in backward" in fd.source and fd.source.endswith("d = 1 - y          # the bug")


def test_one_extra_call_keeps_alignment(tmp_path):
    r = first(tmp_path, "mix", bug={"extra": True})
    assert r.first_divergence is None and r.counts["error"] == 0
    assert r.counts["unmatched_golden"] == 0
    extra = {row.target_key for row in r.rows if row.golden_key is None}
    assert extra and all(k.startswith("Tensor.__mul__.") for k in extra)
    assert r.counts["unmatched_target"] == len(extra) <= 2      # the call and its backward
    # the calls after it keep their partners though the __mul__ counters shifted
    assert any(row.golden_key != row.target_key and row.golden_key and row.target_key for row in r.rows)


needs_msprobe = pytest.mark.skipif(importlib.util.find_spec("msprobe") is None,
                                   reason="mindstudio-probe (msprobe) is not installed")


@pytest.fixture(scope="module")
def msprobe_dump(tmp_path_factory):
    """msprobe tensor dump: step0 clean, step1 with a perturbed weight (one subprocess)."""
    out = tmp_path_factory.mktemp("msprobe") / "dump"
    code = f"from compare_models import run_msprobe; run_msprobe({str(out)!r})"
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return out


@pytest.mark.msprobe
@needs_msprobe
def test_msprobe_tensor_dumps_are_read_and_compared(msprobe_dump):
    g, t = msprobe_dump / "step0", msprobe_dump / "step1"
    rank = next(g.iterdir())
    assert rank.name.startswith("proc")                                   # msprobe's rank folder
    assert any(p.suffix == ".pt" for p in (rank / "dump_tensor_data").iterdir())
    r = compare(g, t, verbose=False)
    fd = r.first_divergence
    assert (fd.key, fd.module) == ("Functional.linear.2.forward", "Module.layers.1.fc1.Linear.forward.0")
    assert r.pairs[0].modes == ["tensor"]                                 # .pt files were read
    assert fd.source.endswith("h = self.fc2(self.act(self.fc1(x)))")
    assert r.counts["unmatched_golden"] == r.counts["unmatched_target"] == 0
    assert compare(g, g, verbose=False).first_divergence is None


@pytest.mark.msprobe
@needs_msprobe
def test_tsprobe_and_msprobe_dumps_of_the_same_run_agree_in_forward(msprobe_dump, tmp_path):
    ts = dump(tmp_path / "ts", "mix", "statistics")
    r = compare(ts, msprobe_dump / "step0", verbose=False)
    forward = [row for row in r.rows if row.direction == "forward"]
    assert len(forward) > 50
    assert all(row.verdict == "pass" and row.mode == "statistics" for row in forward)
