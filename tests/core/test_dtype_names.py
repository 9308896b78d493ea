"""Dtype names have one home (dumpfmt/dtypes.py): torch's, MindSpore's and numpy's spellings of
a dtype are one name, checked against the frameworks' own dtype objects; the precision rank
follows the dtypes' machine epsilon (torch.finfo), not a table of our own."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ts_core.dumpfmt.dtypes import dtype_name, is_exact, precision  # noqa: E402

FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
EXACT = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)


@pytest.mark.parametrize("dt", FLOATS + EXACT)
def test_torch_and_numpy_spellings_are_one_name(dt):
    name = dtype_name(dt)                                  # "torch.float32" -> "float32"
    assert dtype_name(str(dt)) == name
    assert dtype_name(name.capitalize()) == name           # MindSpore writes Float32, Int64, Bool
    if dt is not torch.bfloat16:                           # numpy has no bfloat16
        assert np.dtype(name).name == name or np.dtype(name) == np.dtype(bool)
    assert is_exact(dt) == (not dt.is_floating_point)


def test_precision_follows_machine_epsilon():
    """Never ranked above a dtype with a smaller epsilon; the 16-bit floats share one rank (the
    rank says where precision is lost, and both lose it against float32)."""
    eps = {dtype_name(dt): torch.finfo(dt).eps for dt in FLOATS}
    for a in eps:
        for b in eps:
            if eps[a] < eps[b]:
                assert precision(a) >= precision(b), (a, b)
            if eps[a] < eps[b] and max(eps[a], eps[b]) > 1e-4 > min(eps[a], eps[b]):
                assert precision(a) > precision(b), (a, b)     # 32/64-bit against 16-bit
    assert precision(torch.float64) > precision(torch.float32) > precision(torch.float16)
    assert all(precision(dt) is None for dt in EXACT)
    assert dtype_name("half") == "float16" and dtype_name("bf16") == "bfloat16" and dtype_name(None) == ""
