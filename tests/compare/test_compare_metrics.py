"""Metrics checked against independent, element-by-element Python computations."""
import math

import numpy as np
import pytest

from ts_core.compare.judge.metrics import compare_arrays, compare_stats
from ts_core.compare.judge.tolerances import dtype_family, pick_tolerance
from ts_core.compare.judge.verdict import stats_verdict, tensor_verdict
from ts_core.verdicts import ERROR, PASS, WARNING


def reference(g, t, rtol, atol):
    """Plain-Python formulas, written independently of the implementation."""
    g, t = [float(v) for v in np.ravel(g)], [float(v) for v in np.ravel(t)]
    n = len(g)
    diffs = [abs(b - a) for a, b in zip(g, t)]
    rels = [d / abs(a) if a != 0 else (0.0 if d == 0 else math.inf) for a, d in zip(g, diffs)]
    dot = sum(a * b for a, b in zip(g, t))
    cos = dot / (math.sqrt(sum(a * a for a in g)) * math.sqrt(sum(b * b for b in t)))
    close = sum(1 for a, b in zip(g, t) if abs(b - a) <= atol + rtol * abs(a))
    return {"cosine": cos, "max_abs_err": max(diffs), "mean_abs_err": sum(diffs) / n, "max_rel_err": max(rels),
            "allclose_ratio": close / n, "within_0_1pct": sum(r <= 1e-3 for r in rels) / n,
            "within_0_5pct": sum(r <= 5e-3 for r in rels) / n,
            "euclidean": math.sqrt(sum(d * d for d in diffs))}


def test_metrics_match_hand_computation():
    g = np.array([[1.0, -2.0, 3.0], [0.5, 10.0, -4.0]], dtype=np.float32)
    t = np.array([[1.0005, -2.0, 3.3], [0.5, 10.004, -4.0]], dtype=np.float32)
    m = compare_arrays(g, t, rtol=1e-4, atol=1e-5)
    ref = reference(g, t, 1e-4, 1e-5)
    for k, v in ref.items():
        assert getattr(m, k) == pytest.approx(v, rel=1e-9), k
    # elements outside 1e-4: [0,0] (rel 5e-4), [0,2] (rel 0.1), [1,1] (rel 4e-4) -> 3 of 6
    assert m.allclose_ratio == pytest.approx(0.5)
    assert m.within_0_1pct == pytest.approx(5 / 6)   # only [0,2] is beyond 0.1 %
    assert m.worst_index == (0, 2)
    assert m.worst_golden == pytest.approx(3.0) and m.worst_target == pytest.approx(3.3)


def test_chunked_accumulation_equals_one_pass(tmp_path):
    rng = np.random.default_rng(1)
    g = rng.standard_normal((37, 11)).astype(np.float32)
    t = g + rng.standard_normal(g.shape).astype(np.float32) * 1e-3
    whole = compare_arrays(g, t, 1e-4, 1e-5, chunk=10**9)
    np.save(tmp_path / "g.npy", g)
    np.save(tmp_path / "t.npy", t)
    mapped = compare_arrays(np.load(tmp_path / "g.npy", mmap_mode="r"), np.load(tmp_path / "t.npy", mmap_mode="r"),
                            1e-4, 1e-5, chunk=7)
    for k, v in whole.to_dict().items():
        if isinstance(v, float):
            assert getattr(mapped, k) == pytest.approx(v, rel=1e-12, abs=1e-15), k
        else:
            assert mapped.to_dict()[k] == v, k


def test_identical_arrays_pass_without_worst_element():
    g = np.arange(12, dtype=np.float32).reshape(3, 4)
    m = compare_arrays(g, g.copy(), 1e-4, 1e-5)
    assert (m.cosine, m.max_abs_err, m.allclose_ratio, m.worst_index) == (1.0, 0.0, 1.0, None)
    assert tensor_verdict(m)[0] == PASS


def test_zero_golden_gives_infinite_relative_error_and_cosine_undefined():
    g = np.zeros(4, dtype=np.float32)
    t = np.array([0, 0, 0, 1e-3], dtype=np.float32)
    m = compare_arrays(g, t, 1e-4, 1e-5)
    assert m.max_rel_err == math.inf
    assert m.cosine is None
    assert m.allclose_ratio == 0.75
    verdict, reason = tensor_verdict(m)
    assert verdict == ERROR and "1 of 4" in reason and "worst at [3]" in reason


def test_nan_and_inf_patterns():
    g = np.array([1.0, np.nan, np.inf, 2.0])
    same = compare_arrays(g, g.copy(), 1e-4, 1e-5, equal_nan=True)
    assert same.nonfinite_mismatch == 0 and same.allclose_ratio == 1.0
    assert tensor_verdict(same)[0] == PASS
    assert compare_arrays(g, g.copy(), 1e-4, 1e-5, equal_nan=False).allclose_ratio == 0.75

    t = np.array([1.0, np.nan, np.inf, np.nan])
    m = compare_arrays(g, t, 1e-4, 1e-5)
    assert (m.golden_nan, m.target_nan, m.golden_inf, m.nonfinite_mismatch) == (1, 2, 1, 1)
    assert m.worst_index == (3,)
    verdict, reason = tensor_verdict(m)
    assert verdict == ERROR and "NaN/Inf differ at 1 positions" in reason
    assert m.max_abs_err == 0.0  # errors use elements finite on both sides only


def test_small_deviation_is_a_warning_large_is_an_error():
    g = np.linspace(1, 2, 1000)
    t = g.copy()
    t[10] *= 1.01                       # one element of 1000 off by 1 %
    assert tensor_verdict(compare_arrays(g, t, 1e-4, 1e-5))[0] == WARNING
    assert tensor_verdict(compare_arrays(g, g * 1.01, 1e-4, 1e-5))[0] == ERROR


def test_stats_relative_difference_uses_rms_for_near_zero_values():
    g = {"shape": [100], "Max": 2.0, "Min": -2.0, "Mean": 1e-9, "Norm": 10.0}   # rms = 1
    t = {"shape": [100], "Max": 2.0, "Min": -2.0, "Mean": 2e-9, "Norm": 10.0}
    s = compare_stats(g, t)
    assert s.rel_diffs["Mean"] == pytest.approx(1e-9)     # |2e-9 - 1e-9| / max(1e-9, 1)
    assert stats_verdict(s, 1e-4)[0] == PASS
    t2 = dict(t, Norm=10.05)
    s2 = compare_stats(g, t2)
    assert s2.rel_diffs["Norm"] == pytest.approx(0.005)
    verdict, reason = stats_verdict(s2, 1e-4)
    assert verdict == ERROR and reason.startswith("statistics-based") and "Norm" in reason
    assert stats_verdict(compare_stats(g, dict(t, Norm=10.005)), 1e-4)[0] == WARNING


def test_stats_nonfinite_and_missing_values():
    g = {"shape": [3], "Max": 1.0, "Min": 0.0, "Mean": 0.5, "Norm": 1.2}
    s = compare_stats(g, dict(g, Max=float("inf")))
    assert s.nonfinite == ["Max"] and stats_verdict(s, 1e-4)[0] == ERROR
    both_nan = dict(g, Mean=float("nan"))
    assert compare_stats(both_nan, dict(both_nan)).nonfinite == []
    ints = {"shape": [3], "Max": 4, "Min": 1, "Mean": None, "Norm": None}   # msprobe int tensors
    s = compare_stats(ints, dict(ints, Max=5))
    assert s.rel_diffs["Mean"] is None and s.rel_diffs["Max"] == pytest.approx(0.25)


@pytest.mark.parametrize("dtype,family", [("torch.float32", "float32"), ("Float16", "float16"),
                                          ("torch.bfloat16", "bfloat16"), ("mindspore.float64", "float64"),
                                          ("torch.int64", "exact"), ("torch.bool", "exact"), (None, "float32")])
def test_dtype_families(dtype, family):
    assert dtype_family(dtype) == family


def test_tolerance_follows_dtype_and_overrides():
    assert pick_tolerance("torch.float32", "torch.float32").rtol == 1e-4
    assert pick_tolerance("torch.float32", "torch.bfloat16").rtol == 1e-4   # the more precise side
    assert pick_tolerance("torch.bfloat16", "torch.bfloat16").rtol == 1e-2
    assert pick_tolerance("torch.int64", "torch.int64").atol == 0.0
    tol = pick_tolerance("torch.float16", "torch.float16", rtol=0.5)
    assert (tol.rtol, tol.atol, tol.stat_rtol) == (0.5, 1e-3, 0.5)


def test_memory_mapped_pair_is_compared_with_bounded_memory(tmp_path):
    """A pair is never loaded whole: peak allocation stays below one array's size."""
    import tracemalloc
    n = 4_000_000
    for name, scale in (("g", 1.0), ("t", 1.00001)):
        a = np.lib.format.open_memmap(tmp_path / f"{name}.npy", mode="w+", dtype=np.float32, shape=(n,))
        a[:] = np.arange(n, dtype=np.float32) * np.float32(scale)
        a.flush()
        del a
    g = np.load(tmp_path / "g.npy", mmap_mode="r")
    t = np.load(tmp_path / "t.npy", mmap_mode="r")
    tracemalloc.start()
    try:
        m = compare_arrays(g, t, 1e-4, 1e-5, chunk=1 << 16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert m.numel == n and m.allclose_ratio == 1.0
    assert peak < g.nbytes            # 16 MB of float32; a float64 copy would be 32 MB
