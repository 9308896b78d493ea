"""msprobe's documented examples run with one change: ``msprobe`` -> ``ts_core`` in the import
lines. The scripts below are the seeds' code blocks as written (seed 003 §7.2.1.1, §7.2.1.2:
MindSpore PyNative; seed 002 §3: PyTorch code on MindSpore through mindtorch) and msprobe's
PyTorch quick start. Where a seed leaves a placeholder (``Network``, ``data_loader``,
``loss_fn``, ``optimizer``, ``train_dataset``, ``# ...``) a prelude defines it, and Ascend becomes
CPU; the msprobe-facing lines are untouched. Each runs in a fresh process (one debugger per
process, patches), in a folder holding the user's config.json."""
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from ..conftest import load_dump, require

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def to_tsprobe(script: str) -> str:
    """The one change a user makes: the package name in import lines."""
    out = re.sub(r"^(\s*)from msprobe\.", r"\1from ts_core.", script, flags=re.M)
    out = re.sub(r"^(\s*)import msprobe\b", r"\1import ts_core", out, flags=re.M)
    assert "msprobe" not in out.replace("Msprobe", "")
    return out


def run_example(tmp_path, script: str, config: dict, prelude: str = "", python: str = sys.executable) -> str:
    """Run the converted script after `prelude` in tmp_path (config.json there); the rank folder
    of step 0."""
    (tmp_path / "config.json").write_text(json.dumps(dict({"task": "statistics", "dump_path": "./dump"}, **config)))
    code = textwrap.dedent(prelude) + "\n" + to_tsprobe(textwrap.dedent(script)).replace('"Ascend"', '"CPU"')
    (tmp_path / "example.py").write_text(code)
    env = dict(os.environ, PYTHONPATH=ROOT, TSPROBE_QUIET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([python, "example.py"], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return str(tmp_path / "dump" / "step0" / "rank")


MS_PRELUDE = """
import numpy as np
import mindspore as ms
from mindspore import nn, ops

class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 6)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(6, 3)

    def construct(self, x):
        return self.fc2(ops.relu(self.fc1(x)))

_rng = np.random.default_rng(0)
data_loader = [(ms.Tensor(_rng.standard_normal((4, 8)).astype(np.float32)),
                ms.Tensor(np.eye(3, dtype=np.float32)[_rng.integers(0, 3, 4)])) for _ in range(2)]
"""


@require("mindspore")
def test_seed003_pynative_loop_without_model_api(tmp_path):
    """§7.2.1.1: start/stop/step around ms.grad in a loop, L1 API dump."""
    rank = run_example(tmp_path, """
        import mindspore as ms
        ms.set_context(mode=ms.PYNATIVE_MODE, device_target="Ascend")

        from msprobe.mindspore import PrecisionDebugger
        debugger = PrecisionDebugger(config_path="./config.json")

        # 模型、损失函数的定义以及初始化等操作
        # ...
        model = Network()
        # 数据集迭代的地方往往是模型开始训练的地方
        for data, label in data_loader:
            debugger.start()        # 进行 L1 级别下非 primitive op 采集时调用
            # debugger.start(model) # 进行 L0, mix 级别或 L1 级别下 primitive op 的数据采集时调用
            # 如下是模型每个 step 执行的逻辑
            grad_net = ms.grad(model)(data)
            # ...
            debugger.stop()         # 关闭数据 dump
            debugger.step()         # 更新迭代数
    """, {"level": "L1", "step": [0, 1]}, MS_PRELUDE)
    keys = load_dump(rank)["data"]
    assert any(k.startswith("Functional.relu.") and k.endswith(".forward") for k in keys), sorted(keys)[:20]
    assert os.path.isfile(os.path.join(os.path.dirname(os.path.dirname(rank)), "step1", "rank", "dump.json"))


@require("mindspore")
def test_seed003_model_train_with_msprobe_step(tmp_path):
    """§7.2.1.2: Model.train with MsprobeStep imported from msprobe's common.utils path."""
    prelude = MS_PRELUDE + """
_x = _rng.standard_normal((8, 8)).astype(np.float32)
_y = np.eye(3, dtype=np.float32)[_rng.integers(0, 3, 8)]
train_dataset = ms.dataset.GeneratorDataset(lambda: ((_x[i], _y[i]) for i in range(8)), ["data", "label"]).batch(4)
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=False, reduction="mean")
def _optimizer_for(net):
    return nn.SGD(net.trainable_params(), learning_rate=0.01)
"""
    rank = run_example(tmp_path, """
        import mindspore as ms
        from mindspore.train import Model
        ms.set_context(mode=ms.PYNATIVE_MODE, device_target="Ascend")

        from msprobe.mindspore import PrecisionDebugger
        from msprobe.mindspore.common.utils import MsprobeStep
        debugger = PrecisionDebugger(config_path="./config.json")

        # 模型、损失函数的定义以及初始化等操作
        # ...

        model = Network()
        optimizer = _optimizer_for(model)
        # 只有进行 L0 级别下 Cell 对象，mix 级别，L1 级别下 primitive op 的数据采集时才需要调用
        # debugger.start(model)
        trainer = Model(model, loss_fn=loss_fn, optimizer=optimizer, metrics={'accuracy'})
        trainer.train(1, train_dataset, callbacks=[MsprobeStep(debugger)])
    """, {"level": "mix", "step": [0]}, prelude)
    keys = load_dump(rank)["data"]
    assert any(k.startswith("Cell.fc1.Dense.forward") for k in keys), sorted(keys)[:20]
    assert any(k.startswith("Cell.fc2.Dense.backward") for k in keys), sorted(keys)[:20]


TORCH_PRELUDE = """
import torch
from torch import nn

class Network(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

_g = torch.Generator().manual_seed(0)
data_loader = [(torch.randn(4, 8, generator=_g), torch.randint(0, 3, (4,), generator=_g)) for _ in range(2)]
loss_fn = nn.CrossEntropyLoss()
"""


@require("torch")
def test_msprobe_pytorch_quick_start(tmp_path):
    """msprobe's PyTorch dump example (05.data_dump_PyTorch.md): seed_all, start(model) / stop /
    step, module_dump around one module."""
    rank = run_example(tmp_path, """
        from msprobe.pytorch import PrecisionDebugger, seed_all, module_dump, module_dump_end
        seed_all(seed=1234, mode=False)
        debugger = PrecisionDebugger(config_path="./config.json", dump_path="./dump")

        model = Network()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for data, label in data_loader:
            debugger.start(model)
            output = model(data)
            loss = loss_fn(output, label)
            loss.backward()
            debugger.stop()
            optimizer.step()
            debugger.step()

        debugger.start()
        module_dump(model.fc2, "MyModuleOP")
        model(data_loader[0][0])
        module_dump_end()
        debugger.stop()
    """, {"level": "mix", "step": [0, 2]}, TORCH_PRELUDE)
    keys = load_dump(rank)["data"]
    assert "Module.fc1.Linear.forward.0" in keys and "Module.fc1.Linear.backward.0" in keys
    module_dump_keys = load_dump(rank.replace("step0", "step2"))["data"]
    assert any(k.startswith("Module.MyModuleOP.Linear.forward") for k in module_dump_keys), sorted(module_dump_keys)


SEED002 = """
import mindspore as ms
import torch
import torch.nn as nn
import torch.nn.functional as F

# 导入工具的数据采集接口
from msprobe.mindspore import PrecisionDebugger

# 在模型训练开始前实例化PrecisionDebugger
debugger = PrecisionDebugger(config_path='./config.json')


# 定义网络
class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(in_features=8, out_features=4)
        self.linear2 = nn.Linear(in_features=4, out_features=2)

    def forward(self, x):
        x1 = self.linear1(x)
        x2 = self.linear2(x1)
        logits = F.relu(x2)
        return logits


net = Net()


def train_step(inputs):
    return net(inputs)


if __name__ == "__main__":
    data = (torch.randn(10, 8), torch.randn(10, 8), torch.randn(10, 8))
    grad_fn = ms.value_and_grad(train_step, grad_position=0)

    for inputs in data:
        # 开启数据 dump
        debugger.start(model=net)

        out, grad = grad_fn(inputs)

        # 停止数据 dump
        debugger.stop()
        # 更新 step 信息
        debugger.step()
"""


@pytest.mark.slow
def test_seed002_msadapter_example_on_mindtorch(tmp_path):
    """Seed 002 §3 verbatim in the mindtorch venv (torch is mindtorch there): three steps of
    module and API records under torch's names."""
    from ..mindtorch.conftest import mindtorch_python

    python = mindtorch_python()
    # the environment, as the MSAdapter user has it: the device set, then `import torch` is mindtorch
    prelude = "import mindspore\nmindspore.set_device('CPU')\nimport mindtorch\n"
    rank = run_example(tmp_path, SEED002, {"level": "mix", "step": [0, 1, 2], "framework": "mindtorch"}, prelude,
                       python=python)
    keys = load_dump(rank)["data"]
    assert any(k.startswith("Module.linear1.Linear.forward") for k in keys), sorted(keys)[:20]
    assert any(k.startswith("Functional.linear.") for k in keys), sorted(keys)[:20]
    assert os.path.isfile(os.path.join(os.path.dirname(os.path.dirname(rank)), "step2", "rank", "dump.json"))


def test_the_import_change_is_the_only_change():
    assert to_tsprobe("from msprobe.mindspore import PrecisionDebugger\nx = 1\n") == \
        "from ts_core.mindspore import PrecisionDebugger\nx = 1\n"
    assert to_tsprobe("    from msprobe.pytorch import seed_all") == "    from ts_core.pytorch import seed_all"
