"""One training step of a tests/mindspore/ports.py model and of its faithful MindSpore port, the
loss and the optimizer between start and stop, dumped at every level and task (the clean-pair
corpus, issue 25). The MindSpore side runs in its own process (MindSpore stays out of pytest):

    python tests/compare/port_steps.py ROOT MODEL [MODEL ...]      -> ROOT/mindspore/MODEL/LEVEL_TASK
"""
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = [(level, task) for level in ("L0", "L1", "mix") for task in ("statistics", "tensor")]


OUT_SHAPES = {"mlp": (4, 4), "cnn": (2, 5), "transformer": (2, 5, 16)}     # each model's output


def target(name: str) -> np.ndarray:
    """The loss's fixed target, the same numbers on both sides."""
    return np.random.default_rng(5).standard_normal(OUT_SHAPES[name]).astype(np.float32)


def torch_steps(name: str, root: str) -> dict:
    """The torch side: F.mse_loss and an SGD step; returns {(level, task): dump root}."""
    import torch
    import torch.nn.functional as F

    from tests.mindspore import ports
    from ts_core import PrecisionDebugger

    out = {}
    x = ports.make_input(name)
    for level, task in CONFIGS:
        model = ports.torch_model(name)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        path = out[(level, task)] = os.path.join(root, "torch", name, f"{level}_{task}")
        dbg = PrecisionDebugger(dump_path=path, task=task, level=level, step=[0])
        dbg.start(model)
        F.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(target(name))).backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
        dbg.close()
    return out


def mindspore_steps(name: str, root: str) -> None:
    """The port: nn.MSELoss, value_and_grad and nn.SGD."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from tests.mindspore import ports
    from ts_core import PrecisionDebugger

    x = ports.make_input(name)
    for level, task in CONFIGS:
        _, model, _ = ports.make_pair(name)
        opt = nn.SGD(model.trainable_params(), learning_rate=0.1)
        loss_cell = nn.MSELoss()
        grad_fn = ms.value_and_grad(lambda inp: loss_cell(model(inp), Tensor(target(name))), None,
                                    model.trainable_params())
        dbg = PrecisionDebugger(dump_path=os.path.join(root, "mindspore", name, f"{level}_{task}"), task=task,
                                level=level, step=[0])
        dbg.start(model)
        _, grads = grad_fn(Tensor(x))
        opt(grads)
        dbg.stop()
        dbg.step()
        dbg.close()


if __name__ == "__main__":
    sys.path.insert(0, REPO)
    import mindspore
    from mindspore import Tensor

    mindspore.set_device("CPU")
    try:                      # numpy 2: the first Tensor-float op raises SystemError once (ENVIRONMENT.md)
        (Tensor(np.ones(1, np.float32)) * 1.5).asnumpy()
    except SystemError:
        pass
    for model_name in sys.argv[2:]:
        mindspore_steps(model_name, sys.argv[1])
    print("DONE")
