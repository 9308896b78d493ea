"""The native one-pass compare kernel gives what the numpy accumulator (the reference) gives,
on one thread and split over threads, with NaN/Inf, zeros in golden, mixed dtypes (float32,
float64, float16 and bfloat16 on either side) and small chunks."""
import numpy as np
import pytest

from ts_core import native
from ts_core.compare.judge import metrics as M

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: the native kernel is not built")

EXACT = ("numel", "allclose_ratio", "within_0_1pct", "within_0_5pct", "max_abs_err", "max_rel_err",
         "worst_index", "worst_golden", "worst_target", "nonfinite_mismatch", "golden_nan", "target_nan",
         "golden_inf", "target_inf")


def _numpy_reference(g, t, rtol, atol, equal_nan, chunk):
    acc = M._Accumulator(rtol, atol, equal_nan)
    gf, tf = g.reshape(-1), t.reshape(-1)
    for s in range(0, gf.size, chunk):
        acc.update(M._as_float64(gf[s:s + chunk]), M._as_float64(tf[s:s + chunk]), s)
    return acc.result(g.shape)


def _assert_same(a, b):
    """Counts, maxima and the worst element exactly (NaN as NaN), float64 sums up to rounding."""
    for field in EXACT:
        va, vb = getattr(a, field), getattr(b, field)
        assert va == vb or (isinstance(va, float) and np.isnan(va) and np.isnan(vb)), field
    for field in ("cosine", "mean_abs_err", "euclidean"):
        va, vb = getattr(a, field), getattr(b, field)
        assert (va is None) == (vb is None) and (va is None or va == pytest.approx(vb, rel=1e-9)), field


def _case(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000)) if seed % 3 else int(rng.integers(2_100_000, 2_600_000))
    g = rng.standard_normal(n).astype(rng.choice([np.float32, np.float64, np.float16]))
    t = (g + rng.standard_normal(n) * rng.choice([0.0, 1e-7, 1e-3])).astype(rng.choice([np.float32, np.float64,
                                                                                        np.float16]))
    g[rng.integers(0, n, max(1, n // 50))] = 0
    if seed % 2 == 0:
        for arr in (g, t):
            arr[rng.integers(0, n, 5)] = rng.choice([np.nan, np.inf, -np.inf], 5)
    return g, t


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("rtol,atol", [(1e-4, 1e-5), (1e-3, 0.0), (0.0, 0.0)])
def test_native_equals_numpy(seed, rtol, atol, monkeypatch):
    g, t = _case(seed)
    chunk = 1000 if seed % 4 == 1 else M.CHUNK
    if seed % 3 == 0:                         # large pairs: force more parts too
        monkeypatch.setattr(M, "SEGMENT", 1 << 18)
    equal_nan = bool(seed % 2)
    native_result = M._compare_native(g, t, rtol, atol, equal_nan, chunk)
    assert native_result is not None
    a = native_result.result(g.shape)
    b = _numpy_reference(g, t, rtol, atol, equal_nan, chunk)
    _assert_same(a, b)


def test_other_dtypes_take_the_numpy_path():
    g = np.arange(10, dtype=np.int32)
    assert M._compare_native(g, g.copy(), 1e-3, 1e-3, True, M.CHUNK) is None
    m = M.compare_arrays(g, g + 1, 0.0, 0.0)
    assert m.allclose_ratio == 0.0 and m.max_abs_err == 1.0 and m.worst_index == (0,)
    assert M._compare_native(np.arange(10, dtype=np.float16), np.arange(10, dtype=np.float16), 1e-3, 1e-3, True,
                             M.CHUNK) is not None


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns of float32 values (truncated: any pattern will do, NaN included)."""
    return (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _bf16_values(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 bit patterns, computed apart from the kernel (numpy shifts)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _native_raw(g, gc, t, tc, rtol, atol, equal_nan, values):
    """The kernel on raw buffers of dtype codes gc/tc, its parts merged as the judge merges them
    (the worst element's values read from `values`, the pair as floats)."""
    parts = [native.compare_range(g.ctypes.data, gc, t.ctypes.data, tc, b, e, M.CHUNK, rtol, atol, equal_nan)
             for b, e in native.compare_parts(g.size, M.CHUNK, 1 << 18)]
    return M._merge_native(parts, *values, rtol, atol, equal_nan).result(g.shape)


@pytest.mark.parametrize("other", ["bf16", "f32", "f16"])
@pytest.mark.parametrize("seed", range(4))
def test_bfloat16_equals_numpy_on_its_float32_values(seed, other):
    """bfloat16 (not a numpy dtype: the kernel reads its bits) against bfloat16, float32 or
    float16, with NaN/Inf: the same metrics as the numpy reference on the widened values."""
    g, t = _case(seed)
    gb = _bf16_bits(g)
    gv = _bf16_values(gb)
    if other == "bf16":
        tb = _bf16_bits(t)
        traw, tc, tv = tb, native.BF16, _bf16_values(tb)
    else:
        tv = np.ascontiguousarray(t, dtype=np.float32 if other == "f32" else np.float16)
        traw, tc = tv, (native.F32 if other == "f32" else native.F16)
    for rtol, atol, equal_nan in ((1e-2, 1e-3, True), (0.0, 0.0, False)):
        a = _native_raw(gb, native.BF16, traw, tc, rtol, atol, equal_nan, (gv, tv))
        b = _numpy_reference(gv, tv, rtol, atol, equal_nan, M.CHUNK)
        _assert_same(a, b)


def test_float16_specials_widen_exactly():
    """Every float16 bit pattern (subnormals, +-0, +-inf, NaNs) against itself shifted by one
    unit: the kernel's widening agrees with numpy's on all 65,536."""
    g = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    t = (g.view(np.uint16) ^ np.uint16(1)).view(np.float16)
    for rtol, atol in ((1e-3, 1e-3), (0.0, 0.0)):
        a = M._compare_native(g, t, rtol, atol, True, M.CHUNK).result(g.shape)
        b = _numpy_reference(g, t, rtol, atol, True, M.CHUNK)
        for field in EXACT:
            va, vb = getattr(a, field), getattr(b, field)
            assert va == vb or (isinstance(va, float) and np.isnan(va) and np.isnan(vb)), field
        assert a.golden_nan == 2 * 1023 and a.golden_inf == 2 and a.nonfinite_mismatch == 4


def _maxima_case(kind):
    """Pairs built so that the kernel's maxima (max relative error, worst element) move in every
    vector, never, on ties, at a zero golden, in subnormals, or where float64 squares overflow."""
    n = 5003
    i = np.arange(n, dtype=np.float64)
    g = np.linspace(1.0, 2.0, n)
    if kind == "rising":                       # every element beats the one before
        t = g + 1e-6 * (i + 1)
    elif kind == "falling":                    # only the first elements improve anything
        t = g + 1e-6 * (n - i)
    elif kind == "ties":                       # the same score everywhere: the first wins
        g = np.ones(n)
        t = g + 1e-3
    elif kind == "zero_golden_late":           # relative error inf at an element near the end
        t = g + 1e-7
        g[n - 7], t[n - 7] = 0.0, 1e-9
    elif kind == "subnormal":
        g = np.full(n, 4e-320)
        t = g + 5e-324 * (i % 3)
    else:                                      # "huge": float64 squares overflow, the scalar loop takes over
        g = np.full(n, 1e200)
        t = g * (1 + 1e-9 * (i % 5))
    return np.ascontiguousarray(g), np.ascontiguousarray(t)


@pytest.mark.parametrize("kind", ["rising", "falling", "ties", "zero_golden_late", "subnormal", "huge"])
@pytest.mark.parametrize("rtol,atol", [(1e-4, 1e-5), (0.0, 0.0)])
def test_native_maxima_equal_numpy(kind, rtol, atol):
    g, t = _maxima_case(kind)
    for gd, td in ((np.float64, np.float64), (np.float32, np.float32), (np.float16, np.float16),
                   (np.float32, np.float16), (np.float64, np.float32)):
        with np.errstate(over="ignore", under="ignore"):       # "huge": the squares overflow on purpose
            ga, ta = g.astype(gd), t.astype(td)
            native_result = M._compare_native(ga, ta, rtol, atol, True, M.CHUNK)
            assert native_result is not None
            a, b = native_result.result(ga.shape), _numpy_reference(ga, ta, rtol, atol, True, M.CHUNK)
        for field in ("max_rel_err", "max_abs_err", "worst_index", "worst_golden", "worst_target",
                      "allclose_ratio", "within_0_1pct", "within_0_5pct"):
            assert getattr(a, field) == getattr(b, field), (kind, gd, field)
