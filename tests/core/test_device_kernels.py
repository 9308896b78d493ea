"""The device path (one Triton launch per recorded tensor, a CRC on the device, one transfer per
flush): device_checks.py run in a subprocess with ``TSPROBE_DEVICE_PATH=1`` and
``TRITON_INTERPRET=1`` set before triton is imported (CPU tensors through the real kernels, in
Triton's interpreter), with the torch-op fallback, and on CUDA where a GPU is present. Plus the
native kernel's wide accumulation: a finite tensor never gets an infinite Mean or Norm."""
from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from ts_core import native
from ts_core.backends.torch import device_arena
from ts_core.backends.torch.tensors import TorchAdapter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_TRITON = importlib.util.find_spec("triton") is not None


def _run_checks(env: dict, timeout: int = 900) -> None:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
            **env}
    for k in [k for k, v in env.items() if v is None]:
        full.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           os.path.join("tests", "core", "device_checks.py")],
                          cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="needs triton installed (pip install triton==3.9.0, the test extra)")
def test_device_kernels_in_the_triton_interpreter():
    _run_checks({"TSPROBE_DEVICE_PATH": "1", "TRITON_INTERPRET": "1", "TSPROBE_DEVICE_KERNELS": None})


@pytest.mark.slow
def test_device_path_torch_fallback():
    """Without Triton: torch ops in float64 into the same arena, one transfer per flush."""
    _run_checks({"TSPROBE_DEVICE_PATH": "1", "TSPROBE_DEVICE_KERNELS": "0"})


def _cuda_reason() -> str:
    if not torch.cuda.is_available():
        return "no CUDA device here (the interpreter test covers the kernels on CPU)"
    return "" if HAS_TRITON else "needs triton installed"


@pytest.mark.cuda
@pytest.mark.skipif(bool(_cuda_reason()), reason=_cuda_reason() or "-")
def test_device_kernels_on_cuda():
    """The same checks with the compiled kernels on the GPU."""
    _run_checks({"TSPROBE_CHECK_DEVICE": "cuda", "TSPROBE_DEVICE_PATH": None, "TRITON_INTERPRET": None,
                 "TSPROBE_DEVICE_KERNELS": None})


# ---- native kernel: wide enough for any finite tensor -------------------------------------------
def _filled():
    out = {}
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        fi = torch.finfo(dt)
        for n in (1, 7, 512, 513, 5000):
            out[f"{dt}-min-{n}"] = torch.full((n,), fi.min, dtype=dt)
            out[f"{dt}-max-{n}"] = torch.full((n,), fi.max, dtype=dt)
    mask = torch.zeros(2, 1, 40, 40)
    mask.masked_fill_(torch.ones(40, 40, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    out["hf-mask"] = mask
    half = torch.zeros(3000)
    half[::2] = torch.finfo(torch.float32).max                  # overflowing blocks next to plain ones
    half[1::2] = torch.finfo(torch.float32).min / 2
    out["alternating"] = half
    return out


@pytest.mark.skipif(not native.available(), reason="the native kernel is not built here")
@pytest.mark.parametrize("name", list(_filled()))
def test_native_statistics_of_a_finite_tensor_are_finite_and_numpys(name):
    t = _filled()[name]
    row = TorchAdapter().stats(t)
    assert type(row) is tuple, "the native kernel's host row"
    a = t.to(torch.float64).numpy()
    with np.errstate(over="ignore"):
        mean, norm = float(np.mean(a, dtype=np.float64)), float(np.sqrt(np.sum(a * a)))
    if t.dtype == torch.float64 and not math.isfinite(mean):      # numpy's own sum overflows
        mean = float(np.mean(a / 2**64)) * 2**64
    if t.dtype == torch.float64 and not math.isfinite(norm):
        norm = float(np.sqrt(np.sum((a / 2**600) ** 2))) * 2**600     # inf when truly beyond float64
    assert row[0] == a.max() and row[1] == a.min()
    assert math.isfinite(row[2]) and row[2] == pytest.approx(mean, rel=1e-6)
    if math.isfinite(norm):
        assert math.isfinite(row[3]) and row[3] == pytest.approx(norm, rel=1e-6)
    else:
        assert t.dtype == torch.float64 and row[3] == math.inf


def test_a_slot_launched_after_a_flush_copied_its_chunk_is_fetched_again():
    """Another thread took slot A, then B was written and flushed before A's writer was
    launched: the flush's copy holds A's zeros, and A's value must come from a later copy."""
    arena = device_arena.Arena(torch.device("cpu"))
    chunk, a, _ = arena.take(device_arena.STATS_SLOTS)          # A: taken, its writer not launched
    same, b, _ = arena.take(device_arena.STATS_SLOTS)
    assert same is chunk
    chunk.floats[b:b + 4] = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    assert device_arena.Slot(chunk, b, 0).value() == [1.0, 2.0, 3.0, 4.0]     # the flush: copies A too
    chunk.floats[a:a + 4] = torch.tensor([5.0, 6.0, 7.0, 8.0], dtype=torch.float64)
    assert device_arena.Slot(chunk, a, 0).value() == [5.0, 6.0, 7.0, 8.0]
    c, d, _ = arena.take(1)
    c.ints[d] = 0xDEADBEEF
    assert device_arena.Slot(c, d, 1).value() == "deadbeef"
