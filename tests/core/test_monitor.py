"""Monitor mode (issue 16): a NaN or a spike injected at a known module and step is caught at that
step, named, and dumped with the steps before it; the training numbers stay bit-identical; the
per-step signals match an independent computation; bad config is a clear error."""
from __future__ import annotations

import copy
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

from tests.conftest import load_dump
from tests.core.models import CNN
from ts_core import AnomalyError, ConfigError, PrecisionDebugger
from ts_core.monitor import SpikeConfig, SpikeDetector


class Scale(nn.Module):
    """Multiplies by `factor`: set it to NaN to poison this module's output at a chosen step."""

    def __init__(self):
        super().__init__()
        self.factor = 1.0

    def forward(self, x):
        return x * self.factor


class _NanGrad(torch.autograd.Function):
    """Identity forward; backward gives NaN when `poison` is set (the forward stays finite)."""

    @staticmethod
    def forward(ctx, x, poison):
        ctx.poison = poison
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return (g * math.nan if ctx.poison else g), None


class GradPoison(nn.Module):
    def __init__(self):
        super().__init__()
        self.poison = False

    def forward(self, x):
        return _NanGrad.apply(x, self.poison)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.act = nn.GELU()
        self.scale = Scale()
        self.gp = GradPoison()
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        h = self.act(self.fc1(x))
        h = self.scale(h)  # MARK-SCALE
        return self.fc2(self.gp(h))


X = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))


def _train(model, debugger, steps, poison=None, *, grad_poison=None, loss_scale=None, opt_cls=torch.optim.SGD):
    """`steps` SGD steps under `debugger` (None: bare); returns per step the loss, the
    gradients (numpy, before the update) and fc1's weight/bias used by that step's forward."""
    opt = opt_cls(model.parameters(), lr=0.05)
    out = []
    for i in range(steps):
        if hasattr(model, "scale"):
            model.scale.factor = math.nan if i == poison else 1.0
            model.gp.poison = i == grad_poison
        before = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        if debugger is not None:
            debugger.start(model)
        loss = model(X).pow(2).mean()
        if loss_scale is not None and i == loss_scale[0]:
            loss = loss * loss_scale[1]
        loss.backward()
        grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        if debugger is not None:
            debugger.stop()
            debugger.step(loss=loss)
        out.append({"loss": loss.detach().clone(), "grads": grads, "before": before})
    return out


def _rows(dump):
    with open(os.path.join(dump, "monitor.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _line_of(marker):
    with open(__file__, encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, 1) if marker in line)


def test_forward_nan_caught_at_its_step_and_module(tmp_path, monkeypatch):
    monkeypatch.setenv("TSPROBE_QUIET", "1")
    torch.manual_seed(0)
    model = Net()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), monitor={"keep_steps": 3})
    hist = _train(model, dbg, 8, poison=5)
    caps = dbg.monitor.captures
    dbg.close()

    assert [c["step"] for c in caps] == [5]
    assert "nan" in caps[0]["reasons"]
    first = caps[0]["first"]
    assert first["key"] == "Module.scale.Scale.forward.0"
    assert first["tensor"] == "Module.scale.Scale.forward.0.output.0"
    assert first["direction"] == "forward"
    assert f"{os.path.basename(__file__)}, line {_line_of('MARK-SCALE')}" in first["source"]

    # the ring buffer (steps 3, 4, 5) is on disk as ordinary dumps; no other step is
    steps = sorted(int(d[4:]) for d in os.listdir(tmp_path) if d.startswith("step"))
    assert steps == [3, 4, 5]
    # step 4's fc1 output statistics equal an independent numpy computation
    d4 = load_dump(str(tmp_path / "step4" / "rank"))
    assert d4["level"] == "L0" and d4["task"] == "statistics"
    b = hist[4]["before"]
    ref = X.numpy().astype(np.float64) @ b["fc1.weight"].T.astype(np.float64) + b["fc1.bias"]
    out = d4["data"]["Module.fc1.Linear.forward.0"]["output"][0]
    assert out["Max"] == pytest.approx(ref.max(), rel=1e-5)
    assert out["Min"] == pytest.approx(ref.min(), rel=1e-5)
    assert out["Mean"] == pytest.approx(ref.mean(), rel=1e-5, abs=1e-6)
    assert out["Norm"] == pytest.approx(np.linalg.norm(ref), rel=1e-5)
    # the step-5 dump carries the NaN where the capture says
    d5 = load_dump(str(tmp_path / "step5" / "rank"))
    assert math.isnan(d5["data"]["Module.scale.Scale.forward.0"]["output"][0]["Max"])
    assert not math.isnan(d5["data"]["Module.scale.Scale.forward.0"]["input_args"][0]["Max"])

    rows = _rows(str(tmp_path))
    assert [r["step"] for r in rows] == list(range(8))
    for r, h in zip(rows, hist):
        if r["step"] >= 5:      # the NaN step, then NaN weights: logged, one capture only
            assert r["loss"] == "nan" and "nan" in r["trigger"]
            assert ("capture" in r) == (r["step"] == 5)
            continue
        assert "trigger" not in r
        assert r["loss"] == pytest.approx(float(h["loss"]), rel=1e-6)
        norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in h["grads"].values()))
        assert r["grad_norm"] == pytest.approx(norm, rel=1e-5)
        fc2 = math.sqrt(sum(float(np.sum(h["grads"][n].astype(np.float64) ** 2)) for n in ("fc2.weight", "fc2.bias")))
        assert r["module_grad_norms"]["fc2"] == pytest.approx(fc2, rel=1e-5)
        assert r["nonfinite"] == {"forward": 0, "backward": 0, "parameters_grad": 0}


def test_summary_names_the_first_nan_first(tmp_path, monkeypatch):
    from ts_core.compare.report.summary import summarize, summary_text

    monkeypatch.setenv("TSPROBE_QUIET", "1")
    torch.manual_seed(0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), monitor={"keep_steps": 2})
    _train(Net(), dbg, 4, poison=2)
    dbg.close()
    first_line = summary_text(summarize(str(tmp_path))).splitlines()[0]
    assert first_line.startswith("first NaN/Inf: step 2")
    assert "Module.scale.Scale.forward.0.output.0" in first_line and "MARK-SCALE" in first_line


def test_backward_nan_named_with_backward_records(tmp_path, monkeypatch):
    monkeypatch.setenv("TSPROBE_QUIET", "1")
    torch.manual_seed(0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), monitor={"backward": True, "keep_steps": 1})
    _train(Net(), dbg, 4, grad_poison=2)
    caps = dbg.monitor.captures
    dbg.close()
    assert [c["step"] for c in caps] == [2]
    first = caps[0]["first"]
    # the gradient reaching gp's output is finite; the one it passes to its input is NaN
    assert first["direction"] == "backward"
    assert first["key"] == "Module.gp.GradPoison.backward.0"
    assert first["tensor"] == "Module.gp.GradPoison.backward.0.output.0"
    rows = _rows(str(tmp_path))
    assert rows[2]["nonfinite"]["forward"] == 0 and rows[2]["nonfinite"]["backward"] > 0


def test_backward_nan_caught_by_default_through_parameter_gradients(tmp_path, monkeypatch):
    monkeypatch.setenv("TSPROBE_QUIET", "1")
    torch.manual_seed(0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), monitor={})
    _train(Net(), dbg, 4, grad_poison=2)
    caps = dbg.monitor.captures
    dbg.close()
    assert [c["step"] for c in caps] == [2]
    row = _rows(str(tmp_path))[2]
    assert row["nonfinite"]["forward"] == 0 and row["nonfinite"]["parameters_grad"] == 2   # fc1 weight, bias
    assert "fc1" in caps[0]["first"]["key"]


@pytest.mark.parametrize("make", [Net, CNN], ids=["mlp", "cnn-inplace"])
@pytest.mark.parametrize("monitor", [{}, {"backward": True}], ids=["default", "backward"])
def test_training_bit_identical_with_monitor(tmp_path, monkeypatch, make, monitor):
    monkeypatch.setenv("TSPROBE_QUIET", "1")
    torch.manual_seed(0)
    bare = make()
    watched = copy.deepcopy(bare)
    if make is CNN:
        global X
        x_saved, X = X, torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(2))
    try:
        ref = _train(bare, None, 5, opt_cls=torch.optim.Adam)
        dbg = PrecisionDebugger(dump_path=str(tmp_path), monitor=monitor)
        got = _train(watched, dbg, 5, opt_cls=torch.optim.Adam)
        dbg.close()
    finally:
        if make is CNN:
            X = x_saved
    for r, g in zip(ref, got):
        assert torch.equal(r["loss"], g["loss"])
        for n in r["grads"]:
            assert np.array_equal(r["grads"][n], g["grads"][n]), n
    for (n, p), q in zip(bare.named_parameters(), watched.parameters()):
        assert torch.equal(p, q), n
    for (n, b), c in zip(bare.named_buffers(), watched.buffers()):
        assert torch.equal(b, c), n
    assert len(_rows(str(tmp_path))) == 5


def test_loss_spike_caught_without_nan(tmp_path, monkeypatch):
    monkeypatch.setenv("TSPROBE_QUIET", "1")
    torch.manual_seed(0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), monitor={"keep_steps": 2})
    _train(Net(), dbg, 7, loss_scale=(5, 100.0))
    caps = dbg.monitor.captures
    dbg.close()
    assert [(c["step"], c["reasons"]) for c in caps] == [(5, ["loss_spike"])]
    assert caps[0]["first"] is None                       # nothing non-finite to name
    assert sorted(os.listdir(tmp_path)) == ["monitor.jsonl", "step4", "step5"]


def test_on_trigger_raise_and_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("TSPROBE_QUIET", "1")
    torch.manual_seed(0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "r"), monitor={"on_trigger": "raise", "keep_steps": 1})
    with pytest.raises(AnomalyError, match="anomaly at step 3") as info:
        _train(Net(), dbg, 6, poison=3)
    assert info.value.capture["first"]["key"] == "Module.scale.Scale.forward.0"
    assert os.path.isfile(tmp_path / "r" / "step3" / "rank" / "dump.json")
    dbg.close()

    dbg = PrecisionDebugger(dump_path=str(tmp_path / "s"), monitor={"on_trigger": "stop"})
    model = Net()
    for i, _ in enumerate(_train(model, dbg, 2)):
        assert not dbg.should_stop
    _train(model, dbg, 1, poison=0)
    assert dbg.should_stop
    dbg.close()


def test_after_steps_dumps_the_next_steps_at_the_configured_level(tmp_path, monkeypatch):
    monkeypatch.setenv("TSPROBE_QUIET", "1")
    torch.manual_seed(0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1", monitor={"keep_steps": 1, "after_steps": 2})
    _train(Net(), dbg, 6, poison=2)
    dbg.close()
    assert sorted(d for d in os.listdir(tmp_path) if d.startswith("step")) == ["step2", "step3", "step4"]
    assert load_dump(str(tmp_path / "step2" / "rank"))["level"] == "L0"
    for s in ("step3", "step4"):
        d = load_dump(str(tmp_path / s / "rank"))
        assert d["level"] == "L1" and any(k.startswith("Tensor.") or k.startswith("Torch.") for k in d["data"])


def test_spike_detector_agrees_with_lightning(tmp_path):
    """Our host-float detector flags the same first batch as Lightning's SpikeDetection."""
    spike_mod = pytest.importorskip("lightning.fabric.utilities.spike")
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1)
    rng = np.random.default_rng(0)
    checked = 0
    for trial in range(30):
        values = (2.0 + 0.3 * rng.standard_normal(25)).astype(np.float32)
        if trial % 3:
            values[rng.integers(3, 25)] *= rng.choice([3.0, 10.0, math.inf])
        kw = {"window": int(rng.integers(2, 8)), "warmup": int(rng.integers(0, 4)),
              "rtol": [None, 0.5, 2.0][trial % 3], "atol": [None, 0.1][trial % 2]}
        theirs = spike_mod.SpikeDetection(exclude_batches_path=str(tmp_path / "skip.json"), **kw)
        lightning_first = None
        for i, v in enumerate(values):
            try:
                theirs.on_train_batch_end(fabric, torch.tensor(v), None, i)
            except spike_mod.TrainingSpikeException:
                lightning_first = i
                break
        ours = SpikeDetector(SpikeConfig(**kw))
        our_first = next((i for i, v in enumerate(values) if ours.check(float(v))), None)
        assert our_first == lightning_first, (trial, kw, values)
        checked += lightning_first is not None
    assert checked >= 10          # the comparison saw real spikes, not only quiet series


@pytest.mark.parametrize("section, name, hint", [
    ({"keep_step": 3}, "monitor.keep_step", "monitor.keep_steps"),
    ({"keep_steps": 0}, "monitor.keep_steps", "int from 1"),
    ({"on_trigger": "halt"}, "monitor.on_trigger", "continue"),
    ({"loss_spike": {"mode": "up"}}, "monitor.loss_spike.mode", "min"),
    ({"loss_spike": {"rtol": -1}}, "monitor.loss_spike.rtol", ">= 0"),
    ([1], "monitor", "mapping"),
])
def test_bad_monitor_section_is_a_clear_error(tmp_path, section, name, hint):
    with pytest.raises(ConfigError) as info:
        PrecisionDebugger(dump_path=str(tmp_path), monitor=section)
    assert name in str(info.value) and hint in str(info.value)


def test_monitor_section_from_a_json_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TSPROBE_QUIET", "1")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "d"), "monitor": {}}))
    torch.manual_seed(0)
    dbg = PrecisionDebugger(config_path=str(cfg))
    _train(Net(), dbg, 3, poison=1)
    caps = dbg.monitor.captures
    dbg.close()
    assert [c["step"] for c in caps] == [1]
    assert sorted(os.listdir(tmp_path / "d")) == ["monitor.jsonl", "step0", "step1"]


def test_tensorboard_missing_is_a_clear_warning_and_jsonl_goes_on(tmp_path, monkeypatch):
    import builtins

    monkeypatch.setenv("TSPROBE_QUIET", "1")
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):          # as on a machine without tensorboard
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    torch.manual_seed(0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), monitor={"tensorboard": True})
    with pytest.warns(RuntimeWarning, match="pip install tensorboard"):
        _train(Net(), dbg, 2)
    dbg.close()
    assert [r["step"] for r in _rows(str(tmp_path))] == [0, 1]


def test_tensorboard_scalars_equal_the_jsonl_values(tmp_path, monkeypatch):
    """The event file, read back with tensorboard's own reader, holds per step exactly the
    numbers monitor.jsonl holds (loss, gradient norms, NaN/Inf counts), a NaN step included."""
    pytest.importorskip("tensorboard", reason="tensorboard is in the test extras")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("TSPROBE_QUIET", "1")
    torch.manual_seed(0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), monitor={"tensorboard": True})
    _train(Net(), dbg, 4, poison=2)
    dbg.close()
    rows = _rows(str(tmp_path))
    event_dir = tmp_path / "tensorboard" / "rank"
    assert os.listdir(event_dir), "no event file written"
    acc = EventAccumulator(str(event_dir), size_guidance={"scalars": 0})
    acc.Reload()
    expected = {"loss": [r["loss"] for r in rows], "grad_norm": [r["grad_norm"] for r in rows]}
    for part in ("forward", "backward", "parameters_grad"):
        expected[f"nonfinite/{part}"] = [r["nonfinite"][part] for r in rows]
    for module in ("fc1", "fc2"):
        expected[f"grad_norm/{module}"] = [r["module_grad_norms"][module] for r in rows]
    assert set(expected) <= set(acc.Tags()["scalars"])
    assert rows[2]["nonfinite"]["forward"] > 0 and rows[2]["loss"] == "nan"     # the poisoned step
    for tag, values in expected.items():
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [r["step"] for r in rows], tag
        got = np.array([e.value for e in events], dtype=np.float32)      # TensorBoard keeps float32
        want = np.array([float(v) for v in values], dtype=np.float32)     # jsonl writes NaN as "nan"
        np.testing.assert_array_equal(got, want, err_msg=tag)
