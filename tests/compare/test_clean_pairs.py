"""The clean-pair corpus (issue 25): two dumps of one program must compare as PASS, with no row
that is not a pass and no first divergence, at every level (L0, L1, mix) and task (statistics,
tensor). Zero false alarms is a test, not a hope.

- the same run dumped by tsprobe and by msprobe 26.2 (interop_model.py: the backward records whose
  gradient order differs between the two tools: 2-D linear with and without bias, square and not,
  3-D linear and matmul, conv, layer_norm, embedding, split, max), both directions;
- the same program dumped twice by tsprobe;
- torch and its faithful MindSpore port (tests/mindspore/ports.py: mlp, cnn, transformer), the
  loss (F.mse_loss / nn.MSELoss) and the optimizer step (SGD) between start and stop.

Every pair also checks that no call that only moves values was paired with one that computes.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from interop_model import one_step  # noqa: E402
from port_steps import CONFIGS, torch_steps  # noqa: E402
from ts_core import PrecisionDebugger  # noqa: E402
from ts_core.compare import compare  # noqa: E402
from ts_core.compare.align.dataflow import describe_call, never_pair  # noqa: E402

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PORTS = ("mlp", "cnn", "transformer")


def _tsprobe(root: str, level: str, task: str) -> str:
    dbg = PrecisionDebugger(dump_path=root, task=task, level=level, step=[0])
    one_step(dbg)
    dbg.close()
    return root


def _clean(golden: str, target: str, **kw):
    """Compare and assert a clean verdict; returns the result."""
    r = compare(golden, target, verbose=False, **kw)
    bad = [(x.golden_key, x.target_key, x.arg, x.reason) for x in r.rows if x.verdict != "pass"]
    assert r.verdict == "pass" and not bad and r.first_divergence is None, (r.verdict, bad[:5])
    assert not r.different_programs
    mixed = [(cp_g, cp_t) for cp_g, cp_t in _matched_api_calls(r) if never_pair(describe_call(cp_g),
                                                                                describe_call(cp_t))]
    assert not mixed, [(g.key, t.key) for g, t in mixed]
    return r


def _matched_api_calls(result):
    """(golden call, target call) of every matched single-call API pair, re-aligned from the dumps."""
    from ts_core.compare.align.crossframework import is_cross, prepare
    from ts_core.compare.align.calls import align_calls
    from ts_core.compare.pipeline import Options
    from ts_core.compare.load.loader import Dump, find_dumps, pair_units

    (gu, tu), = pair_units(find_dumps(result.golden), find_dumps(result.target))[0]
    gd, td = Dump(gu), Dump(tu)
    gc, tc, names = gd.calls(), td.calls(), (None, None)
    cross = is_cross(gd.framework, td.framework)
    if cross:
        p = prepare(gc, tc, gd.framework, td.framework)
        gc, tc, names = p.golden, p.target, (p.golden_name, p.target_name)
    for seq in align_calls(gc, tc, Options(), *names, cross=cross, golden_parents=gd.construct,
                           target_parents=td.construct):
        for cp in seq:
            if cp.matched and cp.kind == "api" and not cp.golden.members and not cp.target.members:
                yield cp.golden, cp.target


# ---------------------------------------------------------------------- tsprobe and msprobe
@pytest.fixture(scope="module")
def interop(tmp_path_factory):
    """One training step dumped by msprobe (a fresh process per config, all at once) and by
    tsprobe, for every level and task: {(level, task): (tsprobe root, msprobe root)}."""
    pytest.importorskip("msprobe")
    root = tmp_path_factory.mktemp("interop")
    procs, out = [], {}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for level, task in CONFIGS:
        ms_root = str(root / f"msprobe_{level}_{task}")
        config = root / f"msprobe_{level}_{task}.json"
        config.write_text(json.dumps({"task": task, "dump_path": ms_root, "rank": [], "step": [0], "level": level,
                                      "async_dump": False, task: {"scope": [], "list": [], "data_mode": ["all"]}}))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "interop_model.py"), "msprobe", str(config)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=str(root)))
        out[(level, task)] = (_tsprobe(str(root / f"tsprobe_{level}_{task}"), level, task), ms_root)
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()[-3000:]
    return out


@pytest.mark.msprobe
@pytest.mark.parametrize("level,task", CONFIGS)
def test_tsprobe_and_msprobe_dumps_of_one_run_pass(interop, level, task):
    ts, ms = interop[(level, task)]
    for golden, target in ((ts, ms), (ms, ts)):
        r = _clean(golden, target)
        # SGD's own add_ calls (msprobe records them, tsprobe not: torch's optimizers are machinery,
        # whose calls differ per device) pair with nothing: the model's calls all do
        assert r.counts["matched"] >= (21 if level == "L0" else 44)
        assert r.pairs[0].modes == [task]
    if level == "L0":
        return
    rows = {(x.golden_key, x.arg): x for x in compare(ts, ms, verbose=False).rows}
    # F.linear of a 2-D input with a bias: msprobe's (bias, input, weight^T) read as (input, weight, bias)
    with_bias = {a: rows[("Functional.linear.1.backward", a)] for a in ("output.0", "output.1", "output.2")}
    assert [with_bias[a].golden_shape for a in sorted(with_bias)] == [[3, 6], [6, 6], [6]]
    assert all(x.target_shape == x.golden_shape and x.mode == task for x in with_bias.values())
    # square weight without a bias: weight^T has the weight's shape; in tensor mode the values
    # are compared transposed back (they would differ otherwise)
    assert rows[("Functional.linear.2.backward", "output.1")].mode == task
    assert rows[("Functional.linear.4.backward", "output.1")].golden_shape == [5, 6]
    # a 3-D input: msprobe recorded the gradient of an internal 2-D result, no input's: not compared,
    # while the gradient the call received is
    assert ("Functional.linear.0.backward", "output.0") not in rows
    assert rows[("Functional.linear.0.backward", "input.0")].verdict == "pass"
    for key in ("Functional.conv1d.0.backward", "Functional.embedding.0.backward", "Torch.max.0.backward",
                "Torch.matmul.0.backward"):
        assert rows[(key, "output.0")].verdict == "pass"


# --------------------------------------------------------------------------- tsprobe twice
@pytest.mark.parametrize("level,task", CONFIGS)
def test_the_same_program_dumped_twice_passes(tmp_path, level, task):
    a = _tsprobe(str(tmp_path / "a"), level, task)
    b = _tsprobe(str(tmp_path / "b"), level, task)
    r = _clean(a, b)
    assert r.counts["unmatched_golden"] == r.counts["unmatched_target"] == 0


# ---------------------------------------------------------------- torch and MindSpore ports
@pytest.fixture(scope="module")
def ports_dumps(tmp_path_factory):
    """Each port model, one step with loss and SGD, on both sides, at every level and task."""
    root = str(tmp_path_factory.mktemp("ports"))
    child = subprocess.Popen([sys.executable, os.path.join(HERE, "port_steps.py"), root, *PORTS],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                             env=dict(os.environ, TSPROBE_QUIET="1", OMP_NUM_THREADS="1"))
    torch_side = {name: torch_steps(name, root) for name in PORTS}
    stdout, stderr = child.communicate(timeout=600)
    assert child.returncode == 0 and "DONE" in stdout, stderr[-3000:]
    return {(name, level, task): (torch_side[name][(level, task)],
                                  os.path.join(root, "mindspore", name, f"{level}_{task}"))
            for name in PORTS for level, task in CONFIGS}


@pytest.mark.skipif(importlib.util.find_spec("mindspore") is None, reason="needs mindspore installed")
@pytest.mark.parametrize("name", PORTS)
def test_torch_and_its_faithful_mindspore_port_pass_with_loss_and_optimizer(ports_dumps, name):
    for level, task in CONFIGS:
        t, m = ports_dumps[(name, level, task)]
        r = _clean(t, m)
        assert r.counts["matched"] > 5
        assert any("cross-framework" in w for w in r.pairs[0].warnings)
