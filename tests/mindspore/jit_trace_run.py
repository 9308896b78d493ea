"""Child process of test_ms_jit's trace test: for each level, the net of jit_nets with
``capture_mode="trace"`` regions (a fresh class: a trace keeps its first graph), trained with
tsprobe first (the graph is traced under it), then again without it from the same parameters.

    PYTHONPATH=REPO python tests/mindspore/jit_trace_run.py DUMP_ROOT
(a script, not ``-m``: MindSpore's trace fails on runpy's frames, which have no source line.)
Prints one line: TRACE {level: {"same_bits", "depth_after", "keys" (of step 1)}}.
"""
from __future__ import annotations

import json
import os
import sys


def main(root: str) -> dict:
    import mindspore as ms

    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    from ts_core import PrecisionDebugger
    from ts_core.backends._depth import DEPTH
    from ts_core.backends.mindspore._runtime import warm_up
    from tests.mindspore import helpers, jit_nets as jn
    from tests.mindspore.test_ms_jit import _same_bits, _train_value_and_grad

    warm_up()
    out = {}
    for level in ("L0", "L1", "mix"):
        net, x = jn.make_net("trace", cls=jn.net_class("trace", fresh=True)), jn.make_input()
        start = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
        path = os.path.join(root, level)
        dbg = PrecisionDebugger(dump_path=path, level=level, task="statistics")
        try:
            with_tool = _train_value_and_grad(net, x, dbg)
        finally:
            dbg.close()
        depth = DEPTH.value
        with open(os.path.join(helpers.rank_dir(path, 1), "dump.json"), encoding="utf-8") as f:
            keys = sorted(json.load(f)["data"])
        helpers.load_params(net, start)
        out[level] = {"same_bits": _same_bits(with_tool, _train_value_and_grad(net, x)),
                      "depth_after": depth, "keys": keys}
    return out


if __name__ == "__main__":
    print("TRACE " + json.dumps(main(sys.argv[1])))
