"""The native one-pass statistics kernel against numpy (float64), and its fallbacks."""
import os
import subprocess
import sys
import threading
import zlib

import numpy as np
import pytest
import torch

from ts_core import native
from ts_core.backends.torch import device_arena
from ts_core.backends.torch.tensors import TorchAdapter
from ts_core.dumpfmt import reference_stats

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: the native kernel is not built")

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool]


def _tensor(dtype, n, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.3
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 7 + 0.5).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), (n,), generator=g, dtype=dtype)



@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 7, 513, 100_003])
def test_native_stats_match_numpy(dtype, n):
    t = _tensor(dtype, n, n)
    row = TorchAdapter().stats(t)
    assert type(row) is tuple, "a contiguous CPU tensor takes the native path"
    ref = reference_stats(t.float().numpy() if dtype == torch.bfloat16 else t.numpy(), str(dtype))
    assert row[0] == ref["Max"] and row[1] == ref["Min"]          # extremes are exact
    assert row[2] == pytest.approx(ref["Mean"], rel=1e-6, abs=1e-9 * max(1.0, abs(ref["Norm"])))
    assert row[3] == pytest.approx(ref["Norm"], rel=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_values_take_the_framework_path(bad):
    t = torch.tensor([1.0, bad, 3.0])
    assert native.Stats()(t.data_ptr(), 3, native.F32) is None
    ad = TorchAdapter()
    handle = ad.stats(t)
    assert type(handle) is device_arena.Slot       # exact torch semantics for NaN/Inf (float64 ops)
    mx, mn, mean, norm = ad.stats_to_host([handle])[0]
    torch_ref = [t.max().item(), t.min().item(), t.mean().item(), t.norm().item()]
    assert [str(v) for v in (mx, mn, mean, norm)] == [str(v) for v in torch_ref]


def test_non_contiguous_and_empty_tensors():
    base = torch.randn(64, 33)
    view = base.t()                                # not contiguous: copied, then the native pass
    row = TorchAdapter().stats(view)
    assert type(row) is tuple
    assert row[:2] == (view.max().item(), view.min().item())
    assert TorchAdapter().stats(torch.empty(0)) is None


def test_a_view_reuses_its_base_statistics_until_either_changes():
    adapter = TorchAdapter()
    base = torch.randn(8, 16)
    first = adapter.stats(base)
    view = base.view(16, 8)
    assert adapter.stats(view) is first              # same elements, other shape: computed once
    view.mul_(2.0)                                   # the shared version counter moves
    again = adapter.stats(base)
    assert again is not first and again[0] == pytest.approx(2 * first[0])
    other = torch.randn(8, 16)                       # another tensor: its own statistics
    assert adapter.stats(other) is not adapter.stats(base)


def _zlib_crc(t: torch.Tensor) -> str:
    return f"{zlib.crc32(t.detach().contiguous().numpy().tobytes()) & 0xFFFFFFFF:08x}"


def test_tensor_crc_is_zlib_of_its_bytes_and_follows_in_place_changes():
    adapter = TorchAdapter()
    base = torch.randn(8, 16)
    assert adapter.crc32(base) == _zlib_crc(base)
    view = base.view(16, 8)
    assert adapter.crc32(view) == _zlib_crc(base)       # same bytes
    view.add_(1.0)                                       # in place through the view
    assert adapter.crc32(base) == _zlib_crc(base) != adapter.crc32(torch.zeros(1))
    cols = base.t()                                      # non-contiguous: its row-major bytes
    assert adapter.crc32(cols) == _zlib_crc(cols.contiguous())
    half = torch.randn(33).to(torch.bfloat16)
    assert adapter.crc32(half) == f"{zlib.crc32(half.view(torch.int16).numpy().tobytes()) & 0xFFFFFFFF:08x}"
    assert adapter.crc32(torch.empty(0)) == "00000000"


def test_crc32_matches_zlib():
    data = np.random.default_rng(0).standard_normal(12345).astype(np.float32).view(np.uint8)
    assert native.crc32_hex(data) == f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def test_disabled_native_path_gives_the_same_summary(tmp_path):
    """TSPROBE_NATIVE=0 (or no compiler): the pure-torch path writes the same Max/Min and
    Mean/Norm within float32 rounding."""
    code = ("import json, torch, ts_core.native as n\n"
            "from ts_core.backends.torch.tensors import TorchAdapter\n"
            "t = (torch.randn(10007, generator=torch.Generator().manual_seed(3)) * 5).to(torch.bfloat16)\n"
            "a = TorchAdapter(); h = a.stats(t); rows = a.stats_to_host([h])\n"
            "print(json.dumps({'native': n.available(), 'row': rows[0]}))\n")
    rows = {}
    for flag in ("0", "1"):
        env = dict(os.environ, TSPROBE_NATIVE=flag)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        import json
        rows[flag] = json.loads(out.stdout.strip().splitlines()[-1])
    assert rows["0"]["native"] is False and rows["1"]["native"] is True
    a, b = rows["0"]["row"], rows["1"]["row"]
    assert a[:2] == b[:2]
    assert a[2] == pytest.approx(b[2], rel=1e-5, abs=1e-7) and a[3] == pytest.approx(b[3], rel=1e-5)


@pytest.mark.skipif(not native.available(), reason="native kernels not built (no C compiler)")
def test_threads_each_get_their_own_statistics():
    """The kernel runs with the GIL released: two threads summarising at once (a training
    thread and a data-loading thread) must not read each other's results."""
    stats = native.Stats()
    wrong = []

    def work(value: float) -> None:
        t = torch.full((1 << 20,), value)
        for _ in range(200):
            row = stats(t.data_ptr(), t.numel(), 0)
            if row[0] != value:
                wrong.append((value, row[0]))

    threads = [threading.Thread(target=work, args=(v,)) for v in (0.0, 7.0)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert wrong == []
