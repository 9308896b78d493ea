"""Tensors without bytes of their own never reach a raw read: storage freed with ``resize_(0)``
(FSDP's resharding), fake and functional tensors (tracing), meta tensors, DTensors (their local
shard is read instead) and other ``__torch_dispatch__`` wrappers. And the shard statistics of
``dumpfmt.shards`` merge back to numpy's statistics of the whole value, uneven shards included."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from ts_core import PrecisionDebugger
from ts_core.backends.torch.tensors import TorchAdapter, readable
from ts_core.dumpfmt import DTENSOR, merge_shards, reference_stats, shard_stats
from ts_core.record.summary import Summarizer

from ..conftest import load_dump


def summarize(t, mode="statistics"):
    summ = Summarizer(TorchAdapter(), summary_mode=mode)
    out = summ.summarize(t, "x", files=False)
    summ.resolve()
    return out


def freed(n=64):
    t = torch.randn(n)
    t.untyped_storage().resize_(0)       # what FSDP does to an unsharded parameter after use
    return t


@pytest.mark.parametrize("mode", ["statistics", "md5", "xor"])
def test_freed_storage_is_summarised_without_values_not_read(mode):
    out = summarize(freed(), mode)
    assert out["shape"] == [64] and out["dtype"] == "torch.float32"
    assert all(out.get(k) is None for k in ("Max", "Min", "Mean", "Norm", "md5"))


def test_a_view_over_freed_storage_is_not_read():
    base = torch.randn(8, 8)
    view = base[2:]
    base.untyped_storage().resize_(0)
    assert readable(view) is None and summarize(view)["Max"] is None


def test_fake_meta_and_functional_tensors_have_no_values():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.randn(4, 4)
    assert readable(fake) is None and summarize(fake)["Max"] is None
    assert summarize(torch.empty(3, device="meta"))["Max"] is None
    functional = torch._to_functional_tensor(torch.randn(5))
    assert readable(functional) is None and summarize(functional)["Max"] is None


class Scaled(torch.Tensor):
    """A minimal __torch_dispatch__ wrapper subclass (as float8 / NF4 tensors are): it has no
    storage of its own; its ops compute on the wrapped tensor times a scale."""

    @staticmethod
    def __new__(cls, inner, scale):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

    def __init__(self, inner, scale):
        self.inner, self.scale = inner, scale

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda x: x.inner * x.scale if isinstance(x, Scaled) else x    # noqa: E731
        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})


def test_a_dispatch_wrapper_is_summarised_through_its_own_ops():
    inner = torch.arange(6, dtype=torch.float32)
    out = summarize(Scaled(inner, 2.0))
    want = reference_stats(inner.numpy() * 2.0)
    assert out["Max"] == want["Max"] and out["Min"] == want["Min"]
    assert out["Mean"] == pytest.approx(want["Mean"]) and out["Norm"] == pytest.approx(want["Norm"])


def test_training_with_freed_parameters_in_the_forward_is_bit_identical(tmp_path):
    """A module call handed a tensor whose storage was freed (FSDP's resharded parameters) runs
    with the tool at mix/md5: recorded without values, numbers unchanged."""

    class Ignores(torch.nn.Module):
        def forward(self, x, unused=None):
            return x * 3

    class PassesAFreedTensor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)
            self.ignores = Ignores()

        def forward(self, x):
            side = torch.ones(8) * 2
            side.untyped_storage().resize_(0)     # freed, but still handed to a module call
            return torch.relu(self.fc(self.ignores(x, unused=side)))

    def train(debugger=None):
        torch.manual_seed(0)
        model = PassesAFreedTensor()
        x = torch.randn(4, 8)
        if debugger:
            debugger.start(model)
        model(x).sum().backward()
        if debugger:
            debugger.stop()
            debugger.step()
        return [p.grad.clone() for p in model.parameters()]

    plain = train()
    with PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix", step=[0],
                           summary_mode="md5") as debugger:
        with_tool = train(debugger)
    assert all(torch.equal(a, b) for a, b in zip(plain, with_tool))
    data = load_dump(os.path.join(tmp_path, "step0", "rank"))["data"]
    unused = data["Module.ignores.Ignores.forward.0"]["input_kwargs"]["unused"]
    assert unused["shape"] == [8] and unused["Max"] is None and unused["md5"] is None
    assert data["Module.fc.Linear.forward.0"]["output"][0]["Max"] is not None


@pytest.mark.parametrize("sizes", [[10, 10], [4, 7, 0, 9], [1]])
def test_merge_of_uneven_shards_equals_numpy(sizes):
    rng = np.random.default_rng(len(sizes))
    full = rng.standard_normal(sum(sizes)).astype(np.float32)
    parts = np.split(full, np.cumsum(sizes)[:-1])
    summaries = []
    for i, part in enumerate(parts):
        f = part.astype(np.float64)
        row = (f.max() if f.size else -np.inf, f.min() if f.size else np.inf, f.sum(), (f * f).sum(), 0, 0)
        block = {"global_shape": [full.size], "placements": ["Shard(0)"], "mesh_shape": [len(sizes)],
                 "mesh_dim_names": None, "coordinate": [i]}
        block["local"] = shard_stats(row, part.size)[1] if part.size else \
            {"count": 0, "sum": 0.0, "sum_sq": 0.0, "max": -math.inf, "min": math.inf, "nan": 0, "inf": 0}
        summaries.append({DTENSOR: block})
    got, want = merge_shards(summaries), reference_stats(full)
    assert got["count"] == full.size
    assert got["Max"] == want["Max"] and got["Min"] == want["Min"]
    assert got["Mean"] == pytest.approx(want["Mean"], rel=1e-12, abs=1e-15)
    assert got["Norm"] == pytest.approx(want["Norm"], rel=1e-12)


def _block(coord, placements, mesh, local):
    return {DTENSOR: {"global_shape": [4], "placements": placements, "mesh_shape": mesh,
                      "mesh_dim_names": None, "coordinate": coord, "local": local}}


def test_merge_counts_a_replicated_dimension_once_and_refuses_what_it_cannot_know():
    a = {"count": 2, "sum": 3.0, "sum_sq": 5.0, "max": 2.0, "min": 1.0, "nan": 0, "inf": 0}
    b = {"count": 2, "sum": 7.0, "sum_sq": 25.0, "max": 4.0, "min": 3.0, "nan": 0, "inf": 0}
    # mesh (dp=2, tp=2): replicated over dp, sharded over tp; dp=1's copies must not count twice
    shards = [_block([dp, tp], ["Replicate()", "Shard(0)"], [2, 2], (a, b)[tp]) for dp in (0, 1) for tp in (0, 1)]
    got = merge_shards(shards)
    assert got == {"Max": 4.0, "Min": 1.0, "Mean": 2.5, "Norm": math.sqrt(30.0), "count": 4}
    assert merge_shards(shards[:1]) is None                    # tp=1's shard missing
    assert merge_shards([_block([0], ["Partial(sum)"], [2], a), _block([1], ["Partial(sum)"], [2], b)]) is None
    nan = dict(a, nan=1)
    assert math.isnan(merge_shards([_block([0], ["Shard(0)"], [2], nan), _block([1], ["Shard(0)"], [2], b)])["Max"])


def test_a_new_tensor_at_an_address_its_old_tensor_left_gets_its_own_statistics():
    """FSDP frees a block's parameter with resize_(0) while the tensor lives on (same version),
    and the next block's parameter is allocated at the same address: the cached statistics of
    the first must not be reused for the second. Made deterministic here: the first tensor is
    moved off a numpy buffer (``.data =``, no version change), the buffer gets new values, and a
    second tensor is made over it. (The CRC cache shares the same validity check.)"""
    summ = Summarizer(TorchAdapter())
    buffer = np.ones(4096, np.float32)
    first = torch.from_numpy(buffer)
    assert summ.summarize(first, "a", files=False)["Max"] == 1.0
    first.data = torch.zeros(4096)               # alive, same version, elsewhere now
    buffer[:] = 2.0
    second = torch.from_numpy(buffer)            # the old address, the same version (0)
    assert second.data_ptr() == buffer.ctypes.data and second._version == first._version
    out = summ.summarize(second, "b", files=False)
    assert out["Max"] == 2.0 and out["Mean"] == 2.0
