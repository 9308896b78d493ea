"""The pair-shape corpus (issue 40): every shape of pair a user meets goes through
``tsprobe compare -o OUT`` and its report.html through a real headless browser. None may crash,
each writes compare.csv, summary.json and report.html, and the exit status follows the one
documented policy (0 PASS/WARNING, 1 ERROR or different programs, 2 unreadable input).

Shapes: merged call groups both ways (GPT-2 with ``gelu_new``, eight calls, against ``gelu``,
one), two different programs (an MLP against a GELU model), one side that recorded nothing, one
side an msprobe dump (both ways), torch against its MindSpore port, many ranks over two steps;
then a truncated dump.json beside its intact twin, alone and inside a dump root. Dumps are made
once for the module (tiny models; msprobe and MindSpore each in one child process, alongside).
"""
from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from browser import CHROMIUM, SKIP_REASON, Browser  # noqa: E402
from compare_models import build, dump_mix, train_step  # noqa: E402
from rank_dumps import write_dumps  # noqa: E402
from ts_core import PrecisionDebugger, seed_all  # noqa: E402
from ts_core.cli import main  # noqa: E402

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
HAVE_MSPROBE = importlib.util.find_spec("msprobe") is not None
HAVE_MINDSPORE = importlib.util.find_spec("mindspore") is not None

# the MindSpore side of tests/mindspore/ports.py's transformer, one level and task, in a child
_MINDSPORE = """
import sys
sys.path.insert(0, {repo!r}); sys.path.insert(0, {here!r})
import numpy as np, mindspore
from mindspore import Tensor
mindspore.set_device("CPU")
try:
    (Tensor(np.ones(1, np.float32)) * 1.5).asnumpy()
except SystemError:
    pass
import port_steps
port_steps.CONFIGS = [("mix", "statistics")]
port_steps.mindspore_steps("transformer", {root!r})
print("DONE")
"""


def _gpt2(path: str, activation: str) -> str:
    """One training step of a 2-layer GPT-2 (gelu_new: eight calls where gelu is one)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    seed_all(0, rm_dropout=True)
    cfg = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=16, activation_function=activation,
                     loss_type="ForCausalLMLoss")
    model = GPT2LMHeadModel(cfg)
    data = torch.randint(0, 64, (2, 8))
    dbg = PrecisionDebugger(dump_path=path, task="statistics", level="mix", step=[0])
    dbg.start(model)
    model(input_ids=data, labels=data).loss.backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    return path


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _mlp(path: str) -> str:
    torch.manual_seed(0)
    model, x = _MLP(), torch.randn(8, 16)
    dbg = PrecisionDebugger(dump_path=path, task="statistics", level="mix", step=[0])
    dbg.start(model)
    model(x).pow(2).mean().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    return path


def _emptied(src: str, dst: str) -> str:
    """A copy of dump `src` whose one dump.json holds no record (a run that recorded nothing)."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "step0", "rank", "dump.json")
    with open(path) as f:
        doc = json.load(f)
    doc["data"] = {}
    with open(path, "w") as f:
        json.dump(doc, f)
    return dst


def _two_steps(path: str) -> str:
    model, x = build()
    dbg = PrecisionDebugger(dump_path=path, task="statistics", level="mix", step=[0, 1])
    for _ in range(2):
        dbg.start(model)
        train_step(model, x)
        dbg.stop()
        dbg.step()
    dbg.close()
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """{name: (golden, target)}: every pair shape; the children (msprobe, MindSpore) run meanwhile."""
    root = tmp_path_factory.mktemp("shapes")
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               TSPROBE_QUIET="1")
    children = {}
    if HAVE_MSPROBE:
        code = f"from compare_models import run_msprobe; run_msprobe({str(root / 'msprobe')!r})"
        children["msprobe"] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True, env=env, cwd=HERE)
    if HAVE_MINDSPORE:
        code = _MINDSPORE.format(repo=REPO, here=HERE, root=str(root / "ports"))
        children["mindspore"] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    p = {k: str(root / k) for k in ("gelu_new", "gelu", "net", "mlp", "empty", "ranks", "whole", "cut")}
    _gpt2(p["gelu_new"], "gelu_new")
    _gpt2(p["gelu"], "gelu")
    dump_mix(p["net"])
    _mlp(p["mlp"])
    _emptied(p["net"], p["empty"])
    golden_ranks, target_ranks = write_dumps(p["ranks"], ranks=4, steps=2)
    shapes = {
        "merged_groups_golden_many": (p["gelu_new"], p["gelu"]),
        "merged_groups_target_many": (p["gelu"], p["gelu_new"]),
        "different_programs": (p["net"], p["mlp"]),
        "different_programs_reversed": (p["mlp"], p["net"]),
        "target_recorded_nothing": (p["net"], p["empty"]),
        "golden_recorded_nothing": (p["empty"], p["net"]),
        "many_ranks": (golden_ranks, target_ranks),
    }
    torch_port = None
    if HAVE_MINDSPORE:
        import port_steps

        saved, port_steps.CONFIGS = port_steps.CONFIGS, [("mix", "statistics")]
        try:
            torch_port = port_steps.torch_steps("transformer", str(root / "ports"))[("mix", "statistics")]
        finally:
            port_steps.CONFIGS = saved
    for name, child in children.items():
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, f"{name}: {err[-3000:]}"
    if HAVE_MSPROBE:
        shapes["msprobe_golden"] = (str(root / "msprobe" / "step0"), p["net"])
        shapes["msprobe_target"] = (p["net"], str(root / "msprobe" / "step0"))
    if torch_port is not None:
        shapes["torch_vs_mindspore"] = (torch_port, str(root / "ports" / "mindspore" / "transformer" / "mix_statistics"))
    return shapes


NAMES = ["merged_groups_golden_many", "merged_groups_target_many", "different_programs", "different_programs_reversed",
         "target_recorded_nothing", "golden_recorded_nothing", "many_ranks", "msprobe_golden", "msprobe_target",
         "torch_vs_mindspore"]


@pytest.fixture(scope="module")
def compared(corpus, tmp_path_factory):
    """Each shape through the CLI with -o: {name: (exit status, stdout, stderr, OUT)}."""
    out = tmp_path_factory.mktemp("compared")
    done = {}
    for name, (golden, target) in corpus.items():
        so, se = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            rc = main(["compare", golden, target, "-o", str(out / name)])
        done[name] = (rc, so.getvalue(), se.getvalue(), out / name)
    return done


def _member(compared, name):
    if name not in compared:
        pytest.skip(("mindstudio-probe" if "msprobe" in name else "mindspore") + " is not installed")
    return compared[name]


@pytest.mark.parametrize("name", NAMES)
def test_every_pair_shape_writes_every_output_and_exits_by_the_policy(compared, name):
    rc, stdout, stderr, out = _member(compared, name)
    assert {"compare.csv", "summary.json", "report.html"} <= {p.name for p in out.iterdir()}, stderr
    assert "Traceback" not in stdout + stderr
    summary = json.loads((out / "summary.json").read_text())
    want = 1 if summary["verdict"] == "error" or summary["different_programs"] else 0
    assert rc == want, (summary["verdict"], stderr)
    assert stdout.startswith(f"tsprobe compare: {summary['verdict'].upper()}")
    with open(out / "compare.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    c = summary["counts"]
    assert len(rows) == c["pass"] + c["warning"] + c["error"] > 0
    assert sum(r["verdict"] == "error" for r in rows) == c["error"]
    assert f"report: {out / 'report.html'}" in stdout


def test_the_corpus_holds_the_shapes_it_names(compared):
    """Each member is what its name says: merged groups on the side named, two programs told
    apart, an empty side with no call, several ranks and steps."""
    def rows(name):
        with open(compared[name][3] / "compare.csv", newline="") as f:
            return list(csv.DictReader(f))

    def summary(name):
        return json.loads((compared[name][3] / "summary.json").read_text())

    assert any("+" in r["golden_key"] and "+" not in r["target_key"] for r in rows("merged_groups_golden_many"))
    assert any("+" in r["target_key"] and "+" not in r["golden_key"] for r in rows("merged_groups_target_many"))
    for name in ("different_programs", "different_programs_reversed", "target_recorded_nothing"):
        assert summary(name)["different_programs"] and compared[name][0] == 1
    assert all(r["target_key"] == "" for r in rows("target_recorded_nothing"))
    for name, side in (("target_recorded_nothing", "target"), ("golden_recorded_nothing", "golden")):
        head = compared[name][1].splitlines()[:2]
        assert head[0].startswith("tsprobe compare: ERROR (one side recorded nothing)")
        assert head[1].startswith(f"{side} recorded no call here")
    assert all(r["golden_key"] == "" for r in rows("golden_recorded_nothing"))
    assert {(p["step"], p["rank"]) for p in summary("many_ranks")["pairs"]} == \
        {(s, f"rank{r}") for s in (0, 1) for r in range(4)}


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip(SKIP_REASON)
    b = Browser(width=1400, height=1000)
    yield b
    b.close()


@pytest.mark.parametrize("name", NAMES)
def test_every_report_renders_in_the_browser(compared, browser, name):
    rc, stdout, stderr, out = _member(compared, name)
    summary = json.loads((out / "summary.json").read_text())
    page = browser.page((out / "report.html").as_uri())
    thrown = [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"
              and e.get("sessionId") == page.session]
    assert not thrown, thrown[0]["params"]["exceptionDetails"]
    assert page.js("document.getElementById('verdict').textContent") == summary["verdict"].upper()
    assert page.js("document.querySelectorAll('#tree .tn[data-i]').length") > 0
    assert page.js("document.querySelectorAll('#t tr:not(.grp)').length") > 1      # a header and rows
    first = page.js("[...document.querySelectorAll('#tree .tn.first')].map(e => e.dataset.k)")
    fd = summary["first_divergence"]
    if fd is None:
        assert first == []
    else:                        # the page opens on the unit of the first divergence, marked once
        assert len(first) == 1 and first[0] in (fd["key"], fd.get("golden_key")), (first, fd["key"])
    page.close()


# ---------------------------------------------------------------- unreadable input

@pytest.fixture(scope="module")
def truncated(tmp_path_factory):
    """Two dumps of the same two steps; the target's step1 dump.json cut in half."""
    root = tmp_path_factory.mktemp("truncated")
    whole, cut = _two_steps(str(root / "whole")), _two_steps(str(root / "cut"))
    path = os.path.join(cut, "step1", "rank", "dump.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text[:len(text) // 2])
    return whole, cut, path


def test_a_truncated_dump_json_against_its_twin_is_a_clear_error(truncated, tmp_path, capsys):
    whole, cut, path = truncated
    for out in ([], ["-o", str(tmp_path / "out")], ["--no-html", "-o", str(tmp_path / "out2")]):
        rc = main(["compare", os.path.join(whole, "step1", "rank"), os.path.dirname(path), *out])
        err = capsys.readouterr().err
        assert rc == 2
        assert err.count("\n") == 1 and err.startswith("tsprobe compare: error: ") and path in err
        assert "truncated" in err and "dump that step again" in err and "Traceback" not in err


def test_a_dump_root_holding_a_truncated_step_compares_the_rest_and_exits_2(truncated, tmp_path, capsys):
    whole, cut, path = truncated
    rc = main(["compare", whole, cut, "-o", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert rc == 2
    assert path in captured.err and "truncated" in captured.err and "Traceback" not in captured.err
    assert "unreadable input: 1 step/rank pair(s) not compared" in captured.out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert len(summary["unreadable"]) == 1 and path in summary["unreadable"][0]
    step0 = next(p for p in summary["pairs"] if p["step"] == 0)
    assert step0["counts"]["pass"] > 0 and step0["counts"]["error"] == 0     # the readable step was compared
    assert (tmp_path / "out" / "report.html").is_file()


def test_a_truncated_dump_with_its_journal_names_tsprobe_recover(truncated, tmp_path, capsys):
    whole, cut, path = truncated
    copy = tmp_path / "cut"
    shutil.copytree(cut, copy)
    rank = copy / "step1" / "rank"
    (rank / "journal.jsonl").write_text("")           # what a run killed mid-write leaves beside it
    assert main(["compare", os.path.join(whole, "step1", "rank"), str(rank), "--no-html"]) == 2
    assert f"tsprobe recover {rank}" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["different_programs", "target_recorded_nothing"])
def test_the_table_opens_on_the_rows_that_do_not_pass_and_shows_names_whole(compared, browser, name):
    rc, stdout, stderr, out = _member(compared, name)
    summary = json.loads((out / "summary.json").read_text())
    page = browser.page((out / "report.html").as_uri())
    rows = page.js("""(() => { const h = [...document.querySelectorAll('#t th')].map(th => th.dataset.c);
        return [...document.querySelectorAll('#t tr:not(.grp)')].slice(1).map(tr =>
            [tr.className, tr.children[h.indexOf('name')].textContent]); })()""")
    verdicts = [v for v, _ in rows]
    bad = summary["counts"]["error"] + summary["counts"]["warning"]
    assert bad and verdicts[0] != "pass"                 # opens on a row that does not pass
    shown_bad = sum(v != "pass" for v in verdicts)
    assert verdicts[:shown_bad] == [v for v in verdicts if v != "pass"]     # every one before any pass
    with open(out / "compare.csv", newline="") as f:
        in_order = [r["name"] for r in csv.DictReader(f) if r["verdict"] != "pass" and r["step"] in ("0", "")]
    assert [n for v, n in rows if v != "pass"][:5] == in_order[:5]          # ... in execution order
    cut = page.js("[...document.querySelectorAll('#t td.nm')].filter(td => td.scrollWidth > td.clientWidth + 1)"
                  ".map(td => td.textContent)")
    longest = page.js("Math.max(...[...document.querySelectorAll('#t td.nm')].map(td => td.textContent.length))")
    assert not cut and longest > 40, cut[:3]            # long names are shown whole, not cut
    page.close()
