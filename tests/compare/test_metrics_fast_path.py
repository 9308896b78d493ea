"""The no-NaN/Inf fast path of the tensor metrics gives exactly what the general path gives."""
import numpy as np
import pytest

from ts_core.compare.judge.metrics import _Accumulator


def _both(g, t, rtol, atol):
    fast, general = _Accumulator(rtol, atol, True), _Accumulator(rtol, atol, True)
    fast._update_finite(g.copy(), t.copy(), 0)
    general._update_general(g.copy(), t.copy(), 0)
    return fast.result(g.shape), general.result(g.shape)


@pytest.mark.parametrize("rtol,atol", [(1e-4, 1e-5), (1e-3, 0.0), (0.0, 0.0)])
@pytest.mark.parametrize("seed", range(4))
def test_fast_path_equals_general_path(seed, rtol, atol):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(5000)
    g[rng.integers(0, 5000, 300)] = 0.0                      # exact zeros in golden
    t = g + rng.standard_normal(5000) * rng.choice([0, 1e-7, 1e-3], 5000)
    t[:10] = g[:10]
    fast, general = _both(g, t, rtol, atol)
    for field in ("numel", "allclose_ratio", "within_0_1pct", "within_0_5pct", "max_abs_err",
                  "max_rel_err", "worst_index", "worst_golden", "worst_target", "nonfinite_mismatch"):
        assert getattr(fast, field) == getattr(general, field), field
    for field in ("cosine", "mean_abs_err", "euclidean"):
        assert getattr(fast, field) == pytest.approx(getattr(general, field), rel=1e-12), field


def test_fast_path_identical_arrays_have_no_worst_element():
    g = np.linspace(-1, 1, 100)
    fast, general = _both(g, g.copy(), 1e-4, 1e-5)
    assert fast.worst_index is None and general.worst_index is None
    assert fast.max_rel_err == 0.0 and fast.allclose_ratio == 1.0
