"""The report's facts outside the browser: compare.csv and summary.json carry both sides'
statistics (msprobe's Bench/NPU max, min, mean, l2norm), the terminal summary and summary.json
the diagnosis and, with several step/ranks, the step x rank x module grid; the page's data
hides the columns a statistics comparison leaves empty."""
from __future__ import annotations

import csv
import json
import os
import shutil

import pytest

torch = pytest.importorskip("torch")

from ts_core.compare import compare  # noqa: E402
from ts_core.compare.report.heatmap import columns, heatmap  # noqa: E402
from ts_core.compare.report.html import page_data, tolerance_table  # noqa: E402
from ts_core.compare.report.merge import index_columns, load_result  # noqa: E402
from ts_core.compare.report.text import terminal_text  # noqa: E402
from ts_core.compare.report.tree import build_tree, group_label, layout_only, trees  # noqa: E402

from compare_models import build, dump_mix as dump  # noqa: E402


def _set_diagnosis(result, diagnosis):
    """The diagnosis belongs to the pair holding the first divergence (CompareResult.diagnosis reads it)."""
    next(p for p in result.pairs if p.first_divergence is result.first_divergence).diagnosis = diagnosis

DIAGNOSIS = [{"cause": "activation_approx", "title": "GELU uses the tanh approximation in target", "confidence": 0.9,
              "evidence": "approximate: golden 'none', target 'tanh'", "needs_tensors": False},
             {"cause": "precision", "title": "float32 rounding", "confidence": 0.05, "evidence": "3e-4 >> ulp",
              "needs_tensors": True}]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("outputs")
    golden, target = dump(d / "golden"), dump(d / "target", bug={"approximate": "tanh"})
    for side in (golden, target):                # a second, clean rank: several units
        shutil.copytree(os.path.join(golden, "step0", "rank"), os.path.join(side, "step0", "rank1"))
    result = compare(golden, target, d / "out", verbose=False)
    return result, d


def test_csv_carries_both_sides_statistics_as_recorded(run):
    result, d = run
    with open(d / "out" / "compare.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    header = list(rows[0])
    # the older columns keep their places; both sides' statistics come after them
    assert header[:3] == ["step", "rank", "order"] and header[-1] == "first_divergence"
    assert header.index("target_value") < header.index("golden_max") < header.index("target_norm")
    recorded = json.load(open(d / "golden" / "step0" / "rank" / "dump.json"))["data"]
    trecorded = json.load(open(d / "target" / "step0" / "rank" / "dump.json"))["data"]
    checked = 0
    for r in rows:
        if r["rank"] != "rank" or r["mode"] != "statistics" or r["role"] != "output" or r["arg"] != "output.0":
            continue
        g = recorded[r["golden_key"]]["output"][0]
        t = trecorded[r["target_key"]]["output"][0]
        assert [float(r[f"golden_{k}"]) for k in ("max", "min", "mean", "norm")] == [g["Max"], g["Min"], g["Mean"], g["Norm"]]
        assert [float(r[f"target_{k}"]) for k in ("max", "min", "mean", "norm")] == [t["Max"], t["Min"], t["Mean"], t["Norm"]]
        checked += 1
    assert checked > 10
    # and against the model itself: the head's output of one forward, computed again here
    model, x = build()
    out = model(x).detach().double()
    head = next(r for r in rows if r["name"] == "Module.head.Linear.forward.0.output.0" and r["rank"] == "rank")
    assert float(head["golden_max"]) == pytest.approx(out.max().item(), rel=1e-6)
    assert float(head["golden_norm"]) == pytest.approx(out.norm().item(), rel=1e-6)
    # msprobe's names reach the same columns (tsprobe merge --compare-index)
    assert index_columns(["Bench max", "NPU l2norm"]) == ["golden_max", "target_norm"]
    # a reader of compare.csv gets them back
    back = load_result(d / "out")
    assert back.rows[5].golden_norm == result.rows[5].golden_norm


def test_summary_json_has_the_statistics_diagnosis_and_module_grid(run, tmp_path):
    result, _ = run
    _set_diagnosis(result, DIAGNOSIS)
    from ts_core.compare.report.files import write_summary

    write_summary(result, tmp_path / "summary.json")
    s = json.load(open(tmp_path / "summary.json"))
    m = s["first_divergence"]["metrics"]
    row = next(r for r in result.rows if r.name == result.first_divergence.tensor and r.rank == "rank")
    assert (m["golden_max"], m["target_norm"]) == (row.golden_max, row.target_norm)
    assert [h["cause"] for h in s["diagnosis"]] == ["activation_approx", "precision"]
    grid = s["modules"]
    assert grid["units"] == ["step0/rank", "step0/rank1"]
    col = {c: i for i, c in enumerate(grid["columns"])}
    # block 1 holds the bug: its cell fails on the buggy rank, passes on the clean copy; block 0 passes
    gelu = [r for r in result.pairs[0].rows
            if r.golden_key in ("Module.layers.1.act.GELU.forward.0", "Functional.gelu.1.forward")]
    verdict = "error" if any(r.verdict == "error" for r in gelu) else "warning"
    assert any(r.verdict != "pass" for r in gelu)
    assert grid["forward"][0][col["layers.1.act"]] == [verdict, pytest.approx(max(r.error_measure for r in gelu if r.error_measure is not None))]
    assert grid["forward"][1][col["layers.1.act"]][0] == "pass"
    assert grid["forward"][0][col["layers.0.act"]] == ["pass", 0.0]
    _set_diagnosis(result, [])


def test_terminal_text_names_both_sides_statistics_diagnosis_and_units(run):
    result, _ = run
    _set_diagnosis(result, DIAGNOSIS)
    text = terminal_text(result)
    _set_diagnosis(result, [])
    lines = text.splitlines()
    i = lines.index("Why (diagnosis, most likely first):")
    assert lines[i + 1].startswith("  1. GELU uses the tanh approximation in target (90%, activation_approx)")
    assert "needs tensors" in lines[i + 3]
    row = next(r for r in result.rows if r.name == result.first_divergence.tensor and r.rank == "rank")
    assert any(ln.strip().startswith("golden:") and f"max {row.golden_max:.4g}" in ln for ln in lines)
    assert any(ln.startswith("step0/rank1 ") and ln.rstrip().endswith("-") for ln in lines)
    # statistics mode: the failing-rows table shows both sides' norms, not empty cosine columns
    assert any("g_norm" in ln and "t_norm" in ln for ln in lines)
    assert "Why (diagnosis" not in terminal_text(result)        # nothing to say: no section


def test_page_data_hides_empty_columns_and_keeps_the_statistics(run):
    result, _ = run
    data = page_data(result)
    assert {"golden_max", "target_max", "golden_norm", "target_norm", "norm_rel_diff"} <= set(data["shown"])
    assert not {"cosine", "max_abs_err", "worst_index", "allclose_ratio", "target_key"} & set(data["shown"])
    assert len(data["rows"]) == len(result.rows) and len(data["trees"]) == 2 and data["heat"] is not None


def test_tree_labels_groups_and_folds_layout_calls():
    assert group_label("Primitive.matmul.MatMul.0.forward+Primitive.bias_add.BiasAdd.0.forward") == "MatMul + BiasAdd"
    long = "+".join(f"Tensor.view.{i}.forward" for i in range(8))
    assert group_label(long) == "view + view + ... (8 calls)" and len(group_label(long)) < 40
    assert layout_only("Tensor.view.3.forward") and layout_only("Primitive.reshape.Reshape.0.forward")
    assert layout_only("Tensor.to.0.forward+Tensor.contiguous.1.forward")
    assert not layout_only("Functional.linear.0.forward") and not layout_only("Module.fc.Linear.forward.0")


def test_heatmap_columns_go_as_deep_as_fit(run):
    result, _ = run
    tree = build_tree(result.pairs[0])
    assert columns(tree, max_columns=4) == ["layers.0", "layers.1", "layers.2", "head"]
    deep = columns(tree)
    assert "layers.1.act" in deep and "layers.1" not in deep
    assert heatmap(trees(result.pairs[:1])) is None          # one step/rank: no grid


def test_tolerances_render_as_a_table():
    html = tolerance_table({"float32": {"rtol": 1e-4, "atol": 1e-5}, "bfloat16": {"rtol": 0.01, "atol": 0.001}})
    assert html.count("<tr>") == 3 and "<td>float32</td><td>0.0001</td><td>1e-05</td>" in html
    assert "{" not in html
