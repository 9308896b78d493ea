"""The `make demo` model: a pre-LN transformer block (LayerNorm, 2-head attention, GELU MLP)
with a linear head, written in PyTorch and ported to MindSpore with the same attribute paths,
so ``Module.attn.q.Linear`` pairs with ``Cell.attn.q.Dense``. Weights are copied from torch
to MindSpore through the mapping file's parameter names (LayerNorm weight -> gamma, ...).

``port_bug="wrong_eps"`` builds the port the way a hurried migration does: ``nn.LayerNorm``
with MindSpore's default epsilon (1e-7) where torch uses 1e-5.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

D_MODEL, HEADS, SEQ, OUT = 16, 2, 6, 4


def torch_block(seed: int = 0):
    import torch
    import torch.nn as tnn

    class Attention(tnn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (tnn.Linear(D_MODEL, D_MODEL) for _ in range(4))
            self.softmax = tnn.Softmax(dim=-1)
            self.scale = (D_MODEL // HEADS) ** -0.5

        def forward(self, x):
            b, t, d = x.shape
            hd = d // HEADS
            q = self.q(x).view(b, t, HEADS, hd).transpose(1, 2)
            k = self.k(x).view(b, t, HEADS, hd).transpose(1, 2)
            v = self.v(x).view(b, t, HEADS, hd).transpose(1, 2)
            scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
            return self.o(torch.matmul(self.softmax(scores), v).transpose(1, 2).reshape(b, t, d))

    class FeedForward(tnn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = tnn.Linear(D_MODEL, 4 * D_MODEL), tnn.GELU(), tnn.Linear(4 * D_MODEL, D_MODEL)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn = tnn.LayerNorm(D_MODEL, eps=1e-5), Attention()
            self.ln2, self.mlp = tnn.LayerNorm(D_MODEL, eps=1e-5), FeedForward()
            self.head = tnn.Linear(D_MODEL, OUT)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            x = x + self.mlp(self.ln2(x))
            return self.head(x)

    torch.manual_seed(seed)
    return Block()


def mindspore_block(port_bug: Optional[str] = None):
    from mindspore import nn, ops

    class Attention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Dense(D_MODEL, D_MODEL) for _ in range(4))
            self.softmax = nn.Softmax(axis=-1)
            self.scale = (D_MODEL // HEADS) ** -0.5

        def construct(self, x):
            b, t, d = x.shape
            hd = d // HEADS
            q = self.q(x).reshape(b, t, HEADS, hd).transpose(0, 2, 1, 3)
            k = self.k(x).reshape(b, t, HEADS, hd).transpose(0, 2, 1, 3)
            v = self.v(x).reshape(b, t, HEADS, hd).transpose(0, 2, 1, 3)
            scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale
            return self.o(ops.matmul(self.softmax(scores), v).transpose(0, 2, 1, 3).reshape(b, t, d))

    class FeedForward(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(D_MODEL, 4 * D_MODEL)
            self.act = nn.GELU(approximate=False)
            self.fc2 = nn.Dense(4 * D_MODEL, D_MODEL)

        def construct(self, x):
            return self.fc2(self.act(self.fc1(x)))

    def layer_norm():
        if port_bug == "wrong_eps":
            return nn.LayerNorm((D_MODEL,))                  # MindSpore's default epsilon=1e-7
        return nn.LayerNorm((D_MODEL,), epsilon=1e-5)

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn = layer_norm(), Attention()
            self.ln2, self.mlp = layer_norm(), FeedForward()
            self.head = nn.Dense(D_MODEL, OUT)

        def construct(self, x):
            x = x + self.attn(self.ln1(x))
            x = x + self.mlp(self.ln2(x))
            return self.head(x)

    return Block()


def copy_weights(tmodel, mmodel) -> int:
    """torch parameters -> the port's Parameters, renamed through the mapping file."""
    from mindspore import Tensor

    from ts_core.compare.ops import load_mapping

    rename = load_mapping().get("parameters", {})
    cells = dict(mmodel.cells_and_names())
    n = 0
    for path, module in tmodel.named_modules():
        names = rename.get(type(module).__name__, {})
        for pname, value in module.named_parameters(recurse=False):
            getattr(cells[path], names.get(pname, pname)).set_data(Tensor(value.detach().numpy().copy()))
            n += 1
    return n


def batches(n: int = 2, batch: int = 4, seed: int = 0):
    """[(x, y)] numpy float32; small inputs so that a LayerNorm epsilon shows in float32."""
    rng = np.random.default_rng(seed)
    return [((rng.standard_normal((batch, SEQ, D_MODEL)) * 0.05).astype(np.float32),
             rng.standard_normal((batch, SEQ, OUT)).astype(np.float32)) for _ in range(n)]
