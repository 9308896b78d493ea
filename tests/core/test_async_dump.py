"""async_dump: the same dump as without it, but nothing is fetched, copied to the host or written
inside the step; everything reaches disk at stop(); what waits is bounded."""
import json
import os
import time
import zlib

import numpy as np
import pytest
import torch

from ts_core import PrecisionDebugger, native
from ts_core.backends.torch.tensors import TorchAdapter
from ts_core.dumpfmt import FINGERPRINT_JSON, JOURNAL, read_fingerprint
from ts_core.record import collector as collector_mod

from ..conftest import load_dump
from .models import make


def _journal_data_lines(rank):
    path = os.path.join(rank, JOURNAL)
    if not os.path.exists(path):        # created by the first flush that writes a line
        return []
    with open(path) as f:
        return [line for line in f if json.loads(line)["t"] == "data"]


def _step(dump_root, check_inside=None, **kw):
    model, x = make("cnn")
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0], **kw)
    dbg.start(model)
    model(x).pow(2).mean().backward()
    if check_inside is not None:
        check_inside(dbg)
    dbg.stop()
    dbg.close()
    return os.path.join(dump_root, "step0", "rank")


def _strip_paths(dump):
    dump.pop("dump_data_dir")
    return dump


@pytest.mark.parametrize("task,summary", [("tensor", "statistics"), ("statistics", "md5"), ("statistics", "xor")])
def test_same_dump_as_without_async(tmp_path, task, summary):
    a = _step(str(tmp_path / "sync"), task=task, summary_mode=summary)
    b = _step(str(tmp_path / "async"), task=task, summary_mode=summary, async_dump=True)
    da, db = load_dump(a), load_dump(b)
    assert _strip_paths(da) == _strip_paths(db)
    if task == "tensor":
        files = sorted(os.listdir(os.path.join(a, "dump_tensor_data")))
        assert files == sorted(os.listdir(os.path.join(b, "dump_tensor_data"))) and len(files) > 30
        for f in files:
            np.testing.assert_array_equal(np.load(os.path.join(a, "dump_tensor_data", f)),
                                          np.load(os.path.join(b, "dump_tensor_data", f)))


def test_nothing_is_fetched_copied_or_written_inside_the_step(tmp_path, monkeypatch):
    # Without the native kernel, statistics are device-side handles as on an accelerator (the
    # kernel computes a CPU tensor's row on the host at once: there is nothing to fetch).
    monkeypatch.setattr(native, "available", lambda: False)
    calls = {"snapshot": 0, "crc32": 0, "stats_to_host": 0}
    for name in calls:
        real = getattr(TorchAdapter, name)

        def counted(self, *a, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(self, *a, **kw)
        monkeypatch.setattr(TorchAdapter, name, counted)
    seen = {}

    def inside(dbg):
        time.sleep(2 * collector_mod.FLUSH_SECONDS)     # the idle flusher would have run by now
        rank = dbg.open_dump_dir
        seen["journal"] = len(_journal_data_lines(rank))
        seen["files"] = len(os.listdir(os.path.join(rank, "dump_tensor_data")))
        seen["calls"] = dict(calls)

    rank = _step(str(tmp_path / "async"), check_inside=inside, task="tensor", summary_mode="md5", async_dump=True)
    assert seen == {"journal": 0, "files": 0, "calls": {"snapshot": 0, "crc32": 0, "stats_to_host": 0}}
    assert calls["crc32"] > 0 and calls["stats_to_host"] > 0      # all of it at stop()
    data = load_dump(rank)["data"]
    assert len(os.listdir(os.path.join(rank, "dump_tensor_data"))) > 30 and len(data) > 20

    calls.update(snapshot=0, crc32=0, stats_to_host=0)            # the control: without async_dump
    _step(str(tmp_path / "sync"), check_inside=inside, task="tensor", summary_mode="md5")
    assert seen["journal"] > 0 and seen["files"] > 0 and seen["calls"]["snapshot"] > 0


def test_memory_waiting_for_the_step_end_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(collector_mod, "ASYNC_MAX_BYTES", 4096)
    seen = {}

    def inside(dbg):
        seen["journal"] = len(_journal_data_lines(dbg.open_dump_dir))

    with pytest.warns(RuntimeWarning, match="flushed early"):
        rank = _step(str(tmp_path / "d"), check_inside=inside, task="tensor", async_dump=True)
    assert seen["journal"] > 0                       # flushed inside the step, past the bound
    reference = _step(str(tmp_path / "ref"), task="tensor")
    assert _strip_paths(load_dump(rank)) == _strip_paths(load_dump(reference))


def test_in_place_ops_after_the_call_do_not_reach_the_deferred_copy(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="L1", step=[0], async_dump=True,
                            summary_mode="md5")
    a = torch.arange(6.0)
    dbg.start()
    b = torch.abs(a)
    b.mul_(100)                    # after abs returned: its recorded output must stay 0..5
    a.add_(1000)
    dbg.stop()
    dbg.close()
    rank = os.path.join(dump_root, "step0", "rank")
    rec = load_dump(rank)["data"]["Torch.abs.0.forward"]
    for summary in (rec["input_args"][0], rec["output"][0]):
        arr = np.load(os.path.join(rank, "dump_tensor_data", summary["data_name"]))
        np.testing.assert_array_equal(arr, np.arange(6.0, dtype=np.float32))
        assert summary["Max"] == 5.0


def _crc_hex(t):
    return format(zlib.crc32(t.detach().contiguous().numpy().tobytes()), "08x")


@pytest.mark.parametrize("native_on", [True, False])
def test_fingerprint_waits_for_stop_and_is_of_the_weights_the_step_began_with(tmp_path, monkeypatch, native_on):
    # the fingerprint (on by default) fetches, CRCs and writes at stop(), yet records the weights
    # as start() saw them although the optimizer changed them before stop()
    if not native_on:
        monkeypatch.setattr(native, "available", lambda: False)
    model, x = make("cnn")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="mix", step=[0], async_dump=True)
    dbg.start(model)
    rank = dbg.open_dump_dir
    model(x).pow(2).mean().backward()
    opt.step()
    assert not os.path.exists(os.path.join(rank, FINGERPRINT_JSON))     # nothing written inside the step
    dbg.stop()
    doc = read_fingerprint(rank)
    dbg.close()
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    for n, t in before.items():
        w = doc["weights"][n]
        assert w["crc32"] == _crc_hex(t)
        assert w["Max"] == pytest.approx(t.max().item()) and w["Norm"] == pytest.approx(t.norm().item(), rel=1e-6)
    assert doc["data"]["args.0"]["crc32"] == _crc_hex(x)
