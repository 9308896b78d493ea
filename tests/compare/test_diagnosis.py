"""The diagnosis of the first divergence (compare/explain/diagnosis.py): each cause hypothesis
fires on a pair with that bug planted, and says nothing (or nothing confident) on a clean pair.

Dumps are written from numpy (compare_dumpgen.DumpWriter); every planted value and every
number the evidence is checked against is computed here, independently, in numpy.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from compare_dumpgen import DumpWriter
from ts_core.compare import compare
from ts_core.compare.explain.argnames import arg_label
from ts_core.compare.explain.patterns import border_only, constant_ratio, permutation
from ts_core.compare.explain.refit import fit_activation, reduction_axes

RNG = np.random.default_rng(7)
_erf = np.vectorize(math.erf)


def _f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def _gelu(x, tanh=False):
    if tanh:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _run(tmp_path, build, task="tensor", **kw):
    """Write golden and target with ``build(writer, side)``, compare them, return the result."""
    dirs = {}
    for side in ("golden", "target"):
        w = DumpWriter(tmp_path / side, task=task)
        build(w, side)
        dirs[side] = w.close()
    return compare(dirs["golden"], dirs["target"], tmp_path / "out", verbose=False, html=False, **kw)


def _top(result):
    assert result.diagnosis, f"no diagnosis; first divergence {result.first_divergence}"
    return result.diagnosis[0]


def _linear(x, w, b):
    return _f32(x.astype(np.float64) @ w.T.astype(np.float64) + b)


# ------------------------------------------------------------------------- hypotheses
def test_a_transposed_weight_is_named_with_the_permutation(tmp_path):
    x, w, b = _f32(RNG.standard_normal((4, 6))), _f32(RNG.standard_normal((6, 6))), _f32(RNG.standard_normal(6))

    def build(d, side):
        wt = w if side == "golden" else np.ascontiguousarray(w.T)
        d.forward("Functional.linear.0.forward", [x, wt, b], [_linear(x, wt, b)])
    r = _run(tmp_path, build)
    top = _top(r)
    assert top["cause"] == "transposed_weight" and top["confidence"] >= 0.9
    assert "transpose" in top["evidence"]
    assert not np.allclose(w, w.T)          # the plant is a real change


def test_a_changed_parameter_element_is_located(tmp_path):
    x, w, b = _f32(RNG.standard_normal((4, 6))), _f32(RNG.standard_normal((5, 6))), _f32(RNG.standard_normal(5))
    w2 = w.copy()
    w2[3, 2] += 0.75

    def build(d, side):
        wt = w if side == "golden" else w2
        d.forward("Module.fc.Linear.forward.0", [x], [_linear(x, wt, b)], params={"weight": wt, "bias": b})
    r = _run(tmp_path, build)
    top = _top(r)
    assert top["cause"] == "parameter_differs"
    idx = np.argwhere(w2 != w)
    assert len(idx) == 1 and f"[{idx[0][0]}, {idx[0][1]}]" in top["evidence"]
    assert "1 element of 30" in top["evidence"]


def test_a_constant_scale_is_measured_and_named(tmp_path):
    x = _f32(RNG.standard_normal((2, 2, 5, 5)))
    good, bad = 1 / math.sqrt(8), 1 / 8

    def build(d, side):
        s = good if side == "golden" else bad
        d.forward("Tensor.__mul__.0.forward", [x, s], [_f32(x * np.float32(s))])
    top = _top(_run(tmp_path, build))
    assert top["cause"] == "constant_scale" and top["confidence"] >= 0.8
    ratio = float(re.search(r"= ([0-9.e-]+)", top["evidence"]).group(1))
    assert ratio == pytest.approx(bad / good, rel=1e-4)          # 1/sqrt(8): sqrt(8) missing in target
    assert "1/sqrt(8)" in top["evidence"]


@pytest.mark.parametrize("eps", [1e-3, 1e-4])
def test_a_changed_norm_eps_is_refitted_from_the_values(tmp_path, eps):
    x = _f32(RNG.standard_normal((6, 16)) * 0.05)              # small variance: eps matters
    w, b = _f32(1 + 0.1 * RNG.standard_normal(16)), _f32(0.1 * RNG.standard_normal(16))

    def build(d, side):
        e = 1e-5 if side == "golden" else eps
        d.forward("Functional.layer_norm.0.forward", [x, [16], w, b, e], [_f32(_layer_norm(x, w, b, e))])
    top = _top(_run(tmp_path, build))
    assert top["cause"] == "norm_eps" and top["confidence"] >= 0.9
    lo, hi = [float(v) for v in re.findall(r"target's with eps in \[([0-9.e+-]+), ([0-9.e+-]+)\]", top["evidence"])[0]]
    assert lo / 1.5 <= eps <= hi * 1.5
    assert "recorded eps: golden 1e-05" in top["evidence"]


def test_a_norm_eps_is_found_without_recorded_arguments(tmp_path):
    """A module record (L0) holds no eps: the refit alone finds it."""
    x = _f32(RNG.standard_normal((6, 16)) * 0.05)
    w, b = _f32(np.ones(16)), _f32(np.zeros(16))

    def build(d, side):
        e = 1e-5 if side == "golden" else 1e-3
        d.forward("Module.ln.LayerNorm.forward.0", [x], [_f32(_layer_norm(x, w, b, e))], params={"weight": w, "bias": b})
    top = _top(_run(tmp_path, build))
    assert top["cause"] == "norm_eps"


def test_an_epsilon_added_by_hand_is_named_from_the_constant_offset(tmp_path):
    """``var + eps`` written out (an RMSNorm): the outputs differ by eps_t - eps_g everywhere."""
    var = _f32(RNG.random((6, 1)) * 0.01)

    def build(d, side):
        e = 1e-6 if side == "golden" else 1e-4
        d.forward("Tensor.__add__.0.forward", [var, e], [_f32(var + np.float32(e))])
    top = _top(_run(tmp_path, build))
    assert top["cause"] == "norm_eps"
    assert "1e-06" in top["evidence"] and "0.0001" in top["evidence"]


def test_a_gelu_approximation_is_told_from_the_exact_one(tmp_path):
    x = _f32(RNG.standard_normal((4, 32)) * 2)

    def build(d, side):
        tanh = side == "target"
        d.forward("Functional.gelu.0.forward", [x], [_f32(_gelu(x.astype(np.float64), tanh))],
                  kwargs={"approximate": "tanh" if tanh else "none"})
    top = _top(_run(tmp_path, build))
    assert top["cause"] == "activation_approx" and top["confidence"] >= 0.9
    assert "tanh approximation" in top["title"] and "erf" in top["title"]
    assert "recorded approximate: golden 'none', target 'tanh'" in top["evidence"]


def test_hard_silu_is_told_from_silu():
    x = RNG.standard_normal(500) * 3
    silu = x / (1 + np.exp(-x))
    hard = x * np.clip(x + 3, 0, 6) / 6
    assert fit_activation(x, silu)[0] == "SiLU"
    assert fit_activation(x, hard)[0] == "hard SiLU (hardswish)"
    assert fit_activation(x, RNG.standard_normal(500)) is None      # noise fits nothing


def test_softmax_over_the_wrong_axis_is_named(tmp_path):
    x = _f32(RNG.standard_normal((2, 2, 5, 5)))

    def build(d, side):
        dim = -1 if side == "golden" else -2
        d.forward("Functional.softmax.0.forward", [x], [_f32(_softmax(x.astype(np.float64), dim))], kwargs={"dim": dim})
    top = _top(_run(tmp_path, build))
    assert top["cause"] == "reduction_axis" and top["confidence"] >= 0.9
    assert "(-1,)" in top["evidence"] and "(-2,)" in top["evidence"]


def _box3(x, mode):
    """3x3 box filter with padding 1 (zeros, or numpy's reflect), in float64."""
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="constant" if mode == "zeros" else "reflect")
    h, w = x.shape[-2:]
    return sum(p[..., i:i + h, j:j + w] for i in range(3) for j in range(3))


def test_a_padding_mode_shows_as_border_only_differences(tmp_path):
    x = _f32(RNG.standard_normal((1, 2, 8, 8)))

    def build(d, side):
        mode = "zeros" if side == "golden" else "reflect"
        d.forward("Functional.avg_pool_like.0.forward", [x], [_f32(_box3(x.astype(np.float64), mode))])
    top = _top(_run(tmp_path, build))
    assert top["cause"] == "padding_border" and top["confidence"] >= 0.9
    diff = np.abs(_box3(x, "zeros") - _box3(x, "reflect")) > 1e-5
    assert not diff[..., 1:-1, 1:-1].any() and diff.any()         # the plant: border only
    assert "within 1 of the border" in top["evidence"]


def test_a_dropped_residual_is_named_with_the_value_left_out(tmp_path):
    """golden feeds fc2 with r + x (the add is code the dump does not record), target with r."""
    x = _f32(RNG.standard_normal((4, 6)))
    w1, b1 = _f32(RNG.standard_normal((6, 6))), _f32(RNG.standard_normal(6))
    w2, b2 = _f32(RNG.standard_normal((3, 6))), _f32(RNG.standard_normal(3))
    r = np.tanh(_linear(x, w1, b1))

    def build(d, side):
        d.forward("Functional.linear.0.forward", [x, w1, b1], [_linear(x, w1, b1)])
        d.forward("Torch.tanh.0.forward", [_linear(x, w1, b1)], [r])
        h = _f32(r + x) if side == "golden" else r
        d.forward("Functional.linear.1.forward", [h, w2, b2], [_linear(h, w2, b2)])
    top = _top(_run(tmp_path, build))
    assert top["cause"] == "dropped_residual" and top["confidence"] >= 0.8
    assert "Functional.linear.0.forward.input.0" in top["evidence"]      # x: what golden adds


def test_a_residual_add_in_golden_only_is_a_dropped_residual(tmp_path):
    x = _f32(RNG.standard_normal((4, 6)))

    def build(d, side):
        d.forward("Torch.tanh.0.forward", [x], [_f32(np.tanh(x))])
        h = _f32(np.tanh(x))
        if side == "golden":
            d.forward("Tensor.__add__.0.forward", [h, x], [_f32(h + x)])
            h = _f32(h + x)
        d.forward("Torch.sigmoid.0.forward", [h], [_f32(1 / (1 + np.exp(-h.astype(np.float64))))])
    top = _top(_run(tmp_path, build))
    assert top["cause"] == "dropped_residual"


def test_a_differing_model_input_is_named_where_first_consumed(tmp_path):
    x = _f32(RNG.standard_normal((4, 6)))
    x2 = x.copy()
    x2[0, 0] += 1.0

    def build(d, side):
        xi = x if side == "golden" else x2
        d.forward("Torch.tanh.0.forward", [xi], [_f32(np.tanh(xi))])
        d.data["Torch.tanh.0.forward"]["input_args"][0]["requires_grad"] = False     # data, not a weight
    top = _top(_run(tmp_path, build))
    assert top["cause"] == "input_differs"
    assert "1 element of 24 differs: [0, 0]" in top["evidence"]
    assert "first consumed by Torch.tanh.0.forward" in top["evidence"]


def _bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (round to nearest even), as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


def test_a_bfloat16_op_is_precision_checked_by_a_float64_replay(tmp_path):
    x, w, b = _f32(RNG.standard_normal((4, 16))), _f32(RNG.standard_normal((8, 16))), _f32(RNG.standard_normal(8))

    def build(d, side):
        y = _linear(x, w, b)
        if side == "target":      # autocast: bf16 inputs, bf16 output
            y = _bf16(_linear(_bf16(x), _bf16(w), _bf16(b)))
        d.forward("Functional.linear.0.forward", [x, w, b], [y])
        if side == "target":
            d.data["Functional.linear.0.forward"]["output"][0]["dtype"] = "torch.bfloat16"
    r = _run(tmp_path, build)
    top = _top(r)
    assert top["cause"] == "precision" and top["confidence"] >= 0.8
    assert "float64 replay" in top["evidence"]


def test_another_kernel_on_the_same_inputs_is_an_implementation_that_differs(tmp_path):
    """Both sides recorded the same input; target's tanh output is off by 1e-3 relative (another
    device's kernel, a patched op). Replayed here on that input, tanh gives golden's output and not
    target's: the target's implementation differs. (Before: no hypothesis at all.)"""
    x = _f32(RNG.standard_normal((8, 16)))
    y = _f32(np.tanh(x.astype(np.float64)))

    def build(d, side):
        d.forward("Torch.tanh.0.forward", [x], [y if side == "golden" else _f32(y * (1 + 1e-3 * np.sign(y)))])
    r = _run(tmp_path, build)
    assert r.first_divergence and "Torch.tanh.0" in r.first_divergence.key
    hyp = {h["cause"]: h for h in r.diagnosis}
    assert "implementation_differs" in hyp, r.diagnosis
    ev = hyp["implementation_differs"]["evidence"]
    assert "gives golden's output" in ev and "not target's" in ev and hyp["implementation_differs"]["confidence"] < 0.8
    assert "inherited" not in hyp and "born_here" not in hyp


def _tanh_off_by_a_kernel(d, side):
    x = _f32(np.linspace(-2, 2, 96).reshape(8, 12))
    y = _f32(np.tanh(x.astype(np.float64)))
    d.forward("Torch.tanh.0.forward", [x], [y if side == "golden" else _f32(y * (1 + 1e-3 * np.sign(y)))])


def test_without_torch_loaded_the_replay_runs_in_numpy_with_the_same_diagnosis(tmp_path):
    """`tsprobe compare` in a process of its own never loads torch for a call numpy replays
    (acccheck/numpy_replay.py); the hypotheses are those of the torch replay in this process."""
    import subprocess
    import sys

    import torch  # noqa: F401  (loaded: this process's replay goes through torch)

    with_torch = _run(tmp_path, _tanh_off_by_a_kernel)
    probe = ("import json, sys; from ts_core.compare import compare; "
             f"r = compare({str(tmp_path / 'golden')!r}, {str(tmp_path / 'target')!r}, verbose=False, html=False); "
             "print(json.dumps([r.diagnosis, 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    diagnosis, torch_loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert not torch_loaded
    assert [(h["cause"], h["confidence"]) for h in diagnosis] == \
        [(h["cause"], h["confidence"]) for h in with_torch.diagnosis]
    assert "implementation_differs" in {h["cause"] for h in diagnosis}


def test_an_output_too_large_to_hold_the_replay_against_is_not_replayed(tmp_path, monkeypatch):
    """The diagnosis reads tensors up to values.MAX_ELEMENTS: beyond, a replay (and the framework
    import it needs) could not be graded, so it does not run."""
    from ts_core.compare.explain import replaycheck, values

    calls = []
    real = replaycheck.replay_on_golden
    monkeypatch.setattr(replaycheck, "replay_on_golden", lambda v: calls.append(v) or real(v))
    _run(tmp_path / "small", _tanh_off_by_a_kernel)
    assert len(calls) == 1
    monkeypatch.setattr(values, "MAX_ELEMENTS", 50)           # the tensors hold 96 values
    r = _run(tmp_path / "large", _tanh_off_by_a_kernel)
    assert len(calls) == 1 and "Torch.tanh.0" in r.first_divergence.key


def test_swapped_operands_are_inherited_from_the_wiring(tmp_path):
    """sub receives its operands in the other order: the call itself is right (replayed on
    golden's inputs it gives golden's result), its inputs differ."""
    x = _f32(RNG.standard_normal((4, 6)))
    a, s = _f32(np.tanh(x)), _f32(1 / (1 + np.exp(-x.astype(np.float64))))

    def build(d, side):
        d.forward("Torch.tanh.0.forward", [x], [a])
        d.forward("Torch.sigmoid.0.forward", [x], [s])
        p, q = (a, s) if side == "golden" else (s, a)
        d.forward("Torch.sub.0.forward", [p, q], [_f32(p - q)])
    r = _run(tmp_path, build)
    hyp = {h["cause"]: h for h in r.diagnosis}
    assert "inherited" in hyp and hyp["inherited"]["confidence"] >= 0.8
    assert "gives golden's output" in hyp["inherited"]["evidence"]


def test_nondeterminism_from_a_rerun_of_golden(tmp_path):
    x = _f32(RNG.standard_normal((4, 6)))

    def dump(name, seed):
        d = DumpWriter(tmp_path / name)
        mask = np.random.default_rng(seed).random((4, 6)) > 0.2
        d.forward("Functional.dropout.0.forward", [x, 0.2], [_f32(x * mask / 0.8)])
        return d.close()
    g, t, rerun = dump("g", 1), dump("t", 2), dump("rerun", 3)
    r = compare(g, t, None, verbose=False, html=False, golden_rerun=rerun)
    top = _top(r)
    assert top["cause"] == "nondeterminism" and top["confidence"] >= 0.9
    same = compare(g, t, None, verbose=False, html=False, golden_rerun=g)    # golden reproduces itself
    nd = [h for h in same.diagnosis if h["cause"] == "nondeterminism"]
    assert nd and nd[0]["confidence"] == 0.0 and "reproduces itself" in nd[0]["title"]


# ----------------------------------------------------------------- statistics, clean pairs
def test_statistics_dump_names_a_differing_parameter_and_what_needs_tensors(tmp_path):
    x, w, b = _f32(RNG.standard_normal((4, 6))), _f32(RNG.standard_normal((5, 6))), _f32(RNG.standard_normal(5))

    def build(d, side):
        wt = w if side == "golden" else _f32(w * 1.5)
        d.forward("Module.fc.Linear.forward.0", [x], [_linear(x, wt, b)], params={"weight": wt, "bias": b})
    r = _run(tmp_path, build, task="statistics")
    top = _top(r)
    assert top["cause"] == "parameter_differs" and not top["needs_tensors"]
    assert "1.5" in top["evidence"]                       # every statistic scaled by the same factor
    assert any(h["needs_tensors"] for h in r.diagnosis)


def test_statistics_dump_scale_is_asserted_only_where_a_recorded_factor_explains_it(tmp_path):
    """Statistics scaled by one factor support a scale; the call's own recorded factor whose
    ratio is that factor shows it (issue 40: a literal argument is evidence in itself)."""
    x = _f32(RNG.standard_normal((2, 2, 5, 5)))

    def build(d, side):
        s = 0.35355339 if side == "golden" else 0.125
        d.forward("Tensor.__mul__.0.forward", [x, s], [_f32(x * np.float32(s))])
    r = _run(tmp_path / "arg", build, task="statistics")
    top = _top(r)
    assert top["cause"] == "constant_scale" and top["confidence"] >= 0.8
    assert "recorded input.1: golden 0.3536, target 0.125" in top["evidence"]
    assert not any(h["cause"] == "argument_differs" for h in r.diagnosis)     # explained, not repeated

    def unexplained(d, side):
        y = np.maximum(x, 0) * (1.0 if side == "golden" else 0.125 / 0.35355339)
        d.forward("Functional.relu.0.forward", [x], [_f32(y)])
    r = _run(tmp_path / "none", unexplained, task="statistics")
    hyp = {h["cause"]: h for h in r.diagnosis}
    assert "constant_scale" in hyp and hyp["constant_scale"]["confidence"] < 0.8


def test_statistics_dump_suspects_a_permuted_weight_without_asserting_it(tmp_path):
    """A transposed weight keeps every statistic: with statistics only it is raised, marked
    needs_tensors, and not asserted."""
    x, w, b = _f32(RNG.standard_normal((4, 6))), _f32(RNG.standard_normal((6, 6))), _f32(RNG.standard_normal(6))

    def build(d, side):
        wt = w if side == "golden" else np.ascontiguousarray(w.T)
        d.forward("Functional.linear.0.forward", [x, wt, b], [_linear(x, wt, b)])
    r = _run(tmp_path, build, task="statistics")
    top = _top(r)
    assert top["cause"] == "transposed_weight" and top["needs_tensors"] and top["confidence"] < 0.8


def test_a_clean_pair_gets_no_diagnosis(tmp_path):
    x = _f32(RNG.standard_normal((4, 6)))

    def build(d, side):
        d.forward("Torch.tanh.0.forward", [x], [_f32(np.tanh(x))])
    r = _run(tmp_path, build)
    assert r.first_divergence is None and r.diagnosis == []


def test_float_noise_forced_to_diverge_gets_no_confident_cause(tmp_path):
    """Two summation orders of one sum, compared with a tolerance far below float32 rounding:
    a first divergence is named, but no cause is asserted (precision noise, < 0.8)."""
    x = _f32(RNG.standard_normal((64, 256)))

    def build(d, side):
        y = x.sum(-1, dtype=np.float32) if side == "golden" else _f32(x[:, ::-1].cumsum(-1, dtype=np.float32)[:, -1])
        d.forward("Torch.sum.0.forward", [x, -1], [y])
    r = _run(tmp_path, build, rtol=1e-12, atol=0.0)
    assert r.first_divergence is not None
    assert all(h["confidence"] < 0.8 for h in r.diagnosis)


def test_summary_json_and_terminal_text_carry_the_diagnosis(tmp_path):
    x, w, b = _f32(RNG.standard_normal((4, 6))), _f32(RNG.standard_normal((6, 6))), _f32(RNG.standard_normal(6))

    def build(d, side):
        wt = w if side == "golden" else np.ascontiguousarray(w.T)
        d.forward("Functional.linear.0.forward", [x, wt, b], [_linear(x, wt, b)])
    r = _run(tmp_path, build)
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert doc["diagnosis"] == r.diagnosis and doc["diagnosis"][0]["cause"] == "transposed_weight"
    assert set(doc["diagnosis"][0]) == {"cause", "title", "confidence", "evidence", "needs_tensors"}
    assert doc["pairs"][0]["diagnosis"] == r.diagnosis
    text = str(r)
    assert "Why (diagnosis" in text and "transposed_weight" in text


def test_cli_passes_a_golden_rerun(tmp_path, capsys):
    from ts_core.cli import main

    x = _f32(RNG.standard_normal((4, 6)))
    dirs = []
    for name, seed in (("g", 1), ("t", 2), ("r", 3)):
        d = DumpWriter(tmp_path / name)
        mask = np.random.default_rng(seed).random((4, 6)) > 0.2
        d.forward("Functional.dropout.0.forward", [x, 0.2], [_f32(x * mask / 0.8)])
        dirs.append(str(d.close()))
    main(["compare", dirs[0], dirs[1], "--golden-rerun", dirs[2], "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["diagnosis"][0]["cause"] == "nondeterminism"


# ------------------------------------------------------------------------ the relations
def test_permutation_finds_transposes_and_gate_blocks():
    w = RNG.standard_normal((8, 3))
    q = 2
    swapped = np.concatenate([w[:q], w[2 * q:3 * q], w[q:2 * q], w[3 * q:]])       # LSTM (i, f, g, o) -> (i, g, f, o)
    assert "blocks" in permutation(w, swapped)
    sq = RNG.standard_normal((4, 4))
    assert "transpose" in permutation(sq, sq.T)
    other = sq.copy()
    other[0, 0] += 1
    assert permutation(sq, other) is None


def test_constant_ratio_allows_equal_masked_entries():
    g = RNG.standard_normal((4, 5, 5))
    t = g * 2.5
    mask = np.triu(np.ones((5, 5), bool), 1)
    g[:, mask], t[:, mask] = -1e9, -1e9
    c, share, n = constant_ratio(g, t)
    assert c == pytest.approx(2.5) and share == 1.0 and n == 4 * int((~mask).sum())
    assert constant_ratio(g, g + RNG.standard_normal(g.shape)) is None


def test_border_only_needs_an_interior_that_agrees():
    g = RNG.standard_normal((1, 1, 8, 8))
    t = g.copy()
    t[..., 0, :] += 1
    t[..., :, -1] += 1
    assert border_only(g, t, 1e-6)[0] == 1
    t[..., 4, 4] += 1
    assert border_only(g, t, 1e-6) is None


def test_reduction_axes_of_a_mean():
    x = RNG.standard_normal((2, 8, 8, 8))
    assert (-3, -1) in reduction_axes(x, x.mean((1, 3)), "mean")
    assert (-2, -1) in reduction_axes(x, x.mean((2, 3)), "mean")


def test_positional_arguments_are_quoted_by_name():
    assert arg_label("Functional.layer_norm", "input.4") == "eps"
    assert arg_label("Functional.batch_norm", "input.7") == "eps"
    assert arg_label("Functional.gelu", "input.approximate") == "approximate"
    assert arg_label("Tensor.__mul__", "input.1") == "input.1"
