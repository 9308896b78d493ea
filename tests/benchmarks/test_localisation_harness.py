"""The localisation benchmark's harness itself (benchmarks/localisation.py, benchmarks/loczoo/):
its cases run, its scoring is right on hand-made answers, its bug zoo is consistent. These
tests do not judge the compare tool's score (the benchmark reports that)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ..conftest import require

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from loczoo.arrays import edit_array, effect  # noqa: E402
from loczoo.score import locate, score  # noqa: E402
from loczoo.spec import BUG_KINDS, CLEAN_KINDS, OUTSIDE, Case, P, op_matches  # noqa: E402


# ------------------------------------------------------------------------------ scoring
def _fd(key, target_key=None, module=None, direction="forward"):
    return {"key": key, "target_key": target_key or key, "module": module, "direction": direction}


def _case(level, place=None, pair="torch-torch"):
    return Case(pair, "fam", "clean_same" if place is None else "bug", level, place)


ATTN_Q = P("attn.q", "linear", param=True)


def test_l0_module_record_at_the_right_module_is_right():
    s = score(_case("L0", ATTN_Q), _fd("Module.net.attn.q.Linear.forward.0",
                                        module="Module.net.attn.Attention.forward.0"), "error")
    assert s["ok"] and s["module_ok"] and s["op_ok"] is None


def test_l0_parent_or_child_module_is_wrong():
    parent = score(_case("L0", ATTN_Q), _fd("Module.net.attn.Attention.forward.0"), "error")
    child_of_other = score(_case("L0", P("attn", ("mul",))), _fd("Module.net.attn.o.Linear.forward.0",
                                                                module="Module.net.attn.Attention.forward.0"), "error")
    assert not parent["ok"] and parent["module_ok"] is False
    # the construct parent of a module record is not the module it names
    assert not child_of_other["ok"] and child_of_other["named"]["modules"] == ["attn.o"]


def test_mix_op_in_the_right_module_is_right_and_in_the_wrong_module_is_not():
    right = score(_case("mix", ATTN_Q), _fd("Functional.linear.3.forward", module="Module.net.attn.q.Linear.forward.0"), "error")
    wrong = score(_case("mix", ATTN_Q), _fd("Functional.linear.5.forward", module="Module.net.attn.o.Linear.forward.0"), "error")
    assert right["ok"] and right["module_ok"] and right["op_ok"]
    assert not wrong["ok"] and wrong["module_ok"] is False and wrong["op_ok"] is False


def test_mix_optimizer_op_without_module_is_a_miss():
    s = score(_case("mix", P("mlp.fc", ("mul", "linear"))), _fd("Tensor.mul_.4.forward"), "error")
    assert not s["ok"] and s["module_ok"] is False and s["op_ok"] is False


def test_a_training_loop_bug_is_right_at_a_call_outside_every_module():
    loop = P(OUTSIDE, "mul")
    s = score(_case("mix", loop), _fd("Tensor.mul_.0.forward"), "error")
    assert s["ok"] and s["module_ok"] and s["op_ok"]
    inside = score(_case("mix", loop), _fd("Tensor.mul_.0.forward", module="Module.net.fc.Linear.forward.0"), "error")
    assert not inside["ok"]
    assert not score(_case("L0", loop), _fd("Module.net.fc.Linear.forward.0"), "error")["ok"]


def test_confidently_wrong_is_a_first_cause_asserted_and_not_expected():
    from loczoo.score import score_cause

    case = Case("torch-torch", "fam", "wrong_eps", "mix", P("ln", "layer_norm"))
    wrong = score_cause(case, [{"cause": "constant_scale", "confidence": 0.9}, {"cause": "norm_eps", "confidence": 0.8}])
    assert wrong["confidently_wrong"] and not wrong["top1"] and wrong["top3"]
    unsure = score_cause(case, [{"cause": "constant_scale", "confidence": 0.7}])
    assert not unsure["confidently_wrong"]
    right = score_cause(case, [{"cause": "norm_eps", "confidence": 0.95}])
    assert right["top1"] and not right["confidently_wrong"]


def test_mix_parameter_bug_accepts_the_module_record():
    s = score(_case("mix", ATTN_Q), _fd("Module.net.attn.q.Linear.forward.0"), "error")
    assert s["ok"] and s["op_ok"]
    no_param = score(_case("mix", P("attn.q", "linear")), _fd("Module.net.attn.q.Linear.forward.0"), "error")
    assert no_param["module_ok"] and not no_param["op_ok"] and not no_param["ok"]


def test_l1_op_module_comes_from_the_reference_construct():
    place = P("fc2", "linear", param=True)
    parents = {"Functional.linear.0.forward": "Module.net.fc1.Linear.forward.0",
               "Functional.linear.1.forward": "Module.net.fc2.Linear.forward.0"}
    right = score(_case("L1", place), _fd("Functional.linear.1.forward"), "error", parents, parents)
    wrong = score(_case("L1", place), _fd("Functional.linear.0.forward"), "error", parents, parents)
    assert right["ok"] and right["module_ok"] is None and right["op_ok"]
    assert not wrong["ok"] and wrong["op_ok"] is False


def test_l1_keys_are_looked_up_on_their_own_side():
    """The same key names different calls in golden and target (counters shift): golden's
    construct places the golden key, target's the target key; a shared name gets both."""
    place = P("", "Torch.arange")
    golden = {"Torch.arange.0.forward": "Module.net.hf.BertModel.forward.0"}
    target = {"Torch.arange.0.forward": "Module.net.Wrap.forward.0"}
    same = score(_case("L1", place), _fd("Torch.arange.0.forward"), "error", golden, target)
    assert same["ok"] and {c["module"] for c in same["named"]["calls"]} == {"hf", ""}
    only_golden_side = score(_case("L1", place), _fd("Torch.arange.0.forward", "Torch.arange.1.forward"),
                             "error", golden, {"Torch.arange.1.forward": "Module.net.hf.BertModel.forward.0"})
    assert not only_golden_side["ok"]


def test_crossframework_group_key_counts_by_any_member_and_cell_paths_map():
    fd = _fd("Functional.linear.1.forward", "Primitive.matmul.MatMul.1.forward+Primitive.bias_add.BiasAdd.1.forward",
             module="Cell.net.fc2.Dense.forward.0")
    named = locate(fd)
    assert named["modules"] == ["fc2"]
    assert {c["op"] for c in named["calls"]} == {"Functional.linear", "Primitive.matmul.MatMul", "Primitive.bias_add.BiasAdd"}
    assert score(_case("mix", P("fc2", "linear"), "torch-ms"), fd, "error")["ok"]


def test_model_own_forward_is_the_empty_path_and_outside_is_none():
    assert locate(_fd("Tensor.__add__.0.forward", module="Module.net.MLP.forward.0"))["modules"] == [""]
    assert locate(_fd("Tensor.__add__.0.forward", module=None))["modules"] == []


def test_nothing_named_is_a_miss_for_a_bug():
    s = score(_case("mix", ATTN_Q), None, "pass")
    assert not s["ok"] and s["module_ok"] is False and s["op_ok"] is False


@pytest.mark.parametrize("fd,verdict,alarm", [(None, "pass", False), (None, "warning", False),
                                             (None, "error", True),
                                             (_fd("Functional.linear.0.forward"), "error", True)])
def test_clean_pair_false_alarm(fd, verdict, alarm):
    s = score(_case("mix"), fd, verdict)
    assert s["false_alarm"] is alarm and s["ok"] is (not alarm)


def test_op_concepts_cover_both_frameworks():
    assert op_matches("Functional.layer_norm", ("layer_norm",))
    assert op_matches("Primitive.layer_norm.LayerNorm", ("layer_norm",))
    assert op_matches("Primitive.matmul.MatMul", ("linear",))
    assert op_matches("Tensor.__rsub__", ("sub",))
    assert not op_matches("Tensor.mul_", ("linear", "add"))
    assert op_matches("Torch.arange", ("Torch.arange",))          # a literal pattern


# --------------------------------------------------------------------------- weight edits
def test_cancel_row_keeps_the_output_for_zero_mean_inputs():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 8))
    x = rng.standard_normal((3, 8))
    x -= x.mean(-1, keepdims=True)             # what a LayerNorm (weight 1, bias 0) hands over
    w2 = edit_array(w, "cancel_row")
    assert np.abs(w2 - w).max() > 0.1
    np.testing.assert_allclose(x @ w2.T, x @ w.T, atol=1e-12)


def test_transpose_perturb_and_swap_blocks():
    w = np.arange(16.0).reshape(4, 4)
    np.testing.assert_array_equal(edit_array(w, "transpose"), w.T)
    p = edit_array(w, "perturb")
    assert (p != w).sum() == 1 and np.array_equal(w, np.arange(16.0).reshape(4, 4))
    g = np.arange(8.0).reshape(8, 1)           # LSTM gates i f g o, 2 rows each
    np.testing.assert_array_equal(edit_array(g, "swap_blocks").ravel(), [0, 1, 4, 5, 2, 3, 6, 7])
    with pytest.raises(ValueError):
        edit_array(np.zeros((2, 3)), "transpose")


def test_effect_is_relative_per_group():
    g = {"grad:a": np.array([1.0, 2.0]), "grad:b": np.array([0.0, 1e-9]), "loss:": np.array(4.0)}
    t = {"grad:a": np.array([1.0, 2.0]), "grad:b": np.array([0.0, 2e-9]), "loss:": np.array(5.0)}
    e = effect(g, t)
    assert e["loss"] == pytest.approx(0.25) and e["grad"] == pytest.approx(1e-9 / 2.0)


# ------------------------------------------------------------------------------ the zoo
@require("torch")
def test_every_expected_module_exists_in_its_model():
    """A Place names real module paths of its family (a typo would score every answer wrong)."""
    import torch

    from loczoo.torch_zoo import FAMILIES

    kinds = set()
    for name, fam in FAMILIES.items():
        if name.startswith("hf_") and not importlib_has("transformers"):
            continue
        torch.manual_seed(0)
        paths = {p for p, _ in fam.make("clean_same").named_modules()}
        for variant, place in fam.cases.items():
            if place is None:
                assert variant[len("clean_"):].split("_")[0] in CLEAN_KINDS, variant
                continue
            kinds.add(variant)
            assert variant in BUG_KINDS
            assert place.ops, (name, variant)
            for module in place.modules:
                assert module is OUTSIDE or module in paths, f"{name}/{variant}: no module {module!r}"
            if variant in fam.edits:
                assert fam.edits[variant].param in fam.make("clean_same").state_dict()
        assert set(fam.ms_variants) <= set(fam.cases) | {"clean_port", "clean_port_cells"}, name
    assert len(FAMILIES) >= 10 and len(kinds) >= 8


def importlib_has(mod: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(mod) is not None


# ---------------------------------------------------------------------------- a real run
@require("torch")
@require("mindspore")
def test_quick_run_produces_scored_cases_for_both_pair_kinds(tmp_path):
    out = tmp_path / "loc.json"
    env = dict(os.environ, TSPROBE_QUIET="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "localisation.py"), "--quick", "--quiet",
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    cases = doc["cases"]
    assert {c["pair"] for c in cases} == {"torch-torch", "torch-ms"}
    assert {c["level"] for c in cases} == {"L0", "mix"}
    assert [c["id"] for c in cases if c["error"]] == []
    for c in cases:
        assert isinstance(c["score"]["ok"], bool)
        if c["clean"]:
            # a clean pair differs by float noise at most (checked without the compare tool)
            assert max(c["effect"].values()) < 1e-5, c["id"]
        else:
            assert max(c["effect"].values()) > 1e-3, c["id"]       # the bug changes something
    # the printed table has a row per pair kind and level
    for pair in ("torch-torch", "torch-ms"):
        for level in ("L0", "mix"):
            assert any(ln.split()[1:3] == [pair, level] for ln in proc.stdout.splitlines() if ln.startswith("tensor")), proc.stdout
    rows = {(r["pair"], r["level"]): r for r in doc["table"]}
    assert rows["torch-ms", "mix"]["bugs"] == 1 and rows["torch-ms", "mix"]["clean"] == 1
