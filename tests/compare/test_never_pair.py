"""Issue 25 §9: a call that only moves values (a broadcast or view returning its input, a split,
a shape query) is never paired with a call that computes (a loss's subtraction), however the
pairing was proposed: by names, a mapping, or the gap scores."""
import numpy as np

from compare_dumpgen import summary
from ts_core.compare.align.dataflow import Facts, describe_call, never_pair
from ts_core.compare.load.loader import record_to_call
from ts_core.compare.align.matching import FORWARD
from ts_core.compare.align.pairs import CallPair
from ts_core.compare.align.refine import Side, refine

OUT = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
TARGET = np.full((4, 4), 0.25, np.float32)


def _call(key, inputs, outputs, index):
    rec = {"input_args": [summary(a) for a in inputs], "input_kwargs": {}, "output": [summary(a) for a in outputs]}
    return record_to_call(key, rec, index)


def test_a_broadcast_named_like_a_subtraction_is_not_paired_with_it():
    broadcast = _call("Torch.broadcast_to.0.forward", [OUT], [OUT], 0)             # returns its input
    sub = _call("Tensor.__sub__.0.forward", [OUT, TARGET], [OUT - TARGET], 0)      # the loss's subtraction
    facts = Facts()
    assert describe_call(broadcast).harmless and not describe_call(sub).harmless
    assert never_pair(describe_call(broadcast), describe_call(sub))
    gs, ts = Side([broadcast], lambda k: k, None, facts), Side([sub], lambda k: k, None, facts)
    # a name anchor between them (as a mapping or a normaliser naming both alike would make)
    out = refine([CallPair(broadcast, sub, FORWARD)], gs, ts, cross=True)
    assert not any(cp.matched for cp in out)
    alone = {(cp.golden or cp.target).key: cp.harmless for cp in out}
    assert alone["Torch.broadcast_to.0.forward"] and alone["Tensor.__sub__.0.forward"] is None


def test_movers_and_constants_are_lossless_or_constant_by_what_they_are():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    split = _call("Tensor.split.0.forward", [x], [x[:, :2], x[:, 2:]], 0)
    getitem = _call("Tensor.__getitem__.0.forward", [x], [x[1:]], 1)
    zeros = _call("Torch.zeros_like.0.forward", [x], [np.zeros_like(x)], 2)
    add = _call("Tensor.__add__.0.forward", [x, x], [x + x], 3)
    assert [describe_call(c).effect for c in (split, getitem, zeros, add)] == ["lossless", "lossless", "query",
                                                                              "compute"]
    assert never_pair(describe_call(getitem), describe_call(add))
    assert not never_pair(describe_call(add), describe_call(add))
    # the same op recorded with more gradients on one side (MindSpore's zero gradient of a
    # loss target) is still the same call: recorded arity does not make a mover
    sub_bwd_torch = record_to_call("Tensor.__sub__.0.backward", {"input": [summary(x)], "output": [summary(x)]}, 4)
    sub_bwd_ms = record_to_call("Tensor.__sub__.0.backward", {"input": [summary(x)],
                                                              "output": [summary(x), summary(-x)]}, 4)
    assert not never_pair(describe_call(sub_bwd_torch), describe_call(sub_bwd_ms))
