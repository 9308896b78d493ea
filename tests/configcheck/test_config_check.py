"""tsprobe config-check on real runs: each run is its own process (argv, environment), its dump
carries the fingerprint the debugger recorded; msprobe's config_check packs are read too."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from ts_core import ConfigError, PrecisionDebugger
from ts_core.configcheck import config_check, record_hyperparameters
from ts_core.dumpfmt import FINGERPRINT_JSON, read_fingerprint

from ..conftest import require

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "configcheck", "run_train.py")


def train(tmp_path, name: str, *args: str, env: dict = None) -> str:
    root = str(tmp_path / name)
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TSPROBE_QUIET="1")
    e.pop("OMP_NUM_THREADS", None)
    e.update(env or {})
    subprocess.run([sys.executable, SCRIPT, root, *args], check=True, capture_output=True, cwd=ROOT, env=e,
                   timeout=180)
    return root


def errors(result, section=None):
    return [(f.section, f.name) for p in result.pairs for f in p.findings
            if f.level == "error" and (section is None or f.section == section)]


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    return train(tmp_path_factory.mktemp("cfg"), "golden")


def test_identical_runs_pass(tmp_path, golden):
    other = train(tmp_path, "again")
    result = config_check(golden, other, tmp_path / "out", verbose=False)
    assert result.verdict == "pass", result.text()
    assert [p.golden.label for p in result.pairs] == ["step0/rank", "step1/rank"]
    p = result.pairs[0]
    assert p.sections["weights"] == "pass" and p.sections["data"] == "pass"
    assert "weights: all 4 identical (crc32)" in p.notes and "data: all 1 identical (crc32)" in p.notes
    # the dump paths differ: noted, not an error
    assert sorted(f.name for f in p.findings) == ["dump", "dump_path"] and {f.level for f in p.findings} == {"info"}
    saved = json.loads((tmp_path / "out" / "config_check.json").read_text())
    assert saved["verdict"] == "pass" and len(saved["pairs"]) == 2
    assert (tmp_path / "out" / "config_check.csv").read_text().startswith("step,rank,section,name,golden,target")


def test_what_differs_is_named(tmp_path, golden):
    target = train(tmp_path, "target", "--lr", "0.2", "--perturb", env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                                                                         "MY_SECRET_TOKEN": "x", "HOME_DIR": "/a"})
    result = config_check(golden, target, verbose=False)
    step0 = result.pairs[0]
    assert ("environment", "CUBLAS_WORKSPACE_CONFIG") in errors(result)
    assert ("hyperparameters", "lr") in errors(result) and ("weights", "2.bias") in errors(result)
    assert step0.sections["data"] == "pass"                 # the same first batch
    # at step 0 only the nudged bias differs; after one optimizer step with another lr, all do
    assert [n for s, n in [(f.section, f.name) for f in step0.findings if f.level == "error"] if s == "weights"] \
        == ["2.bias"]
    # step 1's weights are not re-read by default: a result of training, named in a note
    assert [f for f in result.pairs[1].findings if f.section == "weights"] == []
    assert result.pairs[1].sections["weights"] == "not recorded"
    assert any(n.startswith("weights: recorded at step 0, the first dumped step") for n in result.pairs[1].notes)
    perturb = next(f for f in step0.findings if f.name == "perturb")
    assert perturb.level == "error" and (perturb.golden, perturb.target) == (False, True)
    # secrets and unrelated variables are never recorded
    doc = read_fingerprint(os.path.join(target, "step0", "rank"))
    assert "MY_SECRET_TOKEN" not in doc["environment"] and "HOME_DIR" not in doc["environment"]
    assert doc["hyperparameters"]["optimizer.momentum"] == 0.9


def test_other_data_is_named(tmp_path, golden):
    result = config_check(golden, train(tmp_path, "data", "--data-seed", "1"), verbose=False)
    # step 1's weights (trained on another batch) are a result: not re-read, not an input error
    assert errors(result, "weights") == [] and result.pairs[1].sections["weights"] == "not recorded"
    assert errors(result, "data")[0] == ("data", "args.0")
    assert result.pairs[0].sections["weights"] == "pass"      # step 0: same weights, other batch


def test_fingerprint_changes_nothing_and_can_be_off(tmp_path):
    def run(fp):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
        x = torch.randn(4, 8)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / f"fp{fp}"), level="L1", step=[0], fingerprint=fp)
        dbg.start(model)
        loss = model(x).pow(2).mean()
        loss.backward()
        dbg.stop()
        dbg.step()
        dbg.close()
        rank = tmp_path / f"fp{fp}" / "step0" / "rank"
        return loss.detach(), [p.grad.clone() for p in model.parameters()], rank

    (l0, g0, r0), (l1, g1, r1) = run(False), run(True)
    assert torch.equal(l0, l1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert not (r0 / FINGERPRINT_JSON).exists() and (r1 / FINGERPRINT_JSON).exists()
    keys0 = list(json.loads((r0 / "dump.json").read_text())["data"])
    keys1 = list(json.loads((r1 / "dump.json").read_text())["data"])
    assert keys0 == keys1          # the fingerprint's own statistics ops are not recorded
    with pytest.raises(ConfigError, match="fingerprint"):
        PrecisionDebugger(dump_path=str(tmp_path / "x"), fingerprint="yes")


def test_fingerprint_written_once_per_step_before_the_forward(tmp_path, monkeypatch):
    """Weights and batch go into one write at the first forward; a step without a forward
    still gets its fingerprint (weights only) at stop()."""
    from ts_core.configcheck import collect

    writes = []
    real = collect.write_fingerprint
    monkeypatch.setattr(collect, "write_fingerprint", lambda folder, doc: writes.append(
        (os.path.basename(os.path.dirname(folder)), sorted(doc))) or real(folder, doc))
    model = nn.Linear(4, 3)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0", step=[0, 1])
    seen_at_forward = []
    dbg.start(model)
    model.register_forward_pre_hook(lambda m, a: seen_at_forward.append(len(writes)))   # runs after tsprobe's
    model(torch.ones(2, 4)).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.start(model)           # step 1: no forward
    dbg.stop()
    dbg.step()
    dbg.close()
    assert seen_at_forward == [1]             # written before the model's own forward ran
    assert [w[0] for w in writes] == ["step0", "step1"]
    assert "data" in writes[0][1] and "weights" in writes[0][1]
    # step 1 does not re-read the weights (a result of step 0's training): it names the step that has them
    assert "data" not in writes[1][1] and "weights" not in writes[1][1] and "weights_step" in writes[1][1]
    assert read_fingerprint(str(tmp_path / "step1" / "rank"))["weights_step"] == 0
    fp = read_fingerprint(str(tmp_path / "step0" / "rank"))
    assert fp["data"]["args.0"]["shape"] == [2, 4] and fp["data"]["args.0"]["Max"] == 1.0
    assert fp["weights"]["weight"]["Max"] == model.weight.max().item()


def test_weights_at_every_step_on_request_and_for_another_model(tmp_path):
    """``fingerprint: every_step`` re-reads the weights at each dumped step; by default a later
    step re-reads them only when it is given another model (its weights are then an input)."""
    def steps(fingerprint, models):
        root = tmp_path / str(fingerprint)
        dbg = PrecisionDebugger(dump_path=str(root), level="L0", step=[0, 1, 2], fingerprint=fingerprint)
        for m in models:
            dbg.start(m)
            m(torch.ones(2, 4)).sum().backward()
            with torch.no_grad():
                m.weight.add_(1.0)          # training moved the weights
            dbg.stop()
            dbg.step()
        dbg.close()
        return [read_fingerprint(str(root / f"step{i}" / "rank")) for i in range(len(models))]

    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    every = steps("every_step", [a, a])
    assert [doc["weights"]["weight"]["Max"] for doc in every] == pytest.approx(
        [a.weight.max().item() - 2, a.weight.max().item() - 1])
    first, later, other = steps(True, [a, a, b])
    assert "weights" in first and "weights_step" not in first
    assert "weights" not in later and later["weights_step"] == 0
    assert other["weights"]["weight"]["Max"] == pytest.approx(b.weight.max().item() - 1) and "weights_step" not in other

    # a model rebuilt after the first was freed (its id may be reused): an input again, read again
    def fresh():
        return nn.Linear(4, 3)

    root = tmp_path / "rebuilt"
    dbg = PrecisionDebugger(dump_path=str(root), level="L0", step=[0, 1], fingerprint=True)
    maxima = []
    for _ in range(2):
        m = fresh()
        maxima.append(m.weight.max().item())
        dbg.start(m)
        m(torch.ones(2, 4)).sum().backward()
        dbg.stop()
        dbg.step()
        del m
    dbg.close()
    docs = [read_fingerprint(str(root / f"step{i}" / "rank")) for i in range(2)]
    assert [doc["weights"]["weight"]["Max"] for doc in docs] == pytest.approx(maxima)


def test_record_hyperparameters_forms(tmp_path):
    @dataclasses.dataclass
    class Opt:
        lr: float = 0.1
        warmup: int = 10

    cfg = tmp_path / "train.yaml"
    cfg.write_text("model:\n  hidden: 64\n  dropout: 0.1\n")
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", step=[0])
    record_hyperparameters(argparse.Namespace(batch_size=8))
    record_hyperparameters(Opt())
    model = nn.Linear(2, 2)
    dbg.start(model)
    record_hyperparameters(str(cfg))               # after start: the open step's file is updated
    model(torch.ones(1, 2))
    dbg.stop()
    dbg.step()
    dbg.close()
    hp = read_fingerprint(str(tmp_path / "d" / "step0" / "rank"))["hyperparameters"]
    assert {k: hp[k] for k in ("batch_size", "lr", "warmup", "model.hidden", "model.dropout")} == \
        {"batch_size": 8, "lr": 0.1, "warmup": 10, "model.hidden": 64, "model.dropout": 0.1}
    with pytest.raises(RuntimeError, match="no PrecisionDebugger"):
        record_hyperparameters({"lr": 1})
    with pytest.raises(TypeError, match="give a dict"):
        PrecisionDebugger(dump_path=str(tmp_path / "e"))
        record_hyperparameters(3)


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "ts_core.cli", "config-check", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)


def test_cli(tmp_path, golden):
    target = train(tmp_path, "t", "--bs", "8")
    p = _cli(golden, target, "-o", str(tmp_path / "out"), "--fail-on-error")
    assert p.returncode == 1 and "bs: 4 -> 8" in p.stdout
    assert _cli(golden, golden, "--fail-on-error").returncode == 0
    one = _cli(golden)
    assert one.returncode == 2 and "give two runs" in one.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    none = _cli(golden, str(empty))
    assert none.returncode == 2 and "holds no fingerprint.json" in none.stderr


MSPROBE_PACK = """
import sys, torch, torch.nn as nn
from msprobe.core.config_check import ConfigChecker
ConfigChecker.apply_patches("pytorch")
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
if len(sys.argv) > 2:
    with torch.no_grad():
        m[2].bias[0] += 0.5
ConfigChecker(model=m, output_zip_path=sys.argv[1], fmk="pytorch")
torch.manual_seed(1)
m(torch.randn(4, 8)).sum().backward()
"""


@require("msprobe")
@pytest.mark.slow
def test_msprobe_config_check_packs(tmp_path):
    packs = []
    for name, extra in (("a.zip", []), ("b.zip", ["bad"])):
        path = str(tmp_path / name)
        subprocess.run([sys.executable, "-c", MSPROBE_PACK, path, *extra], check=True, capture_output=True,
                       cwd=str(tmp_path), timeout=300)
        packs.append(path)
    same = config_check(packs[0], packs[0], verbose=False)
    assert same.verdict == "pass" and same.pairs[0].golden.label == "step0/rank0"
    diff = config_check(packs[0], packs[1], verbose=False)
    assert errors(diff) == [("weights", "2.bias")]
    p = _cli("-c", packs[0], packs[1])
    assert p.returncode == 0 and "2.bias" in p.stdout


MINDSPORE_RUN = """
import sys, numpy as np, mindspore as ms
ms.set_device("CPU")
from mindspore import nn, Tensor
from ts_core import PrecisionDebugger
ms.set_seed(int(sys.argv[2]))
net = nn.SequentialCell([nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2)])
dbg = PrecisionDebugger(dump_path=sys.argv[1], level="L0", step=[0, 1])
for step in range(2):
    dbg.start(net)
    for micro in range(2):                 # two forwards per step: the hook fires once, stays harmless
        ms.grad(lambda x: net(x).sum())(Tensor(np.full((3, 4), step + micro, np.float32)))
    dbg.stop()
    dbg.step()
dbg.close()
"""


@require("mindspore")
@pytest.mark.slow
def test_mindspore_fingerprint(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TSPROBE_QUIET="1")
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        subprocess.run([sys.executable, "-c", MINDSPORE_RUN, str(tmp_path / name), seed], check=True,
                       capture_output=True, cwd=ROOT, env=env, timeout=300)
    doc = read_fingerprint(str(tmp_path / "a" / "step1" / "rank"))
    assert doc["framework"]["mindspore"]["device_target"] == "CPU"
    assert doc["weights_step"] == 0 and "weights" not in doc     # read at the first dumped step
    assert set(read_fingerprint(str(tmp_path / "a" / "step0" / "rank"))["weights"]) == \
        {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert doc["data"]["args.0"]["Max"] == 1.0                  # step 1's first batch: all ones
    assert config_check(str(tmp_path / "a"), str(tmp_path / "b"), verbose=False).verdict == "pass"
    other = config_check(str(tmp_path / "a"), str(tmp_path / "c"), verbose=False)   # another seed
    assert {n for s, n in errors(other, "weights")} == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert ("framework", "mindspore.seed") in [(f.section, f.name) for f in other.pairs[0].findings]


def test_later_step_weights_are_results_not_config_errors(tmp_path):
    """Issue 25: another learning rate makes step 1's weights differ: a result of training, not
    a config error. The inputs (step 0's weights, the data, the config) are judged as before."""
    golden = train(tmp_path, "every", "--every-step")           # fingerprint: every_step
    target = train(tmp_path, "lr", "--lr", "0.2", "--every-step")
    result = config_check(golden, target, verbose=False)
    step0, step1 = result.pairs
    assert errors(result) == [("hyperparameters", "lr")] * 2        # the one input that differs, at each step
    assert step0.sections["weights"] == "pass"
    assert step1.sections["weights"] == "result"
    later = [f for f in step1.findings if f.section == "weights"]
    assert len(later) == 4 and {f.level for f in later} == {"info"}
    assert all("a result of training" in f.note for f in later)
    assert "weights: a result of the earlier steps, not an input (4 of 4 differ)" in step1.notes
    assert "results, not inputs: weights" in result.text()
    # how much was compared is said, per section
    assert step0.checked["weights"] == 4 and step0.checked["data"] == 1 and step0.checked["hyperparameters"] > 0
    assert result.summary()["pairs"][0]["checked"] == step0.checked and "  checked: " in result.text()


def test_environment_a_framework_sets_itself_is_not_the_users_config():
    from ts_core.configcheck.diff import diff

    torch_run = {"environment": {"OMP_NUM_THREADS": "1"}, "framework": {"torch": {"version": "2"}}}
    ms_run = {"environment": {"OMP_NUM_THREADS": "1", "KMP_DUPLICATE_LIB_OK": "True", "HCCL_CONNECT_TIMEOUT": "600"},
              "framework": {"mindspore": {"version": "2"}}}
    findings = {f.name: f for f in diff(torch_run, ms_run)[0] if f.section == "environment"}
    assert {n: f.level for n, f in findings.items()} == {"KMP_DUPLICATE_LIB_OK": "info", "HCCL_CONNECT_TIMEOUT": "info"}
    assert findings["KMP_DUPLICATE_LIB_OK"].note == "set by importing mindspore itself, not by the user"
    # the same variable set by the user to another value, or without MindSpore, is the user's
    user = dict(ms_run, environment=dict(ms_run["environment"], HCCL_CONNECT_TIMEOUT="120"))
    assert {f.name: f.level for f in diff(torch_run, user)[0] if f.section == "environment"}["HCCL_CONNECT_TIMEOUT"] \
        == "warning"
    no_ms = dict(ms_run, framework={"torch": {"version": "2"}})
    assert {f.level for f in diff(torch_run, no_ms)[0] if f.section == "environment"} == {"warning"}


@require("mindspore")
def test_the_framework_environment_table_is_what_mindspore_sets():
    """FRAMEWORK_ENV checked against the real import (a fresh process without those variables)."""
    from ts_core.configcheck.rules import FRAMEWORK_ENV, recorded_env

    code = ("import json, os; before = dict(os.environ); import mindspore; "
            "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))")
    env = {k: v for k, v in os.environ.items() if k not in FRAMEWORK_ENV["mindspore"]}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    set_by_import = json.loads(out.stdout.strip().splitlines()[-1])
    assert {k: v for k, v in set_by_import.items() if recorded_env(k)} == FRAMEWORK_ENV["mindspore"]
