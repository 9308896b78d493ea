"""The grading of one output, checked against torch's own rounding and hand-made errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ts_core.acccheck.standards import ERROR, PASS, grade, measure, round_to

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_round_to_matches_torch(dtype):
    x = np.concatenate([RNG.standard_normal(10000) * 10.0 ** RNG.integers(-6, 6, 10000), [0.0, -0.0, np.nan]])
    ours = round_to(x, dtype)
    theirs = torch.from_numpy(x).to(getattr(torch, dtype)).double().numpy()
    np.testing.assert_array_equal(ours, theirs)


def test_correctly_rounded_bf16_is_within_half_ulp_and_passes():
    ref = RNG.standard_normal(4096)
    out = torch.from_numpy(ref).bfloat16().double().numpy()        # the best a bf16 result can be
    m = measure(ref, out, "torch.bfloat16")
    assert m.max_ulp_err <= 0.5 and m.ulp_err_proportion == 0
    assert grade("gelu", "torch.bfloat16", m, None).status == PASS            # no peer: ULP standard
    assert grade("gelu", "torch.bfloat16", m, m).status == PASS               # peer as good


def test_bias_fails_through_error_balance_only():
    """Every element within bf16 rounding, all of them too high: only the balance shows it."""
    ref = np.abs(RNG.standard_normal(4096)) + 0.5
    peer = torch.from_numpy(ref).bfloat16().double().numpy()
    biased = torch.from_numpy(ref * (1 + 2 ** -9)).bfloat16().double().numpy()
    t, p = measure(ref, biased, "bfloat16"), measure(ref, peer, "bfloat16")
    assert t.max_rel_err < 2 ** -7 and t.eb > 0.2
    g = grade("gelu", "bfloat16", t, p)
    assert g.status == ERROR and [r for r in g.reasons if "error balance" in r] and len(g.reasons) == 1


def test_benchmark_ratio_and_levels():
    ref = RNG.standard_normal(4096) + 3.0
    peer = ref * (1 + 1e-3 * RNG.standard_normal(4096))
    worse = ref * (1 + 3e-3 * RNG.standard_normal(4096))
    t, p = measure(ref, worse, "float16"), measure(ref, peer, "float16")
    assert t.mean_rel_err / p.mean_rel_err == pytest.approx(3.0, rel=0.1)
    assert grade("gelu", "float16", t, p).status == ERROR                 # L0: mean_rel_err limit 2x
    # an L2 API (matmul) allows 1.2x on the mean: 1.1x passes there but not 1.3x
    slightly = ref * (1 + 1.1e-3 * RNG.standard_normal(4096))
    assert grade("matmul", "float16", measure(ref, slightly, "float16"), p).status == PASS
    assert grade("matmul", "float16", measure(ref, ref * (1 + 1.5e-3 * RNG.standard_normal(4096)), "float16"),
                 p).status == ERROR


def test_binary_standard_for_integer_and_selecting_apis():
    ref = np.arange(10, dtype=np.float64)
    assert grade("argmax", "torch.int64", measure(ref, ref, "torch.int64"), None).status == PASS
    off = ref.copy()
    off[3] = 4
    m = measure(ref, off, "torch.int64")
    assert m.error_rate == pytest.approx(0.1)
    assert grade("argmax", "torch.int64", m, None).status == ERROR
    x = RNG.standard_normal(100)
    relu = np.maximum(torch.from_numpy(x).bfloat16().double().numpy(), 0)
    assert grade("relu", "torch.bfloat16", measure(np.maximum(x, 0), relu, "torch.bfloat16"), None).standard == "binary"


def test_nan_where_the_reference_has_none_fails():
    ref = RNG.standard_normal(100)
    out = torch.from_numpy(ref).bfloat16().double().numpy()
    out[5] = np.nan
    m = measure(ref, out, "bfloat16")
    assert m.inf_nan_err_ratio == 1.0
    assert grade("gelu", "bfloat16", m, measure(ref, ref, "bfloat16")).status == ERROR
