"""Tiny MindSpore nets and dump readers for the MindSpore backend tests."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import mindspore as ms
from mindspore import Tensor, mint, nn, ops
from mindspore.train import Callback


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Dense(8, 3)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Cell):
    """Residual + LayerNorm + GELU + softmax: tensors used two and three times (once by an
    op tsprobe does not record), as in real models."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.ln = nn.LayerNorm((d,), epsilon=1e-5)
        self.proj = nn.Dense(d, d)
        self.act = nn.GELU(approximate=False)
        self.head = nn.Dense(d, 4)

    def construct(self, x):
        h = x + self.act(self.proj(self.ln(x)))
        s = ops.Square()(h)          # an ad-hoc Primitive: not recorded at any level
        return self.head(ops.softmax(h, -1) * 2.0 + h + s * 0.1)


class Outer(nn.Cell):
    """Nested Cells, a mint API and a functional API between them."""
    def __init__(self):
        super().__init__()
        self.encoder = nn.SequentialCell([nn.Dense(4, 4), nn.ReLU()])
        self.head = nn.Dense(4, 2)

    def construct(self, x):
        h = self.encoder(x)
        h = mint.matmul(h, ops.eye(4, 4, ms.float32)) + 1.0
        return self.head(mint.nn.functional.relu(h))


def rank_dir(root: str, step: int = 0) -> str:
    return os.path.join(root, f"step{step}", "rank")


def npy(rank: str, summary: dict) -> np.ndarray:
    return np.load(os.path.join(rank, "dump_tensor_data", summary["data_name"]))


def tensor(shape, seed: int = 0, scale: float = 1.0, dtype=np.float32) -> Tensor:
    return Tensor((np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype))


def params_numpy(net: nn.Cell) -> dict:
    return {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def load_params(net: nn.Cell, values: dict) -> None:
    for p in net.get_parameters():
        p.set_data(Tensor(values[p.name]))


def seeded(cls: Any, seed: int = 0, *args) -> nn.Cell:
    ms.set_seed(seed)
    np.random.seed(seed)
    return cls(*args)


class StepCounter(Callback):
    """Records cur_step_num at each step begin (to check dumps against MindSpore's count)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_step_begin(self, run_context):
        self.seen.append(run_context.original_args().cur_step_num)


class RestoreStepCounter(Callback):
    """What a resume helper does: continue MindSpore's step counter from a checkpoint."""

    def __init__(self, value: int):
        super().__init__()
        self.value = value

    def on_train_begin(self, run_context):
        run_context.original_args().cur_step_num = self.value
