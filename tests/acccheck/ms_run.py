"""Child process of test_acc_check_mindspore: a MindSpore PyNative run dumped at L1 (tensor),
then acc-check on it; prints the acc-check summary as JSON on the last line.

    python -m tests.acccheck.ms_run DUMP_DIR [bad]

With "bad", ``mindspore.ops.gelu`` is replaced for the run by a poor approximation."""
import json
import sys

import numpy as np
import mindspore as ms

ms.set_device("CPU")
from mindspore import mint, nn, ops  # noqa: E402

from ts_core import PrecisionDebugger  # noqa: E402
from ts_core.acccheck import acc_check  # noqa: E402
from ts_core.backends.mindspore._runtime import warm_up  # noqa: E402


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 16)

    def construct(self, x):
        h = ops.gelu(self.fc(x))
        h = mint.matmul(h, mint.ones((16, 4), dtype=ms.float32)) + x.mean(-1, keep_dims=True)
        return ops.softmax(h, -1)


def main() -> None:
    root, bad = sys.argv[1], len(sys.argv) > 2
    warm_up()
    good_gelu = ops.gelu
    if bad:
        ops.gelu = lambda x, approximate="tanh": x * ops.sigmoid(1.5 * x)
    net = Net()
    x = ms.Tensor(np.random.RandomState(0).randn(4, 8).astype(np.float32))
    dbg = PrecisionDebugger(task="tensor", level="L1", dump_path=root, step=[0])
    dbg.start(net)
    ms.grad(lambda t: net(t).sum())(x)
    dbg.stop()
    dbg.step()
    dbg.close()
    ops.gelu = good_gelu
    result = acc_check(root, verbose=False)
    print(json.dumps({"summary": result.summary(),
                      "calls": {c.key: [c.forward, c.backward, c.message] for c in result.calls}}))


if __name__ == "__main__":
    main()
