"""Statistics still on an accelerator wait for the step end (issue 37): a mid-step flush would
bring them to the host, a sync that drains the GPU's queue. No GPU here, so the adapter's
pending handles say they live on one (`device`), while their values are the real device-path
results; what is checked is *when* the collector resolves them, and that nothing is lost."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from ts_core import PrecisionDebugger  # noqa: E402
from ts_core.backends.torch import TorchBackend  # noqa: E402
from ts_core.backends.torch.tensors import TorchAdapter  # noqa: E402
from ts_core.record import collector  # noqa: E402
from ts_core.record.summary import on_accelerator  # noqa: E402

from ..conftest import load_dump  # noqa: E402


class _OnAccelerator:
    """A pending handle that reports an accelerator device; its value is the wrapped one's."""

    device = torch.device("cuda")

    def __init__(self, inner):
        self.inner = inner


class _DevicePath(TorchAdapter):
    """Every tensor on the device path (no native host rows), whatever this session loaded."""

    def __init__(self):
        super().__init__()
        self._native = None


class _AcceleratorAdapter(_DevicePath):
    resolves_mid_step = 0
    in_step = False

    def stats(self, t):
        handle = super().stats(t)
        return handle if handle is None or type(handle) is tuple else _OnAccelerator(handle)

    def stats_to_host(self, handles):
        if _AcceleratorAdapter.in_step and handles:
            _AcceleratorAdapter.resolves_mid_step += 1
        return super().stats_to_host([h.inner if isinstance(h, _OnAccelerator) else h for h in handles])


def _run(path, adapter, monkeypatch):
    monkeypatch.setattr(TorchBackend, "adapter_class", adapter)
    monkeypatch.setattr(collector, "FLUSH_RECORDS", 1)    # a flush would be due after every record
    monkeypatch.setattr(collector, "FLUSH_SECONDS", 0.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    # fingerprint off: its batch summary defers on an accelerator by the batch's own device
    # (configcheck/collect.py), which these host tensors are not
    dbg = PrecisionDebugger(dump_path=str(path), level="mix", step=[0], fingerprint=False)
    _AcceleratorAdapter.resolves_mid_step = 0
    dbg.start(model)
    _AcceleratorAdapter.in_step = True
    model(x).square().mean().backward()
    _AcceleratorAdapter.in_step = False
    dbg.stop()
    dbg.step()
    dbg.close()
    return load_dump(os.path.join(str(path), "step0", "rank"))["data"]


def test_statistics_on_an_accelerator_wait_for_the_step_end_and_lose_nothing(tmp_path, monkeypatch):
    waited = _run(tmp_path / "accelerator", _AcceleratorAdapter, monkeypatch)
    assert _AcceleratorAdapter.resolves_mid_step == 0
    plain = _run(tmp_path / "host", _DevicePath, monkeypatch)
    assert waited == plain and len(plain) > 5                # same records, same values


def test_host_handles_are_flushed_as_they_come(tmp_path, monkeypatch):
    class _Counting(_AcceleratorAdapter):                      # host handles: the usual flushes
        def stats(self, t):
            return _DevicePath.stats(self, t)
    _run(tmp_path / "host", _Counting, monkeypatch)
    assert _AcceleratorAdapter.resolves_mid_step > 0         # the rule above is what holds them


def teston_accelerator_reads_the_handle_device():
    assert not on_accelerator(torch.zeros(2))
    assert on_accelerator(torch.zeros(2, device="meta"))
    assert not on_accelerator((1.0, 2.0, 3.0, 4.0))
