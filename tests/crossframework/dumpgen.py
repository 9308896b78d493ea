"""Write the dumps the cross-framework tests compare, in a child process.

MindSpore must not be imported into the pytest process: with torch and MindSpore both loaded,
``start()`` without a model cannot tell which framework to hook, and test folders collected
after this one (inference, integrations) call it so. The comparison itself needs neither.

    python -m tests.crossframework.dumpgen ROOT SPEC_JSON
SPEC_JSON: [[name, bug|null, level(, task)], ...] for ports.dump_pair (written under
ROOT/<name>_<bug>_<level>(_<task>); task "tensor" when not given), plus [\"silu\", variant, \"L1\"]
for the sigmoid*x <-> silu dumps.
Prints one JSON line: {"name|bug|level(|task)": [torch rank dir, mindspore rank dir]}.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np


def dump_silu(root: str, variant: str):
    """torch: sigmoid(x) * x + 1; MindSpore: ops.silu(x) + 1 ("silu") or ops.sigmoid(x) + 1
    ("sigmoid", a wrong port)."""
    from ts_core import PrecisionDebugger

    x = (np.random.default_rng(0).standard_normal((3, 4)) * 2).astype(np.float32)
    out = []
    for fw in ("pytorch", "mindspore"):
        path = os.path.join(root, fw)
        dbg = PrecisionDebugger(dump_path=path, task="tensor", level="L1", step=[0], framework=fw)
        try:
            dbg.start()
            if fw == "pytorch":
                import torch
                t = torch.from_numpy(x)
                torch.sigmoid(t) * t + 1
            else:
                from mindspore import Tensor, ops
                t = Tensor(x)
                (ops.silu(t) if variant == "silu" else ops.sigmoid(t)) + 1
            dbg.stop()
            dbg.step()
        finally:
            dbg.close()
        out.append(os.path.join(path, "step0", "rank"))
    return out


def main(root: str, spec: list) -> dict:
    import mindspore as ms

    from tests.mindspore import ports

    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    done = {}
    for name, bug, level, *task in spec:
        label = "|".join([name, str(bug), level] + task)
        sub = os.path.join(root, label.replace("|", "_"))
        if name == "silu":
            done[label] = dump_silu(sub, bug)
        else:
            done[label] = list(ports.dump_pair(name, sub, bug=bug, level=level, task=(task or ["tensor"])[0]))
    return done


if __name__ == "__main__":
    result = main(sys.argv[1], json.loads(sys.argv[2]))
    print("DUMPS " + json.dumps(result))
