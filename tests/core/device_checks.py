"""Checks of the device path (ts_core/backends/torch/device_kernels.py, device_arena.py) on a
given device: the Triton kernels against numpy and zlib, launches per recorded tensor, no sync.

Not collected by pytest itself (the name does not start with test_): test_device_kernels.py runs
this file in a subprocess with ``TSPROBE_DEVICE_PATH=1`` and ``TRITON_INTERPRET=1`` set before
anything imports triton (the interpreter then runs the kernels on CPU tensors, and the rest of
the test session is unaffected), once with the kernels and once with ``TSPROBE_DEVICE_KERNELS=0``
(the torch-op fallback); its ``cuda``-marked tests call the same checks on a GPU. DEVICE (env
``TSPROBE_CHECK_DEVICE``) is where the tensors live."""
from __future__ import annotations

import json
import math
import os
import zlib

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ts_core import PrecisionDebugger
from ts_core.backends.torch import device_arena
from ts_core.backends.torch.tensors import TorchAdapter

from ..conftest import tensor_summaries
from .models import loss_of, make

DEVICE = os.environ.get("TSPROBE_CHECK_DEVICE", "cpu")
KERNELS = os.environ.get("TSPROBE_DEVICE_KERNELS", "1") != "0"


def _reference(t: torch.Tensor) -> list:
    """max, min, mean, norm in float64 numpy; NaN anywhere: all NaN (torch's aminmax does so)."""
    a = t.detach().cpu()
    a = (a.abs() if a.is_complex() else a).to(torch.float64).numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isnan(a).any():
            return [math.nan] * 4
        return [a.max(), a.min(), a.mean(), float(np.sqrt(np.sum(a * a)))]


def _stats(ad: TorchAdapter, t: torch.Tensor) -> list:
    h = ad.stats(t)
    assert type(h) is device_arena.Slot, f"{t.dtype} {tuple(t.shape)}: not the device path ({type(h)})"
    return ad.stats_to_host([h])[0]


def _close(got, exp, rtol=1e-12):
    for g, e in zip(got, exp):
        if math.isnan(e):
            assert math.isnan(g), (got, exp)
        elif math.isinf(e):
            assert g == e, (got, exp)
        else:
            assert math.isfinite(g) and g == pytest.approx(e, rel=rtol, abs=1e-300), (got, exp)


def _tensors():
    g = torch.Generator().manual_seed(0)
    out = {}
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        out[f"randn-{dt}"] = torch.randn(3000, generator=g).to(dt)     # several programs
        fi = torch.finfo(dt)
        if dt != torch.float64:                          # any finite non-float64 tensor: finite sums
            out[f"min-{dt}"] = torch.full((4099,), fi.min, dtype=dt)
            out[f"max-{dt}"] = torch.full((7,), fi.max, dtype=dt)
    out["f64-huge"] = torch.full((1000,), 1e200, dtype=torch.float64)      # squares beyond double
    out["f64-max"] = torch.full((5,), torch.finfo(torch.float64).max, dtype=torch.float64)
    for dt in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64):
        info = torch.iinfo(dt)
        out[f"int-{dt}"] = torch.randint(info.min, info.max, (1500,), generator=g, dtype=dt)
    out["int64-big"] = torch.tensor([2**40, -7, 3], dtype=torch.int64)
    out["bool"] = torch.rand(777, generator=g) > 0.3
    base = torch.randn(6, 7, 8, generator=g)
    out["transposed"] = base.transpose(0, 2)
    out["sliced"] = base[1:5, ::2, 3:]
    out["5d-strided"] = torch.randn(2, 3, 4, 5, 6, generator=g)[:, ::2, :, 1:, ::3]
    out["scalar"] = torch.tensor(2.5)
    out["complex"] = torch.randn(40, dtype=torch.complex64, generator=g)
    x = torch.randn(2000, generator=g)
    x[1500] = math.nan
    out["nan"] = x
    y = torch.randn(100, generator=g)
    y[3] = math.inf
    out["inf"] = y
    z = y.clone()
    z[4] = -math.inf
    out["inf-and-minus-inf"] = z
    mask = torch.full((12, 12), torch.finfo(torch.float32).min).triu(1)     # HF's causal mask
    out["hf-mask"] = mask[None, None].expand(2, 1, 12, 12)
    return out


@pytest.mark.parametrize("name", list(_tensors()))
def test_statistics_equal_numpy(name):
    t = _tensors()[name].to(DEVICE)
    got = _stats(TorchAdapter(), t)
    exp = _reference(t)
    if name == "f64-max" and KERNELS:           # the true norm, sqrt(5) * max, is beyond float64
        assert got[:3] == [exp[0], exp[1], exp[0]] and got[3] == math.inf, got
        return
    if name.startswith("f64-") and not KERNELS:      # torch's float64 sums overflow (docs/performance.md)
        assert got[:2] == [exp[0], exp[1]] and got[3] == math.inf, got
        return
    if name == "f64-huge":
        exp = [1e200, 1e200, 1e200, 1e200 * math.sqrt(1000)]
    if name in ("inf", "inf-and-minus-inf"):    # IEEE as torch: a NaN mean for +inf and -inf
        ref = t.double()
        exp = [ref.max().item(), ref.min().item(), ref.mean().item(), torch.linalg.vector_norm(ref).item()]
    _close(got, exp, rtol=1e-12 if t.dtype != torch.float64 else 1e-9)


def test_empty_tensor_has_no_statistics_and_the_crc_of_no_bytes():
    ad = TorchAdapter()
    e = torch.empty(0, 3, device=DEVICE)
    assert ad.stats(e) is None and ad.crc32(e) == f"{zlib.crc32(b''):08x}"


def test_the_same_tensor_gives_the_same_bits():
    t = torch.randn(9000, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    rows = [_stats(TorchAdapter(), t) for _ in range(3)]
    assert rows[0] == rows[1] == rows[2]


SIZES = [0, 1, 2, 3, 4, 5, 7, 255, 256, 257, 1023, 2049, 4097]


@pytest.mark.skipif(not KERNELS, reason="CRCs on the host without the kernels")
@pytest.mark.parametrize("nbytes", SIZES)
def test_crc_equals_zlib(nbytes):
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(nbytes))
    ad = TorchAdapter()
    h = ad.crc32_deferred(raw.to(DEVICE))
    assert nbytes == 0 or type(h) is device_arena.Slot       # no bytes: the constant, no launch
    assert (h if nbytes == 0 else ad.stats_to_host([h])[0]) == f"{zlib.crc32(raw.numpy().tobytes()):08x}"


@pytest.mark.skipif(not KERNELS, reason="CRCs on the host without the kernels")
@pytest.mark.parametrize("name", ["randn-torch.float16", "randn-torch.bfloat16", "f64-max", "int-torch.int16",
                                  "int-torch.int64", "bool", "transposed", "5d-strided", "scalar", "hf-mask"])
def test_crc_of_every_dtypes_bytes_equals_zlib(name):
    t = _tensors()[name]
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    assert TorchAdapter().crc32(t.to(DEVICE)) == f"{zlib.crc32(raw):08x}"


@pytest.mark.skipif(not KERNELS, reason="the fused launch is a kernel's")
@pytest.mark.parametrize("name", ["randn-torch.float32", "randn-torch.float16", "randn-torch.bfloat16", "f64-max",
                                  "f64-huge", "int-torch.int16", "int-torch.int64", "bool", "scalar", "hf-mask",
                                  "nan", "inf-and-minus-inf"])
def test_md5_mode_statistics_and_crc_from_one_launch(name, monkeypatch):
    """md5 mode asks for statistics then the CRC of each tensor: one launch gives both, the
    statistics bit for bit those of the statistics kernel, the CRC zlib's."""
    from ts_core.backends.torch import device_kernels
    t = _tensors()[name].contiguous().to(DEVICE)
    alone = _stats(TorchAdapter(), t)
    launches = []
    real = device_kernels.launch
    monkeypatch.setattr(device_kernels, "launch", lambda *a, **k: (launches.append(a[0]), real(*a, **k)))
    ad = TorchAdapter()
    ad.reuse_copies = True                      # what the Summarizer sets in md5 mode
    stats = _stats(ad, t)
    crc = ad.crc32_deferred(t)
    assert launches == [device_kernels._stats_crc_kernel], launches
    assert type(crc) is device_arena.Slot
    raw = t.cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
    assert ad.stats_to_host([crc])[0] == f"{zlib.crc32(raw):08x}"
    assert [repr(v) for v in stats] == [repr(v) for v in alone]          # same bits, NaN included


# ---- a real training step at L1 --------------------------------------------------------------
class _Ops(TorchDispatchMode):
    """Every aten op dispatched, except inside a kernel launch (the interpreter's own copies)."""

    def __init__(self):
        super().__init__()
        self.ops, self.paused = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class _Syncs(TorchFunctionMode):
    """Calls that bring a tensor's values to the host (outside kernel launches)."""

    NAMES = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}

    def __init__(self):
        super().__init__()
        self.calls, self.paused, self.active = [], 0, False

    def __enter__(self):
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.active = False
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if not self.paused and (name in self.NAMES or (name == "to" and "cpu" in map(str, list(args[1:]) +
                                                                                      list((kwargs or {}).values())))):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def _step(dump: str, tool: bool, modes=(), summary_mode: str = "statistics"):
    """One SGD step of the tiny CNN (conv, batch norm, in-place ops) on DEVICE, recorded at L1
    when `tool` (with `summary_mode`), under `modes`; returns (loss, dump data or None)."""
    model, x = make("cnn", 0)
    model, x = model.to(DEVICE), x.to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # fingerprint off: the config-check's weight statistics are one batch resolved at the first
    # forward (configcheck/collect.py), not the per-record path measured here
    dbg = PrecisionDebugger(dump_path=dump, task="statistics", level="L1", step=[0], fingerprint=False,
                            summary_mode=summary_mode) if tool else None
    if dbg is not None:
        dbg.start(model)
    for m in modes:
        m.__enter__()
    try:
        loss = loss_of("cnn", model, x)
        loss.backward()
        opt.step()
    finally:
        for m in reversed(modes):
            m.__exit__(None, None, None)
    if dbg is None:
        return loss.detach(), None
    dbg.stop()
    dbg.step()
    dbg.close()
    with open(os.path.join(dump, "step0", "rank", "dump.json"), encoding="utf-8") as f:
        return loss.detach(), json.load(f)["data"]


_FLUSHES: list = []          # one entry per Summarizer.resolve (a flush) under _watch_launches


def _watch_launches(monkeypatch, *modes):
    """Count kernel launches; the modes ignore what runs inside one, and inside a flush
    (``Summarizer.resolve``: the one transfer, which also runs mid-step every FLUSH_SECONDS)."""
    from ts_core.backends.torch import device_kernels
    from ts_core.record.summary import Summarizer
    real_resolve = Summarizer.resolve

    def resolve(self):
        flushes.append(1)
        for m in modes:
            m.paused += 1
        try:
            real_resolve(self)
        finally:
            for m in modes:
                m.paused -= 1
    monkeypatch.setattr(Summarizer, "resolve", resolve)
    flushes = _FLUSHES
    launches = []
    real = device_kernels.launch

    def counted(*args, **kwargs):
        launches.append(args[0])
        for m in modes:
            m.paused += 1
        try:
            real(*args, **kwargs)
        finally:
            for m in modes:
                m.paused -= 1
    monkeypatch.setattr(device_kernels, "launch", counted)
    return launches


@pytest.mark.skipif(not KERNELS, reason="launches counted for the Triton kernels")
@pytest.mark.parametrize("summary_mode", ["statistics", "md5"])
def test_at_most_one_launch_or_op_per_recorded_tensor(tmp_path, monkeypatch, summary_mode):
    """Ops the tool dispatches (the step's ops with the tool minus without it) plus kernel
    launches, per tensor summary in dump.json: at most 1, md5 mode included (statistics and CRC
    from one launch). The arena chunk's allocation and zeroing (2 ops, once per flush) are counted
    too, not subtracted."""
    base = _Ops()
    _step(str(tmp_path / "none"), False, (base,))
    ops = _Ops()
    launches = _watch_launches(monkeypatch, ops)
    loss, data = _step(str(tmp_path / "tool"), True, (ops,), summary_mode)
    tensors = [s for s in tensor_summaries(data) if s.get("Max") is not None]
    if summary_mode == "md5":
        assert all(len(s.get("md5", "")) == 8 for s in tensors), [s for s in tensors if len(s.get("md5", "")) != 8]
    tool_ops = len(ops.ops) - len(base.ops)
    print(f"launch count: {tool_ops} ops + {len(launches)} launches for {len(tensors)} tensor summaries")
    assert len(tensors) > 30 and launches
    from collections import Counter
    extra = Counter(ops.ops)
    extra.subtract(Counter(base.ops))
    assert (tool_ops + len(launches)) / len(tensors) <= 1.0, (tool_ops, len(launches), len(tensors),
                                                              +extra)


@pytest.mark.skipif(not KERNELS, reason="the sync-free path is the kernels'")
def test_recording_never_syncs_and_the_flush_transfers_once(tmp_path, monkeypatch):
    syncs, ops = _Syncs(), _Ops()
    _watch_launches(monkeypatch, syncs, ops)
    transfers = []                     # (while recording?, chunk) of each arena transfer
    real_fetch = device_arena._Chunk.fetch

    def fetch(self, upto):
        if self.host is None or len(self.host) < upto:
            transfers.append((syncs.active and not syncs.paused, id(self), len(_FLUSHES)))
        return real_fetch(self, upto)
    monkeypatch.setattr(device_arena._Chunk, "fetch", fetch)
    loss, data = _step(str(tmp_path / "tool"), True, (syncs, ops))
    assert syncs.calls == [] and "aten._local_scalar_dense.default" not in ops.ops, (syncs.calls,)
    assert transfers and not any(during for during, _, _ in transfers)      # only inside a flush
    assert len(transfers) == len({(chunk, flush) for _, chunk, flush in transfers})   # one per chunk
    summaries = [s for s in tensor_summaries(data) if s.get("Max") is not None]
    assert len(summaries) > 30 and all(isinstance(s["Mean"], float) for s in summaries)


@pytest.mark.parametrize("task", ["statistics", "md5"])
def test_training_is_bit_identical_and_finite_masks_stay_finite(tmp_path, task):
    """The device path leaves the step's numbers untouched; an HF-style finfo.min mask passed to
    a recorded op gets numpy's finite Mean and Norm in dump.json."""
    loss0, _ = _step(str(tmp_path / "none"), False)
    loss1, _ = _step(str(tmp_path / "tool"), True)
    assert torch.equal(loss0, loss1)
    mask = torch.full((8, 8), torch.finfo(torch.float32).min).triu(1)[None, None].to(DEVICE)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / task), task="statistics", level="L1", step=[0],
                            summary_mode=task)
    dbg.start()
    torch.softmax(torch.zeros(1, 1, 8, 8, device=DEVICE) + mask, dim=-1)
    dbg.stop()
    dbg.close()
    with open(os.path.join(str(tmp_path / task), "step0", "rank", "dump.json"), encoding="utf-8") as f:
        rec = json.load(f)["data"]["Tensor.__add__.0.forward"]["input_args"][1]
    exp = _reference(mask)
    assert math.isfinite(rec["Mean"]) and math.isfinite(rec["Norm"])
    _close([rec["Max"], rec["Min"], rec["Mean"], rec["Norm"]], exp)
    if task == "md5":
        assert rec["md5"] == f"{zlib.crc32(mask.cpu().numpy().tobytes()):08x}"
