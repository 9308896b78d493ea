"""compare() on synthetic dumps where the injected bug and its place are known."""
import csv
import json

import numpy as np
import pytest

from compare_dumpgen import DumpWriter, write_chain
from ts_core.compare import DumpFormatError, compare


def run(g, t, out=None, **kw):
    return compare(g, t, out, verbose=False, **kw)


def test_identical_dumps_report_no_divergence(tmp_path):
    g, t = write_chain(tmp_path / "g"), write_chain(tmp_path / "t")
    r = run(tmp_path / "g", tmp_path / "t", tmp_path / "out")
    assert r.first_divergence is None
    assert r.verdict == "pass"
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["first_divergence"] is None and "no call introduced an error" in s["first_divergence_note"]
    assert s["counts"]["matched"] == 8 and s["counts"]["error"] == 0


def test_perturbed_parameter_is_named_at_the_call_consuming_it(tmp_path):
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", w_delta=0.01)
    r = run(tmp_path / "g", tmp_path / "t")
    fd = r.first_divergence
    assert fd.key == "Tensor.__add__.0.forward" and fd.direction == "forward"
    assert fd.tensor == "Tensor.__add__.0.forward.output.0"
    assert "input.1" in fd.cause and "no earlier" in fd.cause
    assert fd.source == "/home/user/train.py:2 in forward: b = a + w"   # library frame skipped
    assert not fd.statistics_based
    # later calls fail too, but only as propagation
    failing = {row.golden_key for row in r.rows if row.verdict != "pass"}
    assert {"Torch.tanh.0.forward", "Tensor.__mul__.1.forward"} <= failing


def test_changed_computation_is_named_even_though_later_errors_are_larger(tmp_path):
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", tanh_approx=True)
    fd = run(tmp_path / "g", tmp_path / "t").first_divergence
    assert fd.key == "Torch.tanh.0.forward"
    assert "inputs and parameters match" in fd.cause
    assert fd.metrics["max_abs_err"] == pytest.approx(1e-3, rel=0.1)
    assert fd.metrics["worst_index"] is not None and fd.metrics["rtol"] == 1e-4


def test_wrong_backward_is_found_in_backward(tmp_path):
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", grad_bug=1.5)
    r = run(tmp_path / "g", tmp_path / "t")
    fd = r.first_divergence
    assert (fd.key, fd.direction) == ("Torch.tanh.0.backward", "backward")
    assert fd.source and "c = torch.tanh(b)" in fd.source      # the forward call's stack
    assert all(row.verdict == "pass" for row in r.rows if row.direction == "forward")


def test_extra_call_keeps_alignment_and_is_reported_unmatched(tmp_path):
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", extra_mul=True)        # Tensor.__mul__.1 is new; the old .1 became .2
    r = run(tmp_path / "g", tmp_path / "t")
    pairs = {(row.golden_key, row.target_key) for row in r.rows}
    assert ("Tensor.__mul__.1.forward", "Tensor.__mul__.2.forward") in pairs
    assert (None, "Tensor.__mul__.1.forward") in pairs
    assert r.counts["unmatched_target"] == 2 and r.counts["unmatched_golden"] == 0
    assert r.counts["error"] == 0 and r.first_divergence is None


def test_extra_call_that_changes_values_is_the_divergence(tmp_path):
    g = DumpWriter(tmp_path / "g")
    t = DumpWriter(tmp_path / "t")
    x = np.arange(6, dtype=np.float32)
    for d in (g, t):
        d.forward("Torch.exp.0.forward", [x], [np.exp(x)])
    y = np.exp(x)
    g.forward("Torch.sin.0.forward", [y], [np.sin(y)])
    t.forward("Tensor.__mul__.0.forward", [y, 1.5], [y * np.float32(1.5)])    # only in target
    t.forward("Torch.sin.0.forward", [y * np.float32(1.5)], [np.sin(y * np.float32(1.5))])
    g.close(); t.close()
    fd = run(tmp_path / "g", tmp_path / "t").first_divergence
    assert fd.key == "Tensor.__mul__.0.forward" and fd.target_key == "Tensor.__mul__.0.forward"
    assert "only in target" in fd.cause and "Torch.sin.0.forward" in fd.cause
    assert fd.source.endswith("Tensor.__mul__.0.forward")        # the target's stack for that call


def test_statistics_only_dumps_use_statistics_and_say_so(tmp_path):
    write_chain(tmp_path / "g", task="statistics")
    write_chain(tmp_path / "t", task="statistics", w_delta=0.05)
    r = run(tmp_path / "g", tmp_path / "t")
    fd = r.first_divergence
    assert fd.key == "Tensor.__add__.0.forward" and fd.statistics_based
    assert fd.reason.startswith("statistics-based")
    assert r.pairs[0].modes == ["statistics"]


def test_stats_only_flag_and_mixed_modes(tmp_path):
    write_chain(tmp_path / "g")                          # tensors
    write_chain(tmp_path / "t", task="statistics")       # statistics only
    r = run(tmp_path / "g", tmp_path / "t")
    assert r.pairs[0].modes == ["statistics"] and r.first_divergence is None
    assert any("target has no tensor data" in row.reason for row in r.rows)
    r2 = run(tmp_path / "g", tmp_path / "g", stats_only=True)
    assert r2.pairs[0].modes == ["statistics"]


def test_md5_detects_bitwise_difference_below_statistics_tolerance(tmp_path):
    write_chain(tmp_path / "g", task="statistics", md5=True)
    write_chain(tmp_path / "t", task="statistics", md5=True, tanh_approx=True)
    r = run(tmp_path / "g", tmp_path / "t")
    assert r.first_divergence.key == "Torch.tanh.0.forward"
    row = next(x for x in r.rows if x.name == "Torch.tanh.0.forward.output.0")
    assert row.md5_equal is False and "bitwise different" in row.reason


def test_nan_in_target_is_an_error_and_named(tmp_path):
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", nan_at_tanh=True)
    fd = run(tmp_path / "g", tmp_path / "t").first_divergence
    assert fd.key == "Torch.tanh.0.forward" and "NaN/Inf differ" in fd.reason
    assert fd.metrics["worst_index"] == [1, 2] and fd.metrics["target_nan"] == 1


def test_shape_and_dtype_mismatch_are_explicit(tmp_path):
    g, t = DumpWriter(tmp_path / "g"), DumpWriter(tmp_path / "t")
    x = np.ones((2, 3), np.float32)
    g.forward("Torch.a.0.forward", [x], [x]); t.forward("Torch.a.0.forward", [x], [np.ones((3, 2), np.float32)])
    g.forward("Torch.b.0.forward", [x], [x]); t.forward("Torch.b.0.forward", [x], [x.astype(np.float16)])
    g.forward("Torch.c.0.forward", [x], [x]); t.forward("Torch.c.0.forward", [x], [x.reshape(1, 2, 3)])
    g.close(); t.close()
    rows = {r.golden_key: r for r in run(tmp_path / "g", tmp_path / "t").rows if r.role == "output"}
    assert rows["Torch.a.0.forward"].verdict == "error" and "shape differs" in rows["Torch.a.0.forward"].reason
    b = rows["Torch.b.0.forward"]
    assert b.verdict == "pass" and "dtype differs" in b.reason and b.rtol == 1e-4     # float32's: the more precise
    assert rows["Torch.c.0.forward"].verdict == "pass" and "size-1" in rows["Torch.c.0.forward"].reason


def test_changed_argument_value_is_shown_and_explains_the_divergence(tmp_path):
    g, t = DumpWriter(tmp_path / "g"), DumpWriter(tmp_path / "t")
    x = np.linspace(-3, 3, 50).astype(np.float32)
    g.forward("Functional.layer_norm.0.forward", [x], [x / 2], kwargs={"eps": 1e-5})
    t.forward("Functional.layer_norm.0.forward", [x], [x / 2.001], kwargs={"eps": 1e-3})
    g.close(); t.close()
    r = run(tmp_path / "g", tmp_path / "t")
    arg = next(x for x in r.rows if x.arg == "input.eps")
    assert (arg.mode, arg.golden_value, arg.target_value) == ("value", 1e-5, 1e-3)
    assert "input.eps (golden 1e-05, target 0.001)" in r.first_divergence.cause


def test_outputs_csv_numbers_summary_and_self_contained_html(tmp_path):
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", w_delta=0.01)
    r = run(tmp_path / "g", tmp_path / "t", tmp_path / "out")
    with open(tmp_path / "out" / "compare.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(r.rows)
    bad = next(x for x in rows if x["name"] == "Tensor.__add__.0.forward.output.0")
    assert float(bad["max_abs_err"]) == pytest.approx(0.01, rel=1e-3)      # a number, full precision
    assert float(bad["cosine"]) < 1 and bad["verdict"] in ("warning", "error")
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    fd = s["first_divergence"]
    assert set(fd) >= {"key", "direction", "tensor", "metrics", "stack"}
    assert fd["key"] == "Tensor.__add__.0.forward" and fd["stack"]
    assert s["tolerances"]["float32"]["rtol"] == 1e-4
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Tensor.__add__.0.forward" in html and "<svg" in html
    assert "http://" not in html and "https://" not in html and "<script src" not in html
    assert r.report_path == str(tmp_path / "out" / "report.html")
    assert json.loads(r.to_json())["first_divergence"]["key"] == "Tensor.__add__.0.forward"


def test_terminal_summary_names_the_first_divergence(tmp_path, capsys):
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", grad_bug=2.0)
    compare(tmp_path / "g", tmp_path / "t")
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("tsprobe compare: ERROR")
    assert "First divergence: Torch.tanh.0.backward <-> Torch.tanh.0.backward [backward]" in out


def test_several_ranks_are_compared_in_parallel_processes(tmp_path):
    for rank in ("rank0", "rank1"):
        write_chain(tmp_path / "g", rank=rank)
        write_chain(tmp_path / "t", rank=rank, w_delta=0.01 if rank == "rank1" else 0.0)
    r = run(tmp_path / "g", tmp_path / "t", workers=2)
    assert [(p.rank, p.first_divergence is None) for p in r.pairs] == [("rank0", True), ("rank1", False)]
    assert r.first_divergence.rank == "rank1"


def test_steps_pair_by_number_and_extra_steps_are_listed(tmp_path):
    for step in (0, 1):
        write_chain(tmp_path / "g", step=step)
    write_chain(tmp_path / "t", step=1)
    r = run(tmp_path / "g", tmp_path / "t", workers=1)
    assert [p.step for p in r.pairs] == [1]
    assert r.unpaired_golden and "step0" in r.unpaired_golden[0]


def test_missing_tensor_file_only_affects_its_row(tmp_path):
    write_chain(tmp_path / "g")
    t = write_chain(tmp_path / "t")
    (t / "dump_tensor_data" / "Torch.tanh.0.forward.output.0.npy").unlink()
    r = run(tmp_path / "g", tmp_path / "t")
    row = next(x for x in r.rows if x.name == "Torch.tanh.0.forward.output.0")
    assert row.mode == "statistics" and "tensor file missing" in row.reason and row.verdict == "pass"
    assert sum(1 for x in r.rows if x.mode == "tensor") == len(r.rows) - 1


def test_pickled_tensor_file_is_refused(tmp_path):
    write_chain(tmp_path / "g")
    t = write_chain(tmp_path / "t")
    np.save(t / "dump_tensor_data" / "Torch.tanh.0.forward.output.0.npy",
            np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    row = next(x for x in run(tmp_path / "g", tmp_path / "t").rows if x.name == "Torch.tanh.0.forward.output.0")
    assert "refusing to unpickle" in row.reason and row.mode == "statistics"


@pytest.mark.parametrize("content,expect", [
    ('{"task": "tensor", "data": {"Torch.a.0.forward": {"input_args": [', "not valid JSON at line 1"),
    ("", "file is empty"),
    ('["not", "a", "dump"]', 'no "data" object'),
])
def test_corrupt_dump_json_gives_one_clear_error(tmp_path, content, expect):
    write_chain(tmp_path / "g")
    bad = tmp_path / "t" / "step0" / "rank0"
    bad.mkdir(parents=True)
    (bad / "dump.json").write_text(content)
    with pytest.raises(DumpFormatError) as e:
        run(tmp_path / "g", tmp_path / "t")
    assert str(bad / "dump.json") in str(e.value) and expect in str(e.value)
    assert isinstance(e.value, ValueError)


def test_missing_path_and_empty_folder(tmp_path):
    write_chain(tmp_path / "g")
    with pytest.raises(DumpFormatError, match="no such file or directory"):
        run(tmp_path / "g", tmp_path / "nope")
    (tmp_path / "empty" / "step0").mkdir(parents=True)
    with pytest.raises(DumpFormatError, match="holds no dump"):
        run(tmp_path / "g", tmp_path / "empty")


@pytest.mark.parametrize("sub", ["", "step0", "step0/rank0", "step0/rank0/dump.json"])
def test_any_level_of_the_dump_tree_is_accepted(tmp_path, sub):
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", w_delta=0.01)
    r = run(tmp_path / "g" / sub if sub else tmp_path / "g", tmp_path / "t")
    assert r.first_divergence.key == "Tensor.__add__.0.forward"


def _records(tmp_path, name, records, task="statistics"):
    d = tmp_path / name / "step0" / "rank"
    d.mkdir(parents=True)
    (d / "dump.json").write_text(json.dumps({"task": task, "level": "L1", "framework": "pytorch",
                                             "dump_data_dir": None, "data": records}))
    return tmp_path / name


def test_msprobe_style_edge_summaries(tmp_path):
    """bool Max/Min as JSON booleans, int Mean/Norm null, empty tensors all-null, 0-d negative Norm."""
    t = lambda dtype, shape, mx, mn, mean, norm: {"type": "torch.Tensor", "dtype": dtype, "shape": shape,
                                                   "Max": mx, "Min": mn, "Mean": mean, "Norm": norm,
                                                   "requires_grad": False}
    rec = lambda out: {"input_args": [], "input_kwargs": {}, "output": [out]}
    golden = {"Torch.a.0.forward": rec(t("torch.bool", [4], True, False, None, None)),
              "Torch.b.0.forward": rec(t("torch.int64", [4], 7, 1, None, None)),
              "Torch.c.0.forward": rec(t("torch.float32", [0, 3], None, None, None, None)),
              "Torch.d.0.forward": rec(t("torch.float32", [], -2.5, -2.5, -2.5, -2.5))}
    target = json.loads(json.dumps(golden))
    target["Torch.a.0.forward"]["output"][0]["Min"] = True          # all() changed
    target["Torch.b.0.forward"]["output"][0]["Max"] = 8
    target["Torch.d.0.forward"]["output"][0].update(Max=-2.50001, Min=-2.50001, Mean=-2.50001, Norm=-2.50001)
    r = compare(_records(tmp_path, "g", golden), _records(tmp_path, "t", target), verbose=False)
    v = {row.golden_key: row for row in r.rows}
    assert v["Torch.a.0.forward"].verdict == "error"
    assert v["Torch.b.0.forward"].verdict == "error" and v["Torch.b.0.forward"].max_rel_diff == pytest.approx(1 / 7)
    assert v["Torch.c.0.forward"].verdict == "pass" and "empty" in v["Torch.c.0.forward"].reason
    assert v["Torch.d.0.forward"].verdict == "pass" and v["Torch.d.0.forward"].norm_rel_diff == pytest.approx(4e-6)
    assert r.first_divergence.key == "Torch.a.0.forward"


def test_package_is_callable_as_ts_core_compare(tmp_path):
    import ts_core
    import ts_core.compare  # noqa: F401  (the attribute is now the package)
    write_chain(tmp_path / "g")
    write_chain(tmp_path / "t", w_delta=0.01)
    r = ts_core.compare(tmp_path / "g", tmp_path / "t", verbose=False)
    assert r.first_divergence.key == "Tensor.__add__.0.forward"


def test_interrupted_run_is_explained(tmp_path):
    write_chain(tmp_path / "g")
    crashed = tmp_path / "t" / "step0" / "rank0"
    crashed.mkdir(parents=True)
    (crashed / "journal.jsonl").write_text('{"t": "header", "v": {}}\n')
    with pytest.raises(DumpFormatError, match="only the journal of an interrupted run"):
        run(tmp_path / "g", tmp_path / "t")


def test_incomplete_dump_is_compared_with_a_warning(tmp_path, capsys):
    write_chain(tmp_path / "g")
    t = write_chain(tmp_path / "t")
    doc = json.loads((t / "dump.json").read_text())
    doc["incomplete"] = True
    (t / "dump.json").write_text(json.dumps(doc))
    r = compare(tmp_path / "g", tmp_path / "t")
    assert r.pairs[0].warnings and "incomplete" in capsys.readouterr().out


def test_no_matching_step_is_an_error(tmp_path):
    write_chain(tmp_path / "g", step=0, rank="rank0")
    write_chain(tmp_path / "g", step=1, rank="rank0")
    write_chain(tmp_path / "t", step=2, rank="rank0")
    write_chain(tmp_path / "t", step=3, rank="rank0")
    with pytest.raises(DumpFormatError, match="nothing to compare.*step0/rank0, step1/rank0.*step2/rank0"):
        run(tmp_path / "g", tmp_path / "t")


def test_unpicklable_normaliser_runs_in_process(tmp_path):
    for rank in ("rank0", "rank1"):
        write_chain(tmp_path / "g", rank=rank)
        write_chain(tmp_path / "t", rank=rank)
    r = run(tmp_path / "g", tmp_path / "t", workers=2, normalise=lambda k: k.rsplit(".", 2)[0])
    assert len(r.pairs) == 2 and r.first_divergence is None


def test_source_line_is_the_innermost_frame_outside_frameworks_and_tools():
    from ts_core.dumpfmt.stack import user_frame
    frames = ["File /v/lib/python3.11/site-packages/torch/nn/functional.py, line 2900, in layer_norm, \n return x",
              "File /v/lib/python3.11/site-packages/msprobe/core/hook.py, line 5, in hook, \n y",
              "File /v/lib/python3.11/site-packages/transformers/models/gpt2/modeling_gpt2.py, line 400, in forward, "
              "\n hidden_states = self.ln_2(hidden_states)",
              "File /home/u/train.py, line 16, in <module>, \n loss = model(x)"]
    assert user_frame(frames) == ("/v/lib/python3.11/site-packages/transformers/models/gpt2/modeling_gpt2.py:400 "
                                  "in forward: hidden_states = self.ln_2(hidden_states)")
    assert user_frame(list(reversed(frames))).startswith("/v/lib/python3.11/site-packages/transformers")  # outermost first
    assert user_frame(["File /usr/lib/python3.11/contextlib.py, line 3, in f, \n x",
                       "File /home/u/a.py, line 2, in <module>, \n y"]) == "/home/u/a.py:2 in <module>: y"
    assert user_frame([]) is None


def test_html_keeps_every_failing_row_when_the_table_is_capped(tmp_path):
    from ts_core.compare.report.html import _select_rows
    from ts_core.compare.model import Row
    rows = [Row(0, "rank", i, "forward", f"K.{i}", f"K.{i}", "output", "output.0", f"K.{i}.output.0", "tensor",
                verdict="error" if i % 97 == 0 else "pass") for i in range(5000)]
    kept = _select_rows(rows, 300)
    assert len(kept) == 300
    assert [r.order for r in kept] == sorted(r.order for r in kept)
    assert {r.order for r in rows if r.verdict == "error"} <= {r.order for r in kept}
