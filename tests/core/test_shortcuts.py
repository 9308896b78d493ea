"""Every hot-path shortcut of the recording path, pinned to its plain path on the same inputs:
``TorchAdapter.host_summary`` against the general summary path, the record encoder's choice
(msgspec or the stdlib) against a full scan for NaN/Inf, and value names built only when a
tensor file or a held value needs them."""
import json
import math
import os
import random

import numpy as np
import pytest
import torch

from ts_core import PrecisionDebugger, native
from ts_core.backends.torch.tensors import TorchAdapter
from ts_core.dumpfmt import jsonio, record_json
from ts_core.record import collector as collector_mod
from ts_core.record import summary as summary_mod
from ts_core.record.summary import Summarizer

from ..conftest import load_dump

needs_native = pytest.mark.skipif(not native.available(), reason="host_summary needs the native kernels")


def _same(a, b) -> bool:
    """Equal summaries, key order and value types included (NaN equals NaN)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _tensors():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=g)
    yield "float32", base
    yield "float16", base.half()
    yield "bfloat16", base.bfloat16()
    yield "float64", base.double()
    yield "int64 beyond 2**53", torch.tensor([2**60 + 1, -(2**62), 3])
    for dt in (torch.int8, torch.uint8, torch.int16, torch.int32):
        yield str(dt), (base * 20).to(dt)
    yield "bool", base > 0
    yield "0-d", torch.tensor(2.5)
    yield "empty", torch.empty(0, 3)
    yield "requires grad", base.clone().requires_grad_()
    yield "contiguous row view", base[2:4]
    yield "transposed (not contiguous)", base.t()
    yield "NaN", torch.tensor([1.0, float("nan"), 3.0])
    yield "-inf", torch.tensor([1.0, float("-inf")])
    yield "complex", torch.randn(3, dtype=torch.complex64, generator=g)


def _both(mode: str):
    """A summarizer taking the shortcut, and one held to the general path."""
    fast = Summarizer(TorchAdapter(), summary_mode=mode)
    plain = Summarizer(TorchAdapter(), summary_mode=mode)
    plain._host_summary = None
    return fast, plain


@needs_native
@pytest.mark.parametrize("mode", ["statistics", "md5"])
def test_host_summary_gives_the_general_paths_summary_for_every_kind_of_tensor(mode):
    fast, plain = _both(mode)
    took_shortcut = 0
    for label, t in _tensors():
        for _ in range(2):              # the second time from the per-step caches
            took_shortcut += fast.adapter.host_summary(t, mode == "md5") is not None
            a, b = fast.summarize(t, "", False), plain.summarize(t, "", False)
            assert _same(a, b), (label, a, b)
    assert took_shortcut >= 20          # the shortcut really ran (contiguous CPU tensors, both times)


@needs_native
def test_host_summary_statistics_are_numpys_and_follow_in_place_changes():
    fast, plain = _both("statistics")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = x.view(12)                   # the same bytes: a cache hit for the shortcut
    for t in (x, view):
        assert _same(fast.summarize(t, "", False), plain.summarize(t, "", False))
    x.mul_(-2)                          # version moves: both paths read again
    a, b = fast.summarize(view, "", False), plain.summarize(view, "", False)
    assert _same(a, b)
    v = x.numpy().astype(np.float64)
    assert (a["Max"], a["Min"]) == (v.max(), v.min())
    assert a["Mean"] == pytest.approx(v.mean(), rel=1e-7)
    assert a["Norm"] == pytest.approx(float(np.linalg.norm(v)), rel=1e-7)


@needs_native
def test_host_summary_never_reads_storage_freed_after_a_cached_read():
    """FSDP frees a parameter's storage with resize_(0) between uses: a cached row must not be
    used for it, and the shortcut must fall back (both paths then give no statistics)."""
    fast, plain = _both("statistics")
    p = torch.randn(64)
    for s in (fast, plain):
        s.summarize(p, "", False)
    p.untyped_storage().resize_(0)
    a, b = fast.summarize(p, "", False), plain.summarize(p, "", False)
    assert _same(a, b) and a["Max"] is None


@needs_native
@pytest.mark.parametrize("mode", ["statistics", "md5"])
def test_a_shared_summary_is_reused_only_while_the_tensor_is_unchanged(mode):
    """``plain`` may hand out the dict it made for the same tensor before: never after a change
    of values, shape or strides (each moves the version counter), of requires_grad (which does
    not), or of what ``t.data`` holds; always equal to the general path's summary."""
    fast, plain = _both(mode)
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)

    def check(t):
        a, b = fast.plain([t, t])[0], plain.summarize(t, "", False)
        assert _same(a, b), (a, b)
        return a

    first = check(x)
    assert check(x) is first                      # unchanged: the same dict again
    y = x.view(12)                                # the same bytes, another tensor object
    assert check(y) is not first and check(y)["shape"] == [12]
    changes = [lambda: x.unsqueeze_(0), lambda: x.squeeze_(0), lambda: x.resize_(2, 6),
               lambda: x.requires_grad_(), lambda: x.requires_grad_(False), lambda: x.mul_(3),
               lambda: setattr(x, "data", x.data.view(4, 3))]
    for change in changes:
        before = check(x)
        change()
        after = check(x)
        assert after is not before
        assert check(x) is after                  # and shared again from then on
    v = x.numpy().astype(np.float64)
    assert (after["shape"], after["Max"], after["Min"]) == ([4, 3], v.max(), v.min())
    assert fast.adapter.host_summary(x, mode == "md5") is not after    # share not asked: a new dict


def _random_record(rnd: random.Random, bad: bool):
    """A record shaped like the dump's, with None values and, when `bad`, one NaN/Inf at a
    random place (a statistic, a float argument, a nested list, a tuple or a dict value)."""
    def summary():
        v = rnd.uniform(-1e3, 1e3)
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": v, "Min": -v,
                "Mean": v / 7, "Norm": abs(v), "requires_grad": rnd.random() < 0.5}
    rec = {"input_args": [summary(), None, {"type": "float", "value": rnd.random()},
                          [summary(), (1, 2.5)], {"type": "torch.dtype", "value": "torch.float32"}],
           "input_kwargs": {"mask": None, "nested": {"a": [summary()]}}, "output": [summary()]}
    if bad:
        value = rnd.choice([float("nan"), float("inf"), float("-inf")])
        spot = rnd.randrange(6)
        if spot == 0:
            rec["output"][0][rnd.choice(["Max", "Min", "Mean", "Norm"])] = value
        elif spot == 1:
            rec["input_args"][2]["value"] = value
        elif spot == 2:
            rec["input_args"][3][1] = (1, value)
        elif spot == 3:
            rec["input_kwargs"]["nested"]["a"][0]["Norm"] = value
        elif spot == 4:
            rec["input_args"].append([[value]])
        else:
            rec["input_kwargs"]["x"] = value
    return rec


def test_the_encoder_choice_agrees_with_a_full_scan_for_nan_and_inf():
    """NaN/Inf anywhere in a record reach the text as NaN/Infinity (msgspec would write null);
    a finite record, None values or not, keeps every value."""
    rnd = random.Random(1)
    for i in range(400):
        bad = i % 2 == 0
        rec = _random_record(rnd, bad)
        try:                            # the independent full scan: the stdlib's strict encoder
            json.dumps(rec, allow_nan=False)
            scan = False
        except ValueError:
            scan = True
        assert scan == bad == jsonio.has_nonfinite(rec)
        got = json.loads(record_json(rec))
        want = json.loads(json.dumps(rec))          # the stdlib: NaN/Infinity, tuples as lists
        assert _same(got, want)


@pytest.mark.skipif(jsonio._fast_encode is None, reason="msgspec not installed")
def test_finite_records_take_the_fast_encoder_and_nonfinite_ones_the_stdlib(monkeypatch):
    calls = []
    std = jsonio._std_record_encode
    monkeypatch.setattr(jsonio, "_std_record_encode", lambda r: calls.append(r) or std(r))
    rnd = random.Random(2)
    finite, bad = _random_record(rnd, False), _random_record(rnd, True)
    record_json(finite)
    assert calls == []                  # None values alone do not leave the fast encoder
    text = record_json(bad)
    assert calls == [bad] and ("NaN" in text or "Infinity" in text)


def test_a_norm_beyond_float32_reaches_dump_json_finite(tmp_path):
    """Finite float32 elements whose sum of squares overflows float32: the Norm is still finite
    (accumulated in double: issue 37), numpy's, written as a number."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1", step=[0])
    x = torch.full((64,), 3e38)
    dbg.start()
    torch.neg(x)
    dbg.stop()
    dbg.step()
    dbg.close()
    out = load_dump(os.path.join(str(tmp_path), "step0", "rank"))["data"]["Torch.neg.0.forward"]["output"][0]
    exp = np.sqrt(np.sum(np.full(64, -3e38, dtype=np.float32).astype(np.float64) ** 2))
    assert out["Max"] == pytest.approx(-3e38) and out["Norm"] == pytest.approx(exp, rel=1e-12)
    assert out["Mean"] == pytest.approx(-3e38, rel=1e-7)


def _count_value_names(monkeypatch):
    made = []
    for mod in (collector_mod, summary_mod):
        real = mod.value_name
        monkeypatch.setattr(mod, "value_name", lambda *a, _real=real: made.append(a) or _real(*a))
    return made


def _run_small(dump: str, task: str, level: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    dbg = PrecisionDebugger(dump_path=dump, task=task, level=level, step=[0])
    x = torch.randn(2, 4, requires_grad=True)
    dbg.start(model)
    y = torch.cat([model(x), x], dim=1)          # a list argument: nested value names
    y.sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_statistics_tasks_build_no_value_names(tmp_path, monkeypatch, level):
    made = _count_value_names(monkeypatch)
    _run_small(str(tmp_path), "statistics", level)
    data = load_dump(os.path.join(str(tmp_path), "step0", "rank"))["data"]
    assert "Torch.cat.0.forward" in data and "Torch.cat.0.backward" in data
    assert made == []


def test_tensor_task_still_names_every_file(tmp_path, monkeypatch):
    made = _count_value_names(monkeypatch)
    _run_small(str(tmp_path), "tensor", "L1")
    rank = os.path.join(str(tmp_path), "step0", "rank")
    cat = load_dump(rank)["data"]["Torch.cat.0.forward"]
    assert [s["data_name"] for s in cat["input_args"][0]] == ["Torch.cat.0.forward.input.0.0.npy",
                                                              "Torch.cat.0.forward.input.0.1.npy"]
    assert made and os.path.isfile(os.path.join(rank, "dump_tensor_data", "Torch.cat.0.forward.input.0.0.npy"))


@needs_native
def test_md5_of_a_non_contiguous_tensor_reads_the_statistics_copy():
    """md5: the statistics of a non-contiguous tensor copy it once; the CRC reads that copy
    (one ``contiguous()`` per summary, not two) and equals zlib's CRC of the values laid out
    row-major. A tensor changed in place after its statistics gets the CRC of its new bytes."""
    import zlib

    from torch.overrides import TorchFunctionMode

    class Copies(TorchFunctionMode):
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.contiguous:
                Copies.n += 1
            return func(*args, **(kwargs or {}))

    summ = Summarizer(TorchAdapter(), summary_mode="md5")
    t = torch.randn(5, 7, generator=torch.Generator().manual_seed(3)).t()
    with Copies():
        out = summ.summarize(t, "", False)
    assert Copies.n == 1
    assert out["md5"] == f"{zlib.crc32(np.ascontiguousarray(t.numpy()).tobytes()):08x}"
    assert out["Max"] == t.max().item()

    ad = TorchAdapter()
    ad.reuse_copies = True
    u = torch.randn(4, 6, generator=torch.Generator().manual_seed(4)).t()
    ad.stats(u)
    u.mul_(2)                   # after the statistics' copy: that copy is stale
    assert ad.crc32(u) == f"{zlib.crc32(np.ascontiguousarray(u.numpy()).tobytes()):08x}"
