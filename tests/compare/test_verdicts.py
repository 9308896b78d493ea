"""Issue 25: verdicts a user can trust. The headline is the worst row; the first divergence names
both sides' calls everywhere it is shown; two different programs are said to be so, first, with
the evidence; a file that is no dump is called that."""
import csv
import json

import numpy as np
import pytest

from compare_dumpgen import DumpWriter
from ts_core.cli import main
from ts_core.compare import DumpFormatError, compare

X = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)


def _one_call(root, key: str, out: np.ndarray, step: int = 0) -> None:
    w = DumpWriter(root, step=step, task="statistics")
    w.forward(key, [X], [out])
    w.close()


def test_headline_is_the_worst_row_when_the_first_divergence_is_a_warning(tmp_path):
    """A first divergence whose own verdict is a warning (a small statistics deviation) leaves the
    headline a WARNING: before, any first divergence made it ERROR while every row said warning."""
    _one_call(tmp_path / "g", "Torch.tanh.0.forward", np.tanh(X))
    _one_call(tmp_path / "t", "Torch.tanh.0.forward", np.tanh(X) * np.float32(1.0005))
    r = compare(tmp_path / "g", tmp_path / "t", verbose=False)
    assert r.first_divergence is not None and r.first_divergence.verdict == "warning"
    assert r.counts["error"] == 0 and r.counts["warning"] > 0
    assert r.verdict == "warning"
    assert r.summary()["verdict"] == "warning"
    assert str(r).startswith("tsprobe compare: WARNING")


def test_an_error_row_still_makes_the_headline_an_error(tmp_path):
    _one_call(tmp_path / "g", "Torch.tanh.0.forward", np.tanh(X))
    _one_call(tmp_path / "t", "Torch.tanh.0.forward", np.tanh(X) * 2)
    r = compare(tmp_path / "g", tmp_path / "t", verbose=False)
    assert r.verdict == "error" and r.first_divergence.verdict == "error"


def test_first_divergence_names_both_calls_in_terminal_csv_summary_and_html(tmp_path):
    """golden runs gelu where target runs relu: the target's call is shown beside golden's."""
    _one_call(tmp_path / "g", "Functional.gelu.0.forward", X * 0.5)
    _one_call(tmp_path / "t", "Functional.relu.0.forward", np.maximum(X, 0))
    out = tmp_path / "out"
    r = compare(tmp_path / "g", tmp_path / "t", out, verbose=False)
    fd = r.first_divergence
    assert (fd.golden_key, fd.target_key) == ("Functional.gelu.0.forward", "Functional.relu.0.forward")
    both = "Functional.gelu.0.forward <-> Functional.relu.0.forward"
    assert f"First divergence: {both}" in str(r)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_divergence"]["calls"] == both
    rows = list(csv.DictReader(open(out / "compare.csv", encoding="utf-8")))
    marked = [row for row in rows if row["first_divergence"]]
    assert [row["name"] for row in marked] == [fd.tensor] and marked[0]["first_divergence"] == both
    assert both.replace("<", "&lt;").replace(">", "&gt;") in (out / "report.html").read_text()


def test_a_call_only_in_target_shows_no_golden_call(tmp_path):
    from ts_core.compare.model import FirstDivergence

    fd = FirstDivergence("K.0.forward", "K.0.forward", "forward", "K.0.forward.output.0", "error", "", "", {}, [],
                         None, None, golden_key=None)
    assert fd.calls == "- <-> K.0.forward"


# ------------------------------------------------------------------ different programs

def _program(root, model: str) -> str:
    """One training step of two unrelated tiny torch models (a CNN, a GPT-2-like block stack)."""
    torch = pytest.importorskip("torch")
    from ts_core import PrecisionDebugger

    torch.manual_seed(0)
    if model == "cnn":
        net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                  torch.nn.Linear(2 * 4 * 4, 3))
        x = torch.randn(2, 1, 6, 6)
    else:
        from compare_models import Net
        net, x = Net(), torch.randn(4, 16)
    dbg = PrecisionDebugger(dump_path=str(root), task="statistics", level="mix", step=[0])
    dbg.start(net)
    net(x).pow(2).mean().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    return str(root)


def test_two_different_programs_are_said_to_differ_first_and_exit_non_zero(tmp_path, capsys):
    g, t = _program(tmp_path / "cnn", "cnn"), _program(tmp_path / "gpt", "gpt")
    r = compare(g, t, verbose=False)
    assert r.verdict == "error" and r.different_programs
    programs = r.pairs[0].programs
    assert programs["same"] is False and programs["matched_share"] < programs["min_matched_share"]
    assert programs["common_module_tree"] is False
    text = str(r).splitlines()
    assert text[0].startswith("tsprobe compare: ERROR (different programs)")
    assert text[1].startswith("the two dumps do not describe the same program")
    assert "no module in common" in text[1] and "Module.0.Conv2d" in text[1]
    assert r.first_divergence is None
    assert "within tolerance" not in str(r) and "within tolerance" not in json.dumps(r.summary())
    assert main(["compare", g, t]) == 1
    capsys.readouterr()


def test_the_same_program_is_not_called_different(tmp_path):
    g, t = _program(tmp_path / "a", "gpt"), _program(tmp_path / "b", "gpt")
    r = compare(g, t, verbose=False)
    assert not r.different_programs and r.verdict == "pass"
    assert r.pairs[0].programs["matched_share"] == 1.0


# ------------------------------------------------------------------ not a dump

def test_a_file_that_is_no_dump_is_called_so_even_when_no_step_would_pair(tmp_path, capsys):
    for step in (0, 1):
        _one_call(tmp_path / "g", "Torch.tanh.0.forward", np.tanh(X), step=step)
    bad = tmp_path / "t" / "step5" / "rank0"
    bad.mkdir(parents=True)
    (bad / "dump.json").write_text('{"results": [1, 2, 3]}')
    with pytest.raises(DumpFormatError, match="not a dump"):
        compare(tmp_path / "g", tmp_path / "t", verbose=False)
    assert main(["compare", str(tmp_path / "g"), str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "not a dump" in err and str(bad / "dump.json") in err and "no step/rank" not in err


def test_a_data_object_without_records_is_no_dump(tmp_path):
    _one_call(tmp_path / "g", "Torch.tanh.0.forward", np.tanh(X))
    bad = tmp_path / "t" / "step0" / "rank0"
    bad.mkdir(parents=True)
    (bad / "dump.json").write_text('{"task": "statistics", "data": {"a": 1, "b": [2]}}')
    with pytest.raises(DumpFormatError, match="not a dump"):
        compare(tmp_path / "g", tmp_path / "t", verbose=False)


def test_two_dumps_without_a_call_are_nothing_compared_not_a_pass(tmp_path, capsys):
    for side in ("g", "t"):
        DumpWriter(tmp_path / side, task="statistics").close()
    r = compare(tmp_path / "g", tmp_path / "t", verbose=False)
    assert r.verdict == "error" and r.pairs[0].programs["calls"] == 0
    assert str(r).startswith("tsprobe compare: ERROR (nothing compared)")
    assert main(["compare", str(tmp_path / "g"), str(tmp_path / "t")]) == 1
    capsys.readouterr()


def test_a_dump_without_a_call_against_a_full_one_is_not_the_same_program(tmp_path):
    _one_call(tmp_path / "g", "Torch.tanh.0.forward", np.tanh(X))
    DumpWriter(tmp_path / "t", task="statistics").close()
    r = compare(tmp_path / "g", tmp_path / "t", verbose=False)
    assert r.different_programs and r.verdict == "error"
    assert r.pairs[0].programs["matched_share"] == 0.0


def test_a_warning_level_argument_on_one_side_only_is_no_difference(tmp_path):
    """torch's nn.Softmax calls F.softmax(x, dim, _stacklevel=5), mindtorch's passes no
    _stacklevel: the argument points a warning, it changes no value, so the pair passes. A
    real argument difference on the same call is still reported."""
    torch = pytest.importorskip("torch")
    from ts_core import PrecisionDebugger

    x = torch.from_numpy(X)

    def dump(root, **kw):
        dbg = PrecisionDebugger(dump_path=str(root), task="statistics", level="L1", step=[0])
        dbg.start()
        torch.nn.functional.softmax(x, -1, **kw)
        dbg.stop()
        dbg.close()
        return str(root / "step0")

    plain, stacklevel, other = dump(tmp_path / "g"), dump(tmp_path / "t", _stacklevel=5), \
        dump(tmp_path / "o", dtype=torch.float64)
    r = compare(plain, stacklevel, verbose=False)
    assert r.verdict == "pass" and all(row.verdict == "pass" for row in r.rows), \
        [(row.arg, row.reason) for row in r.rows if row.verdict != "pass"]
    assert not any(row.arg.endswith("_stacklevel") for row in r.rows)
    r = compare(plain, other, verbose=False)
    assert any(row.arg.endswith("dtype") and row.verdict == "warning" for row in r.rows)
