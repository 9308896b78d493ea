"""The compare kernel's AVX2 lane loop (blocks of finite float32/float64/float16 pairs, the two
sides of one dtype or of two) gives what its
scalar loop gives: the same counts, maxima and worst element (the first of equal scores), sums
equal up to rounding; blocks holding NaN/Inf fall back to the scalar loop."""
import numpy as np
import pytest

from ts_core import native
from ts_core.compare.judge import metrics as M

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: the native kernel is not built")

SUMS = ("cosine", "mean_abs_err", "euclidean")


def _both(g, t, rtol=1e-4, atol=1e-5, chunk=M.CHUNK):
    """(scalar loop only, lane loop where the CPU has AVX2) on the same pair, on one thread."""
    from ts_core.native import _kernels

    out = []
    for simd in (False, True):
        _kernels.init(simd)
        try:
            acc = M._compare_native(g.reshape(-1), t.reshape(-1), rtol, atol, True, chunk)
            out.append(acc.result(g.shape))
        finally:
            _kernels.init(True)
    return out


def _same(scalar, lanes):
    for field in ("numel", "allclose_ratio", "within_0_1pct", "within_0_5pct", "max_abs_err", "max_rel_err",
                  "worst_index", "worst_golden", "worst_target", "nonfinite_mismatch", "golden_nan", "target_nan"):
        assert getattr(scalar, field) == getattr(lanes, field), field
    for field in SUMS:
        assert getattr(lanes, field) == pytest.approx(getattr(scalar, field), rel=1e-12), field


@pytest.mark.parametrize("g_dtype,t_dtype", [(np.float32, np.float32), (np.float64, np.float64),
                                             (np.float16, np.float16), (np.float32, np.float16),
                                             (np.float16, np.float64), (np.float64, np.float32)])
def test_lanes_equal_the_scalar_loop_with_nonfinite_blocks_zeros_and_a_tail(g_dtype, t_dtype):
    rng = np.random.default_rng(3)
    n = 200_003                                      # not a multiple of the block or the lane count
    g = rng.standard_normal(n).astype(g_dtype)
    t = (g + rng.standard_normal(n) * 1e-3).astype(t_dtype)
    g[rng.integers(0, n, 400)] = 0                   # relative error inf where target differs
    for arr in (g, t):                               # equal on both sides: no mismatch, yet two
        arr[[5, 77_777]] = [np.nan, np.inf]          # blocks go to the scalar loop
    scalar, lanes = _both(g, t)
    _same(scalar, lanes)
    assert scalar.nonfinite_mismatch == 0 and scalar.golden_nan == 1 and scalar.worst_index is not None


def test_equal_scores_name_the_first_element_whichever_lane_holds_it():
    g = np.ones(10_000, dtype=np.float32)
    t = g.copy()
    t[[4099, 103, 7001]] = 1.5                      # the same worst score in three lanes and blocks
    scalar, lanes = _both(g, t)                      # one chunk: the lanes decide the tie
    assert scalar.worst_index == lanes.worst_index == (103,)
    assert lanes.allclose_ratio == pytest.approx(1 - 3 / 10_000)
