"""A net with ``mindspore.jit`` regions, as users write them, and its numbers in numpy.

``Net``: ``fc`` (Dense 4->4), then ``fused(h, w)`` (a jit function: matmul, relu, a Python-float
scale and a mint mean), then ``inner`` (a Cell whose ``construct`` is jit-decorated: Dense,
ReLU, sigmoid and a residual). ``reference`` computes every value and, for ``loss = out.sum()``,
every gradient of the regions' boundaries in float64 numpy.
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import mindspore as ms
from mindspore import Tensor, mint, nn, ops

_NETS: Dict[str, type] = {}


def net_class(mode: str, fresh: bool = False) -> type:
    """The Net class whose jit regions use ``capture_mode=mode`` (one class per mode; `fresh`:
    a new one, whose regions have never run: a trace region keeps the graph, and the
    Parameters, of its first call)."""
    if mode in _NETS and not fresh:
        return _NETS[mode]

    @ms.jit(capture_mode=mode)
    def fused(x, w):
        h = ops.matmul(x, w)
        return ops.relu(h) * 2.0 + mint.mean(h)

    class Inner(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 4)
            self.act = nn.ReLU()

        @ms.jit(capture_mode=mode)
        def construct(self, x):
            return ops.sigmoid(self.act(self.fc(x))) + x

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 4)
            self.w = ms.Parameter(Tensor(np.eye(4, dtype=np.float32)), name="w")
            self.inner = Inner()

        def construct(self, x):
            return self.inner(fused(self.fc(x), self.w))

    if not fresh:
        _NETS[mode] = Net
    return Net


def make_net(mode: str, seed: int = 0, cls: type = None) -> nn.Cell:
    """A Net (of `cls`, default ``net_class(mode)``) with parameters drawn from numpy (the
    same for every mode and run)."""
    net = (cls or net_class(mode))()
    rng = np.random.default_rng(seed)
    for p in sorted(net.get_parameters(), key=lambda p: p.name):
        p.set_data(Tensor((rng.standard_normal(p.shape) * 0.5).astype(np.float32)))
    return net


def make_input(seed: int = 1, n: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def reference(net: nn.Cell, x: np.ndarray) -> Dict[str, np.ndarray]:
    """Forward values and, for ``loss = out.sum()``, the boundary gradients, in float64."""
    p = {q.name: q.asnumpy().astype(np.float64) for q in net.get_parameters()}
    x = x.astype(np.float64)
    h = x @ p["fc.weight"].T + p["fc.bias"]                     # fused's input 0
    w = p["w"]
    m = h @ w
    f = np.maximum(m, 0) * 2.0 + m.mean()                       # fused's output, inner's input
    pre = f @ p["inner.fc.weight"].T + p["inner.fc.bias"]
    s = 1.0 / (1.0 + np.exp(-np.maximum(pre, 0)))
    out = s + f                                                 # inner's output
    g_out = np.ones_like(out)
    g_f = (g_out * s * (1 - s) * (pre > 0)) @ p["inner.fc.weight"] + g_out
    g_m = g_f * 2.0 * (m > 0) + g_f.sum() / m.size
    return {"h": h, "w": w, "f": f, "out": out, "g_out": g_out, "g_f": g_f,
            "g_h": g_m @ w.T, "g_w": h.T @ g_m}


class HeadNet(nn.Cell):
    """``fc``, then ``apply_head``: a jit function that calls a Cell it reads as a global
    (``HEAD``, also this net's ``head``), as scripts that keep a model global do."""

    def __init__(self):
        super().__init__()
        global HEAD
        self.fc = nn.Dense(4, 4)
        self.head = HEAD = nn.Dense(4, 2)

    def construct(self, x):
        return apply_head(self.fc(x))


HEAD = None


@ms.jit
def apply_head(h):
    return ops.relu(HEAD(h))
