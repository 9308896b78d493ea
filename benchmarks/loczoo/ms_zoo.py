"""MindSpore ports of six torch families (mlp, cnn, gpt_block, llama_block, encoder, moe), with
the same bugs injected on the MindSpore side where they make sense.

Imported only in the MindSpore child process (``ms_child``), never next to torch. A port is
faithful: ``nn.Dense``/``nn.Conv2d``/``nn.LayerNorm``/``nn.BatchNorm2d`` where torch has its
module, ``ops.*`` with CPU kernels for the functional code, the same attribute paths as the
torch model (so ``Cell.net.attn.c_proj.Dense`` pairs with ``Module.net.attn.c_proj.Linear``),
and custom backwards ported as ``bprop``. The variant ``clean_port`` is the faithful port;
weight bugs arrive through the copied weights (``arrays.apply_edit``), not through this code.
MindSpore's own defaults are the realistic port bugs: ``wrong_eps`` keeps nn.LayerNorm's
default epsilon 1e-7 (torch: 1e-5), ``gelu_tanh`` keeps nn.GELU()'s default tanh form.
"""
from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

B, T, D, HEADS = 2, 5, 16, 2
HD = D // HEADS
EPS_BUG = 1e-3


def noop(x, v: str):
    """clean_noop: calls that change nothing on float32."""
    if v == "clean_noop":
        return x.reshape(x.shape).copy().astype(ms.float32)
    return x


def _layer_norm(v: str, bug_eps: bool = True) -> nn.LayerNorm:
    if bug_eps and v == "wrong_eps":
        return nn.LayerNorm((D,))                # MindSpore's default epsilon (1e-7)
    return nn.LayerNorm((D,), epsilon=1e-5)


class Act(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.approx = "tanh" if v == "gelu_tanh" else "none"

    def construct(self, x):
        return ops.gelu(x, approximate=self.approx)


class CustomTanh(nn.Cell):
    """torch's _TanhFn: tanh with a hand-written backward, ported as bprop."""

    def construct(self, x):
        return ops.tanh(x)

    def bprop(self, x, out, dout):
        return (dout * (1 - out * out),)


class MLP(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.fc1, self.act = nn.Dense(8, D), Act(v)
        self.fc2, self.act2 = nn.Dense(D, D), CustomTanh()
        self.fc3 = nn.Dense(D, 4)

    def construct(self, x):
        h = noop(self.act(self.fc1(x)), self.v)
        r = self.act2(self.fc2(h))
        h = r if self.v == "dropped_residual" else h + r
        return self.fc3(h)


class CustomSwish(nn.Cell):
    def construct(self, x):
        return x * ops.sigmoid(x)

    def bprop(self, x, out, dout):
        s = ops.sigmoid(x)
        return (dout * (s + x * s * (1 - s)),)


class CNN(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        if v == "padding_mode":      # reflect padding done by hand, then a valid convolution
            self.conv1 = nn.Conv2d(3, 8, 3, pad_mode="valid", has_bias=True)
        else:
            self.conv1 = nn.Conv2d(3, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.bn1 = nn.BatchNorm2d(8, eps=EPS_BUG if v == "wrong_eps" else 1e-5, momentum=0.9)
        self.conv2 = nn.Conv2d(8, 8, 3, pad_mode="pad", padding=1, has_bias=True)
        self.bn2 = nn.BatchNorm2d(8, eps=1e-5, momentum=0.9)
        self.act2 = CustomSwish()
        self.head = nn.Dense(8, 5)

    def construct(self, x):
        if self.v == "padding_mode":
            x = ops.pad(x, (1, 1, 1, 1), mode="reflect")
        h = ops.relu(self.bn1(self.conv1(x)))
        h = self.act2(self.bn2(self.conv2(noop(h, self.v))))
        return self.head(h.mean((1, 3)) if self.v == "wrong_axis" else h.mean((2, 3)))


def _causal(t: int, diagonal: int) -> Tensor:
    return Tensor(np.triu(np.ones((t, t), dtype=np.bool_), diagonal))


class CausalSelfAttention(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.c_attn, self.c_proj = nn.Dense(D, 3 * D), nn.Dense(D, D)

    def construct(self, x):
        v = self.v
        b, t, d = x.shape
        qkv = noop(self.c_attn(x), v)
        q, k, val = qkv[:, :, :d], qkv[:, :, d:2 * d], qkv[:, :, 2 * d:]
        q, k, val = (z.reshape(b, t, HEADS, HD).transpose(0, 2, 1, 3) for z in (q, k, val))
        if v == "swapped_operands":
            att = ops.matmul(k, q.transpose(0, 1, 3, 2))
        else:
            att = ops.matmul(q, k.transpose(0, 1, 3, 2))
        if v != "missing_scale":
            att = att * (1.0 / math.sqrt(HD))
        att = ops.masked_fill(att, _causal(t, 2 if v == "off_by_one" else 1), -1e9)
        att = ops.softmax(att, -2 if v == "wrong_axis" else -1)
        y = ops.matmul(att, val).transpose(0, 2, 1, 3).reshape(b, t, d)
        return self.c_proj(y)


class GPTMLP(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.c_fc = nn.Dense(D, 4 * D)
        self.act = nn.GELU(approximate=v == "gelu_tanh")
        self.c_proj = nn.Dense(4 * D, D)

    def construct(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class GPTBlockModel(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.ln_1, self.attn = _layer_norm(v), CausalSelfAttention(v)
        self.ln_2, self.mlp = _layer_norm(v, bug_eps=False), GPTMLP(v)

    def construct(self, x):
        a = self.attn(self.ln_1(x))
        x = a if self.v == "dropped_residual" else x + a
        return x + self.mlp(self.ln_2(x))


class RMSNorm(nn.Cell):
    def __init__(self, v: str, eps: float = 1e-6):
        super().__init__()
        self.v = v
        self.eps = 1e-4 if v == "wrong_eps" else eps
        self.weight = Parameter(Tensor(np.ones(D, np.float32)), name="weight")

    def construct(self, x):
        var = ops.pow(x, 2).mean(-2 if self.v == "wrong_axis" else -1, keep_dims=True)
        return self.weight * (x * ops.rsqrt(var + self.eps))


class Rotary(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.inv_freq = Tensor(1.0 / (10000.0 ** (np.arange(0, HD, 2, dtype=np.float32) / HD)))

    def construct(self, x):
        t = x.shape[-2]
        pos = ops.arange(0, t).astype(ms.float32)
        freqs = ops.outer(pos, self.inv_freq)
        emb = ops.cat((freqs, freqs), -1)
        return ops.cos(emb), ops.sin(emb)


class LlamaAttention(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Dense(D, D, has_bias=False) for _ in range(4))
        self.rotary = Rotary(v)

    def rotate_half(self, x):
        half = HD // 2 + 1 if self.v == "off_by_one" else HD // 2
        x1, x2 = x[..., :half], x[..., half:]
        if self.v == "swapped_operands":
            return ops.cat((x1, -x2), -1)
        return ops.cat((-x2, x1), -1)

    def construct(self, x):
        b, t, _ = x.shape
        q, k, val = (z.reshape(b, t, HEADS, HD).transpose(0, 2, 1, 3)
                     for z in (self.q_proj(x), self.k_proj(x), self.v_proj(x)))
        cos, sin = self.rotary(q)
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        att = ops.matmul(q, k.transpose(0, 1, 3, 2))
        if self.v != "missing_scale":
            att = att * (1.0 / math.sqrt(HD))
        att = ops.masked_fill(att, _causal(t, 1), -1e9)
        y = ops.matmul(ops.softmax(att, -1), val)
        return self.o_proj(y.transpose(0, 2, 1, 3).reshape(b, t, D))


class SwiGLU(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Dense(D, 2 * D, has_bias=False), nn.Dense(D, 2 * D, has_bias=False)
        self.down_proj = nn.Dense(2 * D, D, has_bias=False)

    def construct(self, x):
        return self.down_proj(ops.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.input_layernorm = RMSNorm(v)
        self.self_attn = LlamaAttention(v)
        self.post_attention_layernorm = RMSNorm("clean_port")
        self.mlp = SwiGLU(v)

    def construct(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        m = self.mlp(self.post_attention_layernorm(x))
        return m if self.v == "dropped_residual" else x + m


class EncAttention(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.q, self.k, self.v_proj, self.o = (nn.Dense(D, D) for _ in range(4))

    def construct(self, x, pad):
        v = self.v
        b, t, _ = x.shape
        q, k, val = (z.reshape(b, t, HEADS, HD).transpose(0, 2, 1, 3) for z in (self.q(x), self.k(x), self.v_proj(x)))
        att = ops.matmul(k, q.transpose(0, 1, 3, 2)) if v == "swapped_operands" else ops.matmul(q, k.transpose(0, 1, 3, 2))
        if v != "missing_scale":
            att = att * (1.0 / math.sqrt(HD))
        att = ops.masked_fill(att, pad[:, None, None, :], -1e9)
        att = ops.softmax(att, -2 if v == "wrong_axis" else -1)
        return self.o(ops.matmul(att, val).transpose(0, 2, 1, 3).reshape(b, t, D))


class EncoderLayer(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.attn = EncAttention(v)
        self.ln1 = _layer_norm(v)
        self.ff1, self.act, self.ff2 = nn.Dense(D, 2 * D), Act(v), nn.Dense(2 * D, D)
        self.ln2 = _layer_norm(v, bug_eps=False)

    def construct(self, x, pad):
        x = self.ln1(x + self.attn(x, pad))
        f = self.ff2(self.act(self.ff1(x)))
        return self.ln2(f if self.v == "dropped_residual" else x + f)


class Encoder(nn.Cell):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.layer = EncoderLayer(v)

    def construct(self, x, lengths):
        pos = ops.arange(x.shape[1])[None, :]
        pad = pos > lengths[:, None] if self.v == "off_by_one" else pos >= lengths[:, None]
        h = self.layer(x, pad)
        keep = ops.logical_not(pad).astype(ms.float32)[..., None]
        return (h * keep).sum(1) / keep.sum(1)


class Expert(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Dense(D, 2 * D), nn.Dense(2 * D, D)

    def construct(self, x):
        return self.fc2(ops.relu(self.fc1(x)))


class MoE(nn.Cell):
    E, K = 4, 2

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.router = nn.Dense(D, self.E, has_bias=False)
        self.experts = nn.CellList([Expert() for _ in range(self.E)])

    def construct(self, x):
        v = self.v
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        probs = ops.softmax(self.router(flat), 0 if v == "wrong_axis" else -1)
        w, idx = ops.topk(probs, self.K)
        if v == "swapped_operands":
            w = w.sum(-1, keepdims=True) / w
        elif v != "missing_scale":
            w = w / w.sum(-1, keepdims=True)
        out = ops.zeros_like(flat)
        for e_i in range(self.E):
            sel = idx == ((e_i + 1) % self.E if v == "off_by_one" else e_i)
            coef = (w * sel.astype(ms.float32)).sum(-1, keepdims=True)
            out = out + self.experts[e_i](flat) * coef
        out = out.reshape(b, t, d)
        return out if v == "dropped_residual" else x + out


def _loss_fn(kind: str, o, y, reduction: str):
    """MindSpore's own loss function of `kind` (ops.*: each runs as several primitives)."""
    if kind == "mse":
        return ops.mse_loss(o, y, reduction=reduction)
    if kind == "ce":
        return ops.cross_entropy(o, y, reduction=reduction)
    if kind == "smooth_l1":
        return ops.smooth_l1_loss(o, y, beta=1.0, reduction=reduction)
    return ops.kl_div(ops.log_softmax(o, 1), ops.softmax(y, 1), reduction=reduction)


_LOSS_CELLS = {"mse": lambda r: nn.MSELoss(reduction=r), "ce": lambda r: nn.CrossEntropyLoss(reduction=r),
               "smooth_l1": lambda r: nn.SmoothL1Loss(beta=1.0, reduction=r), "kl": lambda r: nn.KLDivLoss(reduction=r)}


class LossNet(nn.Cell):
    """The port of torch_zoo.LossNet: the same head, MindSpore's loss functions."""

    def __init__(self, kind: str, v: str):
        super().__init__()
        self.kind = kind
        self.fc = nn.Dense(8, 5)
        self.reductions = ("batchmean", "mean", "sum", "none") if kind == "kl" else ("mean", "sum", "none")
        # clean_port_cells: MindSpore's loss Cells (their primitives are recorded inside them)
        self.loss_cells = nn.CellList([_LOSS_CELLS[kind](r) for r in self.reductions]) if v == "clean_port_cells" else None

    def construct(self, x, y):
        o = self.fc(x)
        if self.kind == "ce":
            y = y.astype(ms.int32)
        if self.loss_cells is not None:        # kl: log_softmax and softmax per call, as torch_zoo runs them
            parts = [cell(ops.log_softmax(o, 1), ops.softmax(y, 1)) if self.kind == "kl" else cell(o, y)
                     for cell in self.loss_cells]
        else:
            parts = [_loss_fn(self.kind, o, y, r) for r in self.reductions]
        total = parts[0]
        for part in parts[1:]:
            total = total + (part if part.ndim == 0 else part.mean())
        return total


PORTS = {"mlp": MLP, "cnn": CNN, "gpt_block": GPTBlockModel, "llama_block": LlamaBlock, "encoder": Encoder,
         "moe": MoE, **{f"loss_{k}": (lambda v, k=k: LossNet(k, v)) for k in ("mse", "ce", "smooth_l1", "kl")}}


class Harness(nn.Cell):
    """The root handed to ``debugger.start``; the port is its child ``net`` (as in torch_run)."""

    def __init__(self, net: nn.Cell):
        super().__init__()
        self.net = net

    def construct(self, *xs):
        return self.net(*xs)


def make(family: str, variant: str) -> nn.Cell:
    if family not in PORTS:
        raise ValueError(f"no MindSpore port of {family!r}; ports: {sorted(PORTS)}")
    cell = PORTS[family](variant)
    cell.set_train(True)
    return cell
