"""Which values of two groups of different ops are compared (issue 12): two ways of building a
causal mask (transformers' eager arange/le/where vs the sdpa path's sum/eq check) leave a
one-element integer index on one side and a one-element boolean flag on the other; they hold
different things and must not be compared as one value."""
import glob
import os

import pytest

torch = pytest.importorskip("torch")

from ts_core import PrecisionDebugger  # noqa: E402
from ts_core.compare.align.dataflow import Flow  # noqa: E402
from ts_core.compare.load.loader import record_to_call  # noqa: E402
from ts_core.compare.align.pairs import CallPair, merge, pair_values  # noqa: E402
from ts_core.dumpfmt import DUMP_JSON, OUTPUT  # noqa: E402
from ts_core.dumpfmt.rankdir import read_header_and_data  # noqa: E402


def eager_mask():
    """arange/le/where, plus the batch index ``arange(1)`` (value [0]) the eager path keeps."""
    pos = torch.arange(4)
    torch.arange(1)
    keep = pos[None, :] <= torch.arange(4)[:, None]
    return torch.where(keep, torch.tensor(0.0), torch.tensor(-1e9))


def sdpa_check():
    """The padding mask is all ones: a boolean flag (True) that decides the causal path."""
    pad = torch.ones(2, 4, dtype=torch.bool)
    return pad.sum() == 8


def _calls(tmp_path, name, fn):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / name), task="tensor", level="L1", step=[0])
    dbg.start()
    fn()
    dbg.stop()
    dbg.step()
    dbg.close()
    path = glob.glob(os.path.join(str(tmp_path / name), "step0", "*", DUMP_JSON))[0]
    _, data = read_header_and_data(path)
    return [record_to_call(k, v, i) for i, (k, v) in enumerate(data.items()) if k.endswith("forward")]


def test_an_integer_index_is_not_compared_with_a_boolean_flag(tmp_path):
    golden = _calls(tmp_path, "g", eager_mask)
    target = _calls(tmp_path, "t", sdpa_check)
    assert {"arange", "__le__", "where"} <= {c.key.split(".")[1] for c in golden}
    assert {"sum", "__eq__"} <= {c.key.split(".")[1] for c in target}
    cp = CallPair(merge(golden, Flow().root), merge(target, Flow().root), "forward", same_op=False, exact=False)
    outs = [(ge.leaf, te.leaf) for role, _, ge, te, _ in pair_values(cp) if role == OUTPUT]
    # the premise: the golden group gives out an int64 [1] (value 0), the target a bool [] (True)
    g_index = [e.leaf for e in cp.golden.entries if e.role == OUTPUT and "int" in str(e.leaf.get("dtype"))
               and e.leaf.get("shape") == [1]]
    t_flag = [e.leaf for e in cp.target.entries if e.role == OUTPUT and "bool" in str(e.leaf.get("dtype"))]
    assert g_index and t_flag
    assert all(("bool" in str(g.get("dtype"))) == ("bool" in str(t.get("dtype"))) for g, t in outs)
