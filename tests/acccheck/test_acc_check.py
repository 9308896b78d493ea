"""tsprobe acc-check on real torch runs: clean float32 and bfloat16 runs pass, deliberately
inaccurate ops are found, calls that cannot be replayed are listed with the reason."""
from __future__ import annotations

import csv
import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ts_core import PrecisionDebugger
from ts_core.acccheck import acc_check

from . import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = "tests.acccheck.kernels"


class Net(nn.Module):
    """Linear -> norm -> activation -> residual with a reduction -> linear -> softmax."""

    def __init__(self, act=None, norm=None):
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(32, 64), nn.LayerNorm(64), nn.Linear(64, 8)
        self.act, self.norm = act, norm

    def forward(self, x):
        h = self.fc1(x)
        h = self.norm(h, self.ln.weight, self.ln.bias) if self.norm else self.ln(h)
        h = self.act(h) if self.act else F.gelu(h)      # looked up per call: the debugger's wrapper
        h = h + x.mean(-1, keepdim=True)
        return torch.softmax(self.fc2(h), -1)


def dump_run(path: str, dtype=torch.float32, task="tensor", level="L1", custom=(), model=None, seed=0) -> str:
    """One training step of `model` (default Net) in `dtype`, dumped; returns the dump root."""
    torch.manual_seed(seed)
    model = (model or Net()).to(dtype)
    x = torch.randn(16, 32, dtype=dtype)
    target = torch.randn(16, 8, dtype=dtype)
    dbg = PrecisionDebugger(task=task, level=level, dump_path=path, step=[0])
    for module, name, prefix in custom:
        dbg.register_custom_api(module, name, prefix)
    try:
        dbg.start(model)
        (model(x) * target).sum().backward()
        dbg.stop()
        dbg.step()
    finally:
        dbg.close()
    return path


def forward_api_keys(root: str) -> list:
    with open(os.path.join(root, "step0", "rank", "dump.json"), encoding="utf-8") as f:
        data = json.load(f)["data"]
    return [k for k in data if k.endswith(".forward") and not k.startswith("Module.")]


def by_key(result) -> dict:
    return {c.key: c for c in result.calls}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_clean_run_passes_every_call(tmp_path, dtype):
    root = dump_run(str(tmp_path / "dump"), dtype)
    result = acc_check(root, str(tmp_path / "out"), verbose=False)
    keys = forward_api_keys(root)
    assert [c.key for c in result.calls] == keys          # every recorded call, in execution order
    assert [c.key for c in result.calls if c.status != "pass"] == []
    calls = by_key(result)
    assert calls["Functional.linear.0.forward"].backward == "pass"     # gradients graded too
    assert calls["Functional.layer_norm.0.forward"].backward == "pass"
    with open(tmp_path / "out" / "accuracy_checking_result.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["key"] for r in rows] == keys and {r["forward"] for r in rows} == {"pass"}
    summary = json.loads((tmp_path / "out" / "acc_check_summary.json").read_text())
    assert summary["counts"]["pass"] == len(keys) and summary["failed"] == [] and summary["skipped"] == []


def test_metrics_match_an_independent_numpy_reference(tmp_path):
    root = dump_run(str(tmp_path / "dump"), torch.bfloat16)
    result = acc_check(root, verbose=False)
    data_dir = tmp_path / "dump" / "step0" / "rank" / "dump_tensor_data"
    x, w, b = (np.load(data_dir / f"Functional.linear.0.forward.input.{i}.npy").astype(np.float64) for i in range(3))
    recorded = np.load(data_dir / "Functional.linear.0.forward.output.0.npy").astype(np.float64)
    ref = x @ w.T + b
    row = next(r for r in result.details if r.name == "Functional.linear.0.forward.output.0")
    assert row.max_abs_err == pytest.approx(np.abs(recorded - ref).max(), rel=1e-9)
    assert row.dtype == "torch.bfloat16" and row.bench_dtype == "float64" and row.standard == "benchmark"
    diff = recorded - ref
    assert row.eb == pytest.approx(abs(int((diff > 0).sum()) - int((diff < 0).sum())) / diff.size)
    # ULP of bfloat16 (7 mantissa bits) at each reference value's exponent
    ulp = np.abs(diff) * np.exp2(7 - np.floor(np.log2(np.abs(ref))))
    assert row.max_ulp_err == pytest.approx(ulp.max(), rel=1e-9)


def test_finds_an_inaccurate_framework_op(tmp_path):
    """The run's F.gelu is a bad approximation (as a vendor kernel might be); acc-check replays
    the real torch.nn.functional.gelu and names that call, and only that call."""
    def bad_gelu(x, approximate="none"):
        return x * torch.sigmoid(1.5 * x)            # x * sigmoid(1.702 x) would be the usual shortcut

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "gelu", bad_gelu)
        root = dump_run(str(tmp_path / "dump"), torch.bfloat16)
    assert torch.nn.functional.gelu is not bad_gelu
    result = acc_check(root, verbose=False)
    failed = [c.key for c in result.failed]
    assert failed == ["Functional.gelu.0.forward"]
    call = by_key(result)["Functional.gelu.0.forward"]
    assert call.forward == "error" and "kernel's" in call.message
    assert "test_acc_check.py" in (call.source or "")


def test_custom_kernels_graded_against_references(tmp_path):
    custom = [(kernels, "wrong_gelu", None), (kernels, "tanh_gelu", None), (kernels, "fp8_layer_norm", None)]
    model = Net(act=lambda h: kernels.wrong_gelu(kernels.tanh_gelu(h)), norm=lambda *a: kernels.fp8_layer_norm(*a))
    root = dump_run(str(tmp_path / "dump"), torch.bfloat16, custom=custom, model=model)
    tanh = functools.partial(F.gelu, approximate="tanh")
    refs = {f"{KERNELS}.wrong_gelu": tanh, f"{KERNELS}.tanh_gelu": tanh,
            f"{KERNELS}.fp8_layer_norm": f"{KERNELS}.layer_norm"}
    result = acc_check(root, references=refs, verbose=False)
    calls = by_key(result)
    assert calls[f"{KERNELS}.wrong_gelu.0.forward"].forward == "error"
    assert calls[f"{KERNELS}.fp8_layer_norm.0.forward"].forward == "error"
    assert calls[f"{KERNELS}.tanh_gelu.0.forward"].status == "pass"        # the faithful kernel
    assert {c.key for c in result.failed} == {f"{KERNELS}.wrong_gelu.0.forward", f"{KERNELS}.fp8_layer_norm.0.forward"}
    # without references they replay through their own code: a formula error is invisible then
    plain = by_key(acc_check(root, verbose=False))
    assert plain[f"{KERNELS}.wrong_gelu.0.forward"].forward == "pass"
    assert "its own code" in plain[f"{KERNELS}.wrong_gelu.0.forward"].message


def test_self_replay_finds_precision_loss(tmp_path):
    """row_sum_sq accumulates 512 products in bfloat16: its own float64 replay shows the loss."""
    model = Net(act=lambda h: h + kernels.row_sum_sq(h.repeat(1, 8))[:, None] * 1e-3)
    root = dump_run(str(tmp_path / "dump"), torch.bfloat16, custom=[(kernels, "row_sum_sq", None)], model=model)
    calls = by_key(acc_check(root, verbose=False))
    call = calls[f"{KERNELS}.row_sum_sq.0.forward"]
    assert call.forward == "error" and "ULP" in call.message
    f32 = by_key(acc_check(dump_run(str(tmp_path / "f32"), torch.float32, custom=[(kernels, "row_sum_sq", None)],
                                    model=Net(act=lambda h: h + kernels.row_sum_sq(h.repeat(1, 8))[:, None] * 1e-3)),
                           verbose=False))
    assert f32[f"{KERNELS}.row_sum_sq.0.forward"].forward == "pass"          # fine in float32


class Dropper(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 8)

    def forward(self, x):
        h = F.dropout(self.fc(x), 0.5, training=True)
        return kernels_alias.scaled(h) + F.dropout(h, 0.5, training=False)


class _Alias:
    """A custom API under a prefix that is not a module name (api_prefix="MyKernels")."""

    @staticmethod
    def scaled(h):
        return h * 2.0


kernels_alias = _Alias()


def test_unreplayable_calls_are_listed_with_the_reason(tmp_path):
    root = dump_run(str(tmp_path / "dump"), custom=[(kernels_alias, "scaled", "MyKernels")], model=Dropper())
    result = acc_check(root, verbose=False)
    calls = by_key(result)
    assert [c.key for c in result.calls] == forward_api_keys(root)        # none dropped
    assert calls["Functional.dropout.0.forward"].status == "skip"
    assert "random" in calls["Functional.dropout.0.forward"].message
    assert calls["Functional.dropout.1.forward"].status == "pass"          # training=False: the identity
    assert calls["MyKernels.scaled.0.forward"].status == "skip"
    assert "--reference MyKernels.scaled=" in calls["MyKernels.scaled.0.forward"].message
    reasons = {s["reason"]: s["count"] for s in result.summary()["skipped"]}
    assert sum(reasons.values()) == 2
    # a statistics dump holds no inputs to replay
    stats = acc_check(dump_run(str(tmp_path / "stats"), task="statistics"), verbose=False)
    assert stats.calls and all(c.status == "skip" and "statistics dump" in c.message for c in stats.calls)


def test_mix_level_counts_modules_apart(tmp_path):
    root = dump_run(str(tmp_path / "dump"), torch.bfloat16, level="mix")
    result = acc_check(root, verbose=False)
    assert result.other_records["module"] > 0 and result.other_records["parameters_grad"] == 3
    assert result.calls and all(c.status == "pass" for c in result.calls)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "ts_core.cli", "acc-check", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_cli(tmp_path):
    model = Net(act=lambda h: kernels.wrong_gelu(h))
    root = dump_run(str(tmp_path / "dump"), torch.bfloat16, custom=[(kernels, "wrong_gelu", None)], model=model)
    out = tmp_path / "out"
    p = _cli(root, "-o", str(out), "--reference", f"{KERNELS}.wrong_gelu={KERNELS}.tanh_gelu", "--fail-on-error")
    assert p.returncode == 1, p.stderr
    assert f"{KERNELS}.wrong_gelu.0.forward" in p.stdout and "APIs that fail" in p.stdout
    assert sorted(os.listdir(out)) == ["acc_check_summary.json", "accuracy_checking_details.csv",
                                       "accuracy_checking_result.csv"]
    ok = _cli("-api_info", os.path.join(root, "step0", "rank", "dump.json"), "--black-list", "wrong_gelu",
              "--fail-on-error", "--json")
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout)
    assert summary["counts"]["skip"] == 1 and "black list" in summary["skipped"][0]["reason"]
    bad = _cli(str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and "no such file" in bad.stderr
    assert _cli(root, "--reference", "nonsense").returncode == 2


def test_nothing_checked_is_a_failure_with_the_reason_and_the_fix(tmp_path):
    """Issue 25: a statistics dump has no inputs to replay; acc-check said PASS (exit 0) for it."""
    root = dump_run(str(tmp_path / "stats"), task="statistics")
    result = acc_check(root, verbose=False)
    assert result.calls and result.checked == {"calls": 0, "of_calls": len(result.calls), "values": 0,
                                               "forward_values": 0, "backward_values": 0}
    assert result.verdict == "nothing checked"
    reason, fix = result.nothing_checked()
    assert "statistics only" in reason and "re-dump with task: tensor" in fix
    summary = result.summary()
    assert summary["verdict"] == "nothing checked" and summary["nothing_checked"]["fix"] == fix
    p = _cli(root)
    assert p.returncode == 1, p.stdout
    assert p.stdout.startswith("tsprobe acc-check: NOTHING CHECKED") and "PASS" not in p.stdout
    assert "re-dump with task: tensor" in p.stdout
    j = _cli(root, "--json")
    assert j.returncode == 1 and json.loads(j.stdout)["verdict"] == "nothing checked"
    assert "re-dump with task: tensor" in j.stderr


def test_a_tensor_dump_says_how_much_it_checked(tmp_path):
    result = acc_check(dump_run(str(tmp_path / "dump")), verbose=False)
    done = result.checked
    assert done["calls"] == done["of_calls"] == len(result.calls) > 0
    assert done["values"] == done["forward_values"] + done["backward_values"] and done["backward_values"] > 0
    assert result.nothing_checked() is None and result.verdict == "pass"
    from ts_core.acccheck.report import summary_text

    assert summary_text(result).startswith(f"tsprobe acc-check: PASS  (checked {done['calls']} of {done['calls']} "
                                           f"API calls, {done['values']} values")
