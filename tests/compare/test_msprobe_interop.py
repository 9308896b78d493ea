"""msprobe interop both ways (issue 40): one training step of a tiny GPT-2, Llama and BERT LM,
with labels (``F.cross_entropy``) and SGD, dumped by tsprobe and by msprobe 26.2.

- tsprobe compare: the pair is PASS in both directions, at L1 and mix, with statistics and
  checksums (summary_mode md5 records both); msprobe's recording conventions and the calls it
  does not record are counted apart, each said in one line; a planted bug is still found;
- msprobe's own compare on a tsprobe dump: its error rows are exactly the backward records
  where msprobe took the gradient at an inner autograd node (docs/msprobe-format.md §4).
"""
import csv
import glob
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("msprobe")

from interop_lms import ARCHS, build, one_step  # noqa: E402
from ts_core import PrecisionDebugger  # noqa: E402
from ts_core.compare import compare  # noqa: E402
from ts_core.compare.load.loader import Dump, find_dumps  # noqa: E402
from ts_core.compare.model import Row  # noqa: E402
from ts_core.compare.judge.verdict import judge_value  # noqa: E402

pytestmark = [pytest.mark.msprobe, pytest.mark.slow]
HERE = os.path.dirname(os.path.abspath(__file__))
LEVELS = ("L1", "mix")
# (arch, level, summary_mode): md5 everywhere (its records hold the statistics too), plus the
# statistics-only dumps msprobe's compare reads
RUNS = [(a, lv, "md5") for a in ARCHS for lv in LEVELS] + [("gpt2", "L1", "statistics")]


def _ts(root: str, arch: str, level: str, mode: str, scale_head: float = 1.0) -> str:
    """tsprobe's dump, on one thread as msprobe's runs (OMP_NUM_THREADS=1 below): a reduction
    split over another number of threads (layer_norm's weight gradient) differs in the last bits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dbg = PrecisionDebugger(dump_path=root, task="statistics", level=level, step=[0], summary_mode=mode)
        one_step(dbg, arch, scale_head)
        dbg.close()
    finally:
        torch.set_num_threads(threads)
    return root


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """{(arch, level, mode): (tsprobe root, msprobe root)}: msprobe runs in fresh processes, two at a time."""
    root = tmp_path_factory.mktemp("msprobe_interop")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    out, procs = {}, []
    for arch, level, mode in RUNS:
        ms = str(root / f"ms_{arch}_{level}_{mode}")
        config = root / f"ms_{arch}_{level}_{mode}.json"
        config.write_text(json.dumps({"task": "statistics", "dump_path": ms, "rank": [], "step": [0], "level": level,
                                      "async_dump": False, "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                                                                          "summary_mode": mode}}))
        if len(procs) >= 2:
            p = procs.pop(0)
            assert p.wait(timeout=300) == 0, p.stderr.read()[-3000:]
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "interop_lms.py"), arch, str(config)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=str(root)))
        out[(arch, level, mode)] = (_ts(str(root / f"ts_{arch}_{level}_{mode}"), arch, level, mode), ms)
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()[-3000:]
    return out


def _data(root: str) -> dict:
    found = glob.glob(os.path.join(root, "step0", "*", "dump.json"))
    assert len(found) == 1, found
    with open(found[0], encoding="utf-8") as f:
        return json.load(f)["data"]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("arch", ARCHS)
def test_the_same_run_dumped_by_msprobe_and_tsprobe_passes_both_ways(dumps, arch, level):
    ts, ms = dumps[(arch, level, "md5")]
    for golden, target in ((ms, ts), (ts, ms)):
        r = compare(golden, target, verbose=False)
        bad = [(x.golden_key, x.target_key, x.arg, x.reason) for x in r.rows if x.verdict != "pass"]
        assert r.verdict == "pass" and not bad and r.first_divergence is None, bad[:5]
        assert r.counts["unmatched_golden"] == r.counts["unmatched_target"] == 0
        # every call of either side is paired, but those the other tool does not record
        ts_calls, ms_calls = (r.counts["records_target"], r.counts["records_golden"]) if golden == ms else \
            (r.counts["records_golden"], r.counts["records_target"])
        assert r.counts["matched"] == ts_calls - r.counts.get("not_recorded_by_msprobe", 0) \
            == ms_calls - r.counts.get("optimizer_internal_msprobe", 0) > 50
        # checksums were compared: at L1 every forward row before the optimizer step is bitwise equal
        assert sum(1 for x in r.rows if x.reason.startswith("bitwise equal")) > 100


@pytest.mark.parametrize("arch", ARCHS)
def test_cross_entropy_backward_is_a_recording_convention_counted_in_one_line(dumps, arch):
    """msprobe's Functional.cross_entropy.0.backward holds the gradient w.r.t. log_softmax's
    output (NllLoss's node), checked here against autograd; tsprobe's, w.r.t. the logits."""
    ts, ms = dumps[(arch, "L1", "md5")]
    model, ids = build(arch)
    logits = model(input_ids=ids).logits.float()
    if arch != "bert":         # causal LMs shift the labels
        logits, labels = logits[:, :-1], ids[:, 1:]
    else:
        labels = ids
    ls = torch.log_softmax(logits.reshape(-1, logits.shape[-1]), -1)
    ls.retain_grad()
    logits.retain_grad()
    torch.nn.functional.nll_loss(ls, labels.reshape(-1)).backward()
    ms_grad = _data(ms)["Functional.cross_entropy.0.backward"]["output"][0]
    ts_grad = _data(ts)["Functional.cross_entropy.0.backward"]["output"][0]
    assert ms_grad["Norm"] == pytest.approx(ls.grad.norm().item(), rel=1e-5)
    assert ts_grad["Norm"] == pytest.approx(logits.grad.norm().item(), rel=1e-5)
    assert abs(ms_grad["Norm"] - ts_grad["Norm"]) > 1e-4 * ts_grad["Norm"]       # they do differ
    r = compare(ms, ts, verbose=False)
    rows = {(x.golden_key, x.arg): x for x in r.rows}
    assert ("Functional.cross_entropy.0.backward", "output.0") not in rows
    assert rows[("Functional.cross_entropy.0.backward", "input.0")].verdict == "pass"
    lines = [w for w in r.pairs[0].warnings if "inner autograd node" in w]
    assert len(lines) == 1 and "Functional.cross_entropy.0.backward" in lines[0] and "log_softmax" in lines[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_calls_msprobe_does_not_record_are_counted_apart(dumps, arch):
    """Every tsprobe call (forward or backward) that msprobe's dump of the same run lacks is
    counted as not recorded by msprobe, never as only in target; said in one line."""
    ts, ms = dumps[(arch, "mix", "md5")]
    missing = set(_data(ts)) - set(_data(ms))
    assert missing and all(k.startswith(("Tensor.", "Torch.", "Functional.")) for k in missing), missing
    assert any(k.startswith("Tensor.view.") for k in missing)
    for golden, target in ((ms, ts), (ts, ms)):
        r = compare(golden, target, verbose=False)
        assert r.counts["not_recorded_by_msprobe"] == len(missing)
        assert r.counts["unmatched_golden"] == r.counts["unmatched_target"] == 0
        line = [w for w in r.pairs[0].warnings if "msprobe does not record" in w]
        assert line == [f"{len(missing)} calls msprobe does not record ({line[0].split('(', 1)[1]}"]
        assert "msprobe does not record" in str(r)


def test_calls_inside_torchs_optimizer_that_only_msprobe_records_are_counted_apart(dumps):
    """The SGD step runs inside the dumped window: msprobe records its per-parameter ``add_``,
    tsprobe leaves torch.optim's internals unrecorded. Those msprobe-only calls are counted apart
    (one per parameter here) and said in one line, never "only in golden"."""
    ts, ms = dumps[("gpt2", "L1", "md5")]
    only_ms = {k for k in set(_data(ms)) - set(_data(ts)) if k.endswith(".forward")}
    n_params = sum(1 for _ in build("gpt2")[0].parameters())
    assert only_ms and all(k.startswith("Tensor.add_.") for k in only_ms) and len(only_ms) == n_params, only_ms
    for golden, target in ((ms, ts), (ts, ms)):
        r = compare(golden, target, verbose=False)
        assert r.counts["optimizer_internal_msprobe"] == n_params
        assert r.counts["unmatched_golden"] == r.counts["unmatched_target"] == 0
        assert any(w.startswith(f"{n_params} calls inside torch's optimizer step") for w in r.pairs[0].warnings)


def test_a_planted_bug_is_still_found_against_msprobe(dumps, tmp_path):
    """The conventions hide nothing: Llama's output projection scaled by 1.01 on tsprobe's side."""
    ms = dumps[("llama", "L1", "md5")][1]
    bug = _ts(str(tmp_path / "bug"), "llama", "L1", "md5", scale_head=1.01)
    r = compare(ms, bug, verbose=False)
    assert r.verdict == "error"
    fd = r.first_divergence
    assert fd.key == "Functional.linear.14.forward" and fd.direction == "forward"


def test_an_object_recorded_as_null_by_one_tool_and_by_type_by_the_other_is_no_difference():
    row = Row(step=0, rank="", order=0, direction="forward", golden_key="k", target_key="k", role="input",
              arg="input.0", name="k.input.0", mode="missing")
    assert judge_value(None, {"type": "DynamicCache", "value": None}, row, None, None, None) is False
    assert judge_value({"type": "DynamicCache", "value": None}, None, row, None, None, None) is False
    assert judge_value(None, {"type": "int", "value": 3}, row, None, None, None) is True
    assert row.verdict == "warning" and row.reason == ("golden recorded None (or an object whose value it does not "
                                                       "record), target recorded the value 3")


def test_msprobe_compare_errs_only_where_msprobe_took_an_inner_node_gradient(dumps, tmp_path):
    """msprobe's own compare, tsprobe's dump as target (NPU), msprobe's as golden (Bench): every
    error row is a backward input gradient whose shapes differ because msprobe recorded an
    inner node's gradient (the ones tsprobe's compare cannot place in msprobe's dump)."""
    ts, ms = dumps[("gpt2", "L1", "statistics")]
    t, g = (glob.glob(os.path.join(d, "step0", "*", "dump.json"))[0] for d in (ts, ms))
    out = tmp_path / "mscmp"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([os.path.join(os.path.dirname(sys.executable), "msprobe"), "compare", "-tp", t, "-gp", g,
                        "-o", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (result,) = glob.glob(str(out / "*.csv"))
    with open(result, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) > 500
    errors = [r for r in rows if r["Result"] == "error"]
    msd = Dump(find_dumps(ms)[0])
    placed_elsewhere = msd.unplaced
    assert errors
    for r in errors:
        key, arg = r["NPU Name"].rsplit(".output.", 1)
        assert key.endswith(".backward") and key in placed_elsewhere, r["NPU Name"]
        assert r["NPU Tensor Shape"] != r["Bench Tensor Shape"]
        forward = json.load(open(t))["data"][key[:-len("backward")] + "forward"]
        shapes = [a.get("shape") for a in forward["input_args"] if isinstance(a, dict)]
        assert json.loads(r["NPU Tensor Shape"]) in shapes
