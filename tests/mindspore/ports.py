"""PyTorch models and their MindSpore ports with identical weights, optionally with a
migration bug injected in the port (for cross-framework compare tests).

    torch_model, ms_model, x = make_pair("transformer", bug="gelu_approx")
    t_dir, m_dir = dump_pair("transformer", str(tmp_path), bug="gelu_approx")

Models (same attribute paths on both sides, so ``Module.attn.q.Linear.forward.0`` pairs with
``Cell.attn.q.Dense.forward.0``):

- ``mlp``: fc1 (8->16) ReLU fc2 (16->16) Tanh fc3 (16->4)
- ``cnn``: conv (3->4, 3x3, pad 1) BatchNorm2d ReLU MaxPool2d(2) Flatten fc (64->5)
- ``transformer``: pre-LN block: x + attn(ln1(x)), then + mlp(ln2(x)); 2-head attention with
  q/k/v/o projections, a Softmax module and 1/sqrt(head_dim) scaling; MLP fc1 GELU(erf) fc2

Bugs (``BUGS``), each a real migration mistake, and where it first shows (``FIRST_DIVERGENCE``:
the first module, in execution order, whose forward output differs):

- ``transposed_weight``: a weight copied without the layout change it needs (here: an extra
  transpose of a square weight / of a conv kernel's spatial axes)
- ``wrong_eps``: MindSpore's default epsilon kept (nn.LayerNorm 1e-7 instead of torch's 1e-5);
  for the CNN: BatchNorm eps 1e-3 instead of 1e-5
- ``missing_scale``: attention scores not multiplied by 1/sqrt(head_dim)
- ``gelu_approx``: MindSpore's default ``nn.GELU()`` (tanh approximation) for torch's exact GELU

Inputs are small (std 0.05) so that epsilon differences are visible in float32.
Weights are copied through ``torch_mapping.yaml``'s ``parameters`` section (weight -> gamma, ...).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

import numpy as np
import yaml

import ts_core.backends as _backends

MAPPING_PATH = os.path.join(os.path.dirname(_backends.__file__), "mindspore", "torch_mapping.yaml")

MODELS = ("mlp", "cnn", "transformer")
BUGS = {
    "mlp": ("transposed_weight",),
    "cnn": ("transposed_weight", "wrong_eps"),
    "transformer": ("wrong_eps", "transposed_weight", "missing_scale", "gelu_approx"),
}
# Ports with jit regions (ms_model's `jit`) may also get a bug inside the jit function.
JIT_BUGS = ("wrong_scale",)
FIRST_DIVERGENCE = {
    ("mlp", "transposed_weight"): "fc2",
    ("cnn", "transposed_weight"): "conv",
    ("cnn", "wrong_eps"): "bn",
    ("transformer", "wrong_eps"): "ln1",
    ("transformer", "transposed_weight"): "attn.q",
    ("transformer", "missing_scale"): "attn.softmax",
    ("transformer", "gelu_approx"): "mlp.act",
}
_TRANSPOSED = {"mlp": "fc2", "cnn": "conv", "transformer": "attn.q"}
D_MODEL, HEADS, SEQ = 16, 2, 5


def load_mapping() -> dict:
    with open(MAPPING_PATH, encoding="utf-8") as f:
        return yaml.safe_load(f)


def make_input(name: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = {"mlp": (4, 8), "cnn": (2, 3, 8, 8), "transformer": (2, SEQ, D_MODEL)}[name]
    return (rng.standard_normal(shape) * 0.05).astype(np.float32)


# ------------------------------------------------------------------------------ torch side
def torch_model(name: str, seed: int = 0):
    import torch
    import torch.nn as tnn

    class MLP(tnn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act1 = tnn.Linear(8, 16), tnn.ReLU()
            self.fc2, self.act2 = tnn.Linear(16, 16), tnn.Tanh()
            self.fc3 = tnn.Linear(16, 4)

        def forward(self, x):
            return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))

    class CNN(tnn.Module):
        def __init__(self):
            super().__init__()
            self.conv = tnn.Conv2d(3, 4, 3, padding=1)
            self.bn = tnn.BatchNorm2d(4, eps=1e-5)
            self.relu = tnn.ReLU()
            self.pool = tnn.MaxPool2d(2)
            self.flatten = tnn.Flatten()
            self.fc = tnn.Linear(64, 5)

        def forward(self, x):
            return self.fc(self.flatten(self.pool(self.relu(self.bn(self.conv(x))))))

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
            out = torch.matmul(self.softmax(scores), v).transpose(1, 2).reshape(b, t, d)
            return self.o(out)

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

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    torch.manual_seed(seed)
    model = {"mlp": MLP, "cnn": CNN, "transformer": Block}[name]()
    if name == "transformer":       # non-trivial LayerNorm affine parameters
        with torch.no_grad():
            for ln in (model.ln1, model.ln2):
                ln.weight.add_(torch.randn_like(ln.weight) * 0.1)
                ln.bias.add_(torch.randn_like(ln.bias) * 0.1)
    model.train()
    return model


# -------------------------------------------------------------------------- MindSpore side
def ms_model(name: str, bug: Optional[str] = None, jit: Optional[str] = None):
    """`jit` ("ast" / "bytecode"): the transformer port computes its attention scores in a
    ``mindspore.jit`` function (``attention_scores(q, k)``, scale included) and runs its
    FeedForward as a jit Cell (decorated ``construct``), as MindSpore users write hot code;
    ``wrong_scale`` (JIT_BUGS) is a bug inside that function."""
    import mindspore as ms
    from mindspore import nn, ops

    def maybe_jit(fn):
        return ms.jit(fn, capture_mode=jit) if jit else fn

    if bug == "wrong_scale":        # divides by head_dim instead of its square root
        @maybe_jit
        def attention_scores(q, k):
            return ops.matmul(q, k.transpose(0, 1, 3, 2)) / q.shape[-1]
    elif bug == "missing_scale":
        @maybe_jit
        def attention_scores(q, k):
            return ops.matmul(q, k.transpose(0, 1, 3, 2))
    else:
        @maybe_jit
        def attention_scores(q, k):
            return ops.matmul(q, k.transpose(0, 1, 3, 2)) * q.shape[-1] ** -0.5

    if bug is not None and bug not in BUGS[name] + (JIT_BUGS if jit else ()):
        raise ValueError(f"{name} has no bug {bug!r}; choose from {BUGS[name]}")

    class MLP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1, self.act1 = nn.Dense(8, 16), nn.ReLU()
            self.fc2, self.act2 = nn.Dense(16, 16), nn.Tanh()
            self.fc3 = nn.Dense(16, 4)

        def construct(self, x):
            return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))

    class CNN(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
            self.bn = nn.BatchNorm2d(4, eps=1e-3 if bug == "wrong_eps" else 1e-5, momentum=0.9)
            self.relu = nn.ReLU()
            self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
            self.flatten = nn.Flatten()
            self.fc = nn.Dense(64, 5)

        def construct(self, x):
            return self.fc(self.flatten(self.pool(self.relu(self.bn(self.conv(x))))))

    class Attention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Dense(D_MODEL, D_MODEL) for _ in range(4))
            self.softmax = nn.Softmax(axis=-1)
            self.scale = None if bug == "missing_scale" else (D_MODEL // HEADS) ** -0.5

        def construct(self, x):
            b, t, d = x.shape
            hd = d // HEADS
            q = self.q(x).reshape(b, t, HEADS, hd).transpose(0, 2, 1, 3)
            k = self.k(x).reshape(b, t, HEADS, hd).transpose(0, 2, 1, 3)
            v = self.v(x).reshape(b, t, HEADS, hd).transpose(0, 2, 1, 3)
            if jit:
                scores = attention_scores(q, k)
            else:
                scores = ops.matmul(q, k.transpose(0, 1, 3, 2))
                if self.scale is not None:
                    scores = scores * self.scale
            out = ops.matmul(self.softmax(scores), v).transpose(0, 2, 1, 3).reshape(b, t, d)
            return self.o(out)

    class FeedForward(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(D_MODEL, 4 * D_MODEL)
            self.act = nn.GELU() if bug == "gelu_approx" else nn.GELU(approximate=False)
            self.fc2 = nn.Dense(4 * D_MODEL, D_MODEL)

        @maybe_jit
        def construct(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            def ln():
                if bug == "wrong_eps":
                    return nn.LayerNorm((D_MODEL,))          # MindSpore default epsilon=1e-7
                return nn.LayerNorm((D_MODEL,), epsilon=1e-5)
            self.ln1, self.attn = ln(), Attention()
            self.ln2, self.mlp = ln(), FeedForward()

        def construct(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    model = {"mlp": MLP, "cnn": CNN, "transformer": Block}[name]()
    model.set_train(True)
    return model


def copy_weights(tmodel, mmodel, transpose_path: Optional[str] = None) -> int:
    """Torch parameters and buffers -> the port's Parameters, renamed through the mapping file.
    `transpose_path`: the module whose weight is copied with a layout error (the bug)."""
    from mindspore import Tensor

    rename = load_mapping().get("parameters", {})
    cells = dict(mmodel.cells_and_names())
    copied = 0
    for path, module in tmodel.named_modules():
        names = rename.get(type(module).__name__, {})
        tensors = list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
        if not tensors:
            continue
        cell = cells[path]
        for tname, value in tensors:
            if tname == "num_batches_tracked":
                continue
            array = value.detach().cpu().numpy().copy()
            if path == transpose_path and tname == "weight":
                array = np.ascontiguousarray(np.swapaxes(array, -1, -2))
            target = getattr(cell, names.get(tname, tname))
            target.set_data(Tensor(array))
            copied += 1
    return copied


def make_pair(name: str, bug: Optional[str] = None, seed: int = 0,
              jit: Optional[str] = None) -> Tuple[Any, Any, np.ndarray]:
    """(torch model, MindSpore port with identical weights [and the bug; jit regions, see
    ms_model], numpy input)."""
    tmodel = torch_model(name, seed)
    mmodel = ms_model(name, bug, jit)
    copy_weights(tmodel, mmodel, _TRANSPOSED[name] if bug == "transposed_weight" else None)
    return tmodel, mmodel, make_input(name, seed)


# ----------------------------------------------------------------------------------- dumps
def dump_torch(tmodel, x: np.ndarray, dump_path: str, level: str = "L0", task: str = "tensor") -> str:
    """One forward + backward (loss = mean of squared outputs) of `tmodel`, dumped; returns the rank dir."""
    import torch

    from ts_core import PrecisionDebugger

    dbg = PrecisionDebugger(dump_path=dump_path, task=task, level=level, step=[0])
    try:
        dbg.start(tmodel)
        loss = tmodel(torch.from_numpy(x)).pow(2).mean()
        loss.backward()
        dbg.stop()
        dbg.step()
    finally:
        dbg.close()
    return os.path.join(dump_path, "step0", "rank")


def dump_mindspore(mmodel, x: np.ndarray, dump_path: str, level: str = "L0", task: str = "tensor") -> str:
    """The same for the MindSpore port (ms.value_and_grad w.r.t. its trainable parameters)."""
    import mindspore as ms
    from mindspore import Tensor

    from ts_core import PrecisionDebugger

    def loss_fn(inp):
        out = mmodel(inp)
        return (out * out).mean()

    grad_fn = ms.value_and_grad(loss_fn, None, mmodel.trainable_params())
    dbg = PrecisionDebugger(dump_path=dump_path, task=task, level=level, step=[0])
    try:
        dbg.start(mmodel)
        grad_fn(Tensor(x))
        dbg.stop()
        dbg.step()
    finally:
        dbg.close()
    return os.path.join(dump_path, "step0", "rank")


def dump_pair(name: str, root: str, bug: Optional[str] = None, level: str = "L0", task: str = "tensor",
              seed: int = 0, jit: Optional[str] = None) -> Tuple[str, str]:
    """Dump the torch model under ROOT/torch and its port under ROOT/mindspore; returns both rank dirs."""
    tmodel, mmodel, x = make_pair(name, bug, seed, jit)
    return (dump_torch(tmodel, x, os.path.join(root, "torch"), level, task),
            dump_mindspore(mmodel, x, os.path.join(root, "mindspore"), level, task))


def module_outputs(rank_dir: str) -> Dict[Tuple[str, int], Dict[str, Any]]:
    """{(module path, call index): forward record} of a dump, in execution order."""
    import json

    with open(os.path.join(rank_dir, "dump.json"), encoding="utf-8") as f:
        data = json.load(f)["data"]
    out: Dict[Tuple[str, int], Dict[str, Any]] = {}
    for key, rec in data.items():
        parts = key.split(".")
        if parts[0] in ("Module", "Cell") and len(parts) >= 5 and parts[-2] == "forward":
            out[(".".join(parts[1:-3]), int(parts[-1]))] = dict(rec, _class=parts[-3], _key=key)
    return out
