"""The C extension (ts_core.native._kernels) against the pure paths on the same inputs, and its
CPU dispatch: the AVX2/AVX-512 loops give the bits of the portable ones."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ts_core import native

from ..conftest import tensor_summaries

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_ext = pytest.mark.skipif(not native.available(), reason="the extension was not built (no C compiler at install)")

_DUMP = """
import sys, torch
from ts_core import PrecisionDebugger
from tests.core.models import train_steps
dbg = PrecisionDebugger(dump_path=sys.argv[1], task="statistics", level="mix", step=[0, 1], summary_mode="md5")
train_steps("cnn", dbg, steps=2)
dbg.close()
"""


def _dump(tmp_path, flag: str) -> str:
    root = str(tmp_path / f"native{flag}")
    env = dict(os.environ, TSPROBE_NATIVE=flag, TSPROBE_QUIET="1", OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", _DUMP, root], cwd=ROOT, env=env, check=True, timeout=300)
    return root


@needs_ext
def test_a_dump_with_and_without_the_extension_holds_the_same_values(tmp_path):
    """Two real training steps dumped with the kernels and with TSPROBE_NATIVE=0 (the pure torch
    path): the same records, shapes, extremes and CRCs exactly, means/norms within float32
    rounding, the same stacks."""
    with_ext, pure = _dump(tmp_path, "1"), _dump(tmp_path, "0")
    for step in ("step0", "step1"):
        a_dir, b_dir = (os.path.join(r, step, "rank") for r in (with_ext, pure))
        a, b = (json.load(open(os.path.join(d, "dump.json"))) for d in (a_dir, b_dir))
        assert a["data"].keys() == b["data"].keys() and len(a["data"]) > 20
        sa, sb = list(tensor_summaries(a["data"])), list(tensor_summaries(b["data"]))
        assert len(sa) == len(sb) > 50
        for x, y in zip(sa, sb):
            assert (x["dtype"], x["shape"], x["Max"], x["Min"], x["md5"]) == (y["dtype"], y["shape"], y["Max"], y["Min"],
                                                                             y["md5"])
            assert x["Mean"] == pytest.approx(y["Mean"], rel=1e-5, abs=1e-6 * max(1.0, y["Norm"]))
            assert x["Norm"] == pytest.approx(y["Norm"], rel=1e-5)
        stacks = [json.load(open(os.path.join(d, "stack.json"))) for d in (a_dir, b_dir)]
        assert stacks[0] == stacks[1]


def _arrays():
    rng = np.random.default_rng(7)
    for n in (1, 15, 16, 17, 511, 513, 4099, 70001):
        f = (rng.standard_normal(n) * 9 + 0.25)
        yield native.F32, f.astype(np.float32)
        yield native.F64, f
        yield native.F16, f.astype(np.float16)
        yield native.BF16, (f.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        yield native.I8, rng.integers(-128, 128, n).astype(np.int8)
        yield native.U8, rng.integers(0, 256, n).astype(np.uint8)
        yield native.I16, rng.integers(-30000, 30000, n).astype(np.int16)
        yield native.I32, rng.integers(-2**31, 2**31 - 1, n).astype(np.int32)
        yield native.I64, rng.integers(-2**40, 2**40, n)


@needs_ext
def test_the_cpu_specific_loops_give_the_bits_of_the_portable_ones():
    """The fixed-lane accumulation of stats.c: whichever loops this CPU gets, a dump's statistics
    are the same bits as on a CPU without AVX (checked against numpy too)."""
    from ts_core.native import _kernels

    chosen = _kernels.init(True)
    try:
        fast = [_kernels.stats(a.ctypes.data, a.size, code) for code, a in _arrays()]
        assert _kernels.init(False) == "baseline"
        portable = [_kernels.stats(a.ctypes.data, a.size, code) for code, a in _arrays()]
    finally:
        _kernels.init(True)
    assert fast == portable, f"{chosen} loops differ from the baseline ones"
    for (code, a), (mx, mn, total, squares) in zip(_arrays(), fast):
        ref = ((a.astype(np.uint32) << 16).view(np.float32) if code == native.BF16 else a).astype(np.float64)
        assert (mx, mn) == (ref.max(), ref.min())
        assert total == pytest.approx(ref.sum(), rel=1e-5, abs=1e-4 * np.sqrt(squares))
        assert squares == pytest.approx((ref * ref).sum(), rel=1e-5)


@needs_ext
def test_row_is_mean_and_norm_of_the_sums():
    a = np.linspace(-3, 5, 1001, dtype=np.float32)
    mx, mn, total, squares = native.Stats()(a.ctypes.data, a.size, native.F32)
    assert native.Stats().row(a.ctypes.data, a.size, native.F32) == (mx, mn, total / a.size, squares ** 0.5)
    assert native.Stats().row(a.ctypes.data, a.size, 99) is None      # unknown dtype code


def test_disabled_extension_says_why():
    code = "import ts_core.native as n; print(n.available()); print(n.describe())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, TSPROBE_NATIVE="0"),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["False", "native kernels: not in use (TSPROBE_NATIVE=0); pure numpy/framework paths"]
    assert native.frame_walker() is None or callable(native.frame_walker())
