"""The PyTorch model families of the localisation benchmark, each with its injected bugs.

Every family is one ``nn.Module`` class whose constructor takes the variant name (a bug kind
from ``spec.BUG_KINDS`` or ``clean_<kind>``) and computes exactly the golden math unless the
variant says otherwise. Weight bugs are not in the code: they are ``WeightEdit``s applied to
the state dict (``weights.apply_edit``), so the MindSpore port gets the same edit.

``FAMILIES[name]`` holds the model, its inputs, its loss, and per variant where the bug lives
(``Place``, module paths relative to the family model) or ``None`` for a clean variant.
Sizes are tiny (batch 2, 5 tokens, width 16) so that a dump takes well under a second.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .spec import OUTSIDE, P, Place, WeightEdit

B, T, D, HEADS = 2, 5, 16, 2
HD = D // HEADS
EPS_BUG = 1e-3          # torch<->torch "wrong_eps": a normalisation eps of 1e-3 instead of ~1e-5


def noop(x: torch.Tensor, v: str) -> torch.Tensor:
    """The clean_noop variant inserts calls that change nothing on float32."""
    if v == "clean_noop":
        return x.contiguous().view(x.shape).clone().float()
    return x


def dropout(x: torch.Tensor, v: str) -> torch.Tensor:
    """The nondeterministic variant: a dropout whose random stream is seeded differently every run
    (as an unseeded data loader worker or a nondeterministic kernel would); else nothing."""
    if v != "nondeterministic":
        return x
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    return F.dropout(x, p=0.2, training=True)


def silu(x: torch.Tensor, v: str) -> torch.Tensor:
    """SiLU, or hard SiLU (hardswish) for the silu_approx bug."""
    return F.hardswish(x) if v == "silu_approx" else F.silu(x)


class autocast_bf16:
    """Context manager: bfloat16 autocast when ``on`` (the bf16_op bug), else nothing."""

    def __init__(self, on: bool):
        self.ctx = torch.autocast("cpu", dtype=torch.bfloat16) if on else None

    def __enter__(self):
        return self.ctx.__enter__() if self.ctx else None

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc) if self.ctx else False


class _TanhFn(torch.autograd.Function):
    """tanh with a hand-written backward; ``wrong`` forgets to square y: g * (1 - y)."""

    @staticmethod
    def forward(ctx, x, wrong: bool):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        ctx.wrong = wrong
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        if ctx.wrong:
            return g * (1 - y), None
        return g * (1 - y * y), None


class CustomTanh(nn.Module):
    def __init__(self, v: str):
        super().__init__()
        self.wrong = v == "custom_backward"

    def forward(self, x):
        return _TanhFn.apply(x, self.wrong)


class Act(nn.Module):
    """GELU, exact unless gelu_tanh; clean_decomp writes the erf form out."""

    def __init__(self, v: str):
        super().__init__()
        self.v = v

    def forward(self, x):
        if self.v == "gelu_tanh":
            return F.gelu(x, approximate="tanh")
        if self.v == "clean_decomp":
            return 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))
        return F.gelu(x)


# ------------------------------------------------------------------------------------ MLP
class MLP(nn.Module):
    """fc1 GELU, then a residual branch fc2 -> custom tanh, then fc3."""

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.fc1, self.act = nn.Linear(8, D), Act(v)
        self.fc2, self.act2 = nn.Linear(D, D), CustomTanh(v)
        self.fc3 = nn.Linear(D, 4)

    def forward(self, x):
        h = dropout(noop(self.act(self.fc1(x)), self.v), self.v)
        with autocast_bf16(self.v == "bf16_op"):
            r = self.fc2(h)
        r = self.act2(r.float())
        if self.v == "dropped_residual":
            h = r
        elif self.v == "clean_noise":
            h = (h + 0.5 * r) + 0.5 * r
        else:
            h = h + r
        return self.fc3(h)


# ------------------------------------------------------------------------------------ CNN
class _SwishFn(torch.autograd.Function):
    """x * sigmoid(x) with a hand-written backward; ``wrong`` drops the product rule's 2nd term."""

    @staticmethod
    def forward(ctx, x, wrong: bool):
        s = torch.sigmoid(x)
        ctx.save_for_backward(x, s)
        ctx.wrong = wrong
        return x * s

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        if ctx.wrong:
            return g * s, None
        return g * (s + x * s * (1 - s)), None


class CustomSwish(nn.Module):
    def __init__(self, v: str):
        super().__init__()
        self.wrong = v == "custom_backward"
        self.hard = v == "silu_approx"

    def forward(self, x):
        return F.hardswish(x) if self.hard else _SwishFn.apply(x, self.wrong)


class CNN(nn.Module):
    """conv-BN-relu, conv-BN-swish, global mean pool, linear head (H = W = channels = 8)."""

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, padding_mode="reflect" if v == "padding_mode" else "zeros")
        self.bn1 = nn.BatchNorm2d(8, eps=EPS_BUG if v == "wrong_eps" else 1e-5)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.act2 = CustomSwish(v)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        h = self.bn1(self.conv1(x))
        h = h.clamp(min=0) if self.v == "clean_decomp" else F.relu(h)
        h = dropout(noop(h, self.v), self.v)
        h = self.act2(self.bn2(self.conv2(h)))
        if self.v == "wrong_axis":
            pooled = h.mean((1, 3))
        elif self.v == "clean_noise":
            pooled = h.mean(3).mean(2)
        else:
            pooled = h.mean((2, 3))
        return self.head(pooled)


# ------------------------------------------------------------------------------------ GPT
class CausalSelfAttention(nn.Module):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        v = self.v
        b, t, d = x.shape
        qkv = noop(self.c_attn(x), v)
        q, k, val = qkv.split(d, dim=2)
        heads = lambda z: z.view(b, t, HEADS, HD).transpose(1, 2)   # noqa: E731
        if v == "clean_reorder":
            k, q, val = heads(k), heads(q), heads(val)
        else:
            q, k, val = heads(q), heads(k), heads(val)
        scale = 1.0 / math.sqrt(HD)
        if v == "clean_decomp":        # the same attention through the fused kernel
            y = F.scaled_dot_product_attention(q, k, val, is_causal=True)
        else:
            if v == "clean_noise":
                att = (q * scale) @ k.transpose(-2, -1)
            elif v == "swapped_operands":
                att = (k @ q.transpose(-2, -1)) * scale
            elif v == "missing_scale":
                att = q @ k.transpose(-2, -1)
            elif v == "wrong_scale":
                att = (q @ k.transpose(-2, -1)) * (1.0 / HD)
            else:
                att = (q @ k.transpose(-2, -1)) * scale
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=2 if v == "off_by_one" else 1)
            att = att.masked_fill(mask, -1e9)
            att = dropout(F.softmax(att, dim=-2 if v == "wrong_axis" else -1), v)
            y = att @ val
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        return self.c_proj(y)


class GPTMLP(nn.Module):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.c_fc, self.act, self.c_proj = nn.Linear(D, 4 * D), nn.GELU(approximate="tanh" if v == "gelu_tanh" else "none"), nn.Linear(4 * D, D)

    def forward(self, x):
        with autocast_bf16(self.v == "bf16_op"):
            h = self.c_fc(x)
        return self.c_proj(self.act(h.float()))


class GPTBlock(nn.Module):
    """GPT-2 pre-LN block. ``v`` applies to this block only (other blocks get "clean_same")."""

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.ln_1 = nn.LayerNorm(D, eps=EPS_BUG if v == "wrong_eps" else 1e-5)
        self.attn = CausalSelfAttention(v)
        self.ln_2 = nn.LayerNorm(D)
        self.mlp = GPTMLP(v)

    def forward(self, x):
        a = self.attn(self.ln_1(x))
        x = a if self.v == "dropped_residual" else x + a
        return x + self.mlp(self.ln_2(x))


def _randomise_ln(ln: nn.LayerNorm, g: torch.Generator) -> None:
    with torch.no_grad():
        ln.weight.add_(torch.randn(ln.weight.shape, generator=g) * 0.1)
        ln.bias.add_(torch.randn(ln.bias.shape, generator=g) * 0.1)


class GPTBlockModel(GPTBlock):
    """One block as a model: ln_1 gets non-trivial affine parameters; ln_2 keeps weight 1,
    bias 0, so its output has zero mean per row (the cancelled_weight_row bug needs that)."""

    def __init__(self, v: str):
        super().__init__(v)
        _randomise_ln(self.ln_1, torch.Generator().manual_seed(1))


class GPT(nn.Module):
    """Token + position embeddings, 2 blocks (the bug in block 1 unless it is elsewhere), ln_f,
    tied-free lm head."""

    VOCAB, BUG_BLOCK = 32, 1

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.wte, self.wpe = nn.Embedding(self.VOCAB, D), nn.Embedding(8, D)
        block_v = lambda i: v if (i == self.BUG_BLOCK and v not in ("wrong_eps", "off_by_one")) else "clean_same"  # noqa: E731
        self.h = nn.ModuleList([GPTBlock(block_v(i)) for i in range(2)])
        self.ln_f = nn.LayerNorm(D, eps=EPS_BUG if v == "wrong_eps" else 1e-5)
        self.lm_head = nn.Linear(D, self.VOCAB, bias=False)
        with torch.no_grad():                 # GPT-2's small embedding init: LayerNorm eps matters
            self.wte.weight.mul_(0.05)
            self.wpe.weight.mul_(0.05)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(1, t + 1) if self.v == "off_by_one" else torch.arange(0, t)
        if self.v == "clean_reorder":
            p = self.wpe(pos)
            x = self.wte(idx) + p
        else:
            x = self.wte(idx) + self.wpe(pos)
        x = noop(x, self.v)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ---------------------------------------------------------------------------------- Llama
class RMSNorm(nn.Module):
    def __init__(self, v: str, eps: float = 1e-6):
        super().__init__()
        self.v = v
        self.eps = 1e-4 if v == "wrong_eps" else eps
        self.weight = nn.Parameter(torch.ones(D))

    def forward(self, x):
        if self.v == "clean_decomp":
            return F.rms_norm(x, (D,), self.weight, self.eps)
        var = x.pow(2).mean(-2 if self.v == "wrong_axis" else -1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class Rotary(nn.Module):
    """cos/sin tables of the rotary embedding for positions 0..T-1."""

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.register_buffer("inv_freq", 1.0 / (10000.0 ** (torch.arange(0, HD, 2).float() / HD)), persistent=False)

    def forward(self, x):
        t = x.shape[-2]
        pos = torch.arange(0, t)
        freqs = torch.outer(pos.float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class LlamaAttention(nn.Module):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.rotary = Rotary(v)

    def rotate_half(self, x):
        half = HD // 2 + 1 if self.v == "off_by_one" else HD // 2
        x1, x2 = x[..., :half], x[..., half:]
        if self.v == "swapped_operands":
            return torch.cat((x1, -x2), dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    def forward(self, x):
        v = self.v
        b, t, _ = x.shape
        heads = lambda z: z.view(b, t, HEADS, HD).transpose(1, 2)   # noqa: E731
        if v == "clean_reorder":
            val = heads(self.v_proj(x))
            k = heads(self.k_proj(x))
            q = heads(self.q_proj(x))
        else:
            q, k, val = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        cos, sin = self.rotary(q)
        q = q * cos + self.rotate_half(q) * sin
        k = k * cos + self.rotate_half(k) * sin
        att = q @ k.transpose(-2, -1)
        if v != "missing_scale":
            att = att * (1.0 / math.sqrt(HD))
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1), -1e9)
        y = F.softmax(att, dim=-1) @ val
        return self.o_proj(noop(y.transpose(1, 2).reshape(b, t, D), v))


class SwiGLU(nn.Module):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.gate_proj, self.up_proj = nn.Linear(D, 2 * D, bias=False), nn.Linear(D, 2 * D, bias=False)
        self.down_proj = nn.Linear(2 * D, D, bias=False)

    def forward(self, x):
        v = self.v
        if v == "clean_reorder":
            up = self.up_proj(x)
            gate = self.gate_proj(x)
        else:
            gate = self.gate_proj(x)
            with autocast_bf16(v == "bf16_op"):
                up = self.up_proj(x)
            up = up.float()
        act = gate * torch.sigmoid(gate) if v == "clean_decomp_silu" else silu(gate, v)
        return self.down_proj(dropout(act, v) * up)


class LlamaBlock(nn.Module):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.input_layernorm = RMSNorm(v)
        self.self_attn = LlamaAttention(v)
        self.post_attention_layernorm = RMSNorm("clean_same")
        self.mlp = SwiGLU(v)
        with torch.no_grad():
            self.input_layernorm.weight.add_(torch.randn(D, generator=torch.Generator().manual_seed(2)) * 0.1)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        m = self.mlp(self.post_attention_layernorm(x))
        return m if self.v == "dropped_residual" else x + m


# -------------------------------------------------------------------------------- Encoder
class EncAttention(nn.Module):
    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.q, self.k, self.v_proj, self.o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x, pad):
        v = self.v
        b, t, _ = x.shape
        heads = lambda z: z.view(b, t, HEADS, HD).transpose(1, 2)   # noqa: E731
        q, k, val = heads(self.q(x)), heads(self.k(x)), heads(self.v_proj(x))
        att = (k @ q.transpose(-2, -1)) if v == "swapped_operands" else (q @ k.transpose(-2, -1))
        if v != "missing_scale":
            att = att * (1.0 / math.sqrt(HD))
        if v == "clean_decomp":         # additive mask instead of masked_fill: same numbers
            att = att + pad[:, None, None, :].float() * -1e9
        else:
            att = att.masked_fill(pad[:, None, None, :], -1e9)
        att = dropout(F.softmax(att, dim=-2 if v == "wrong_axis" else -1), v)
        y = (att @ val).transpose(1, 2).reshape(b, t, D)
        return self.o(noop(y, v))


class EncoderLayer(nn.Module):
    """Post-LN (BERT) layer."""

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.attn = EncAttention(v)
        self.ln1 = nn.LayerNorm(D, eps=EPS_BUG if v == "wrong_eps" else 1e-5)
        self.ff1, self.act, self.ff2 = nn.Linear(D, 2 * D), Act("gelu_tanh" if v == "gelu_tanh" else "clean_same"), nn.Linear(2 * D, D)
        self.ln2 = nn.LayerNorm(D)

    def forward(self, x, pad):
        x = self.ln1(x + self.attn(x, pad))
        f = self.ff2(self.act(self.ff1(x)))
        return self.ln2(f if self.v == "dropped_residual" else x + f)


class Encoder(nn.Module):
    """Padding mask from lengths, one encoder layer, mean pool over the valid tokens."""

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.layer = EncoderLayer(v)

    def forward(self, x, lengths):
        pos = torch.arange(x.shape[1])[None, :]
        pad = pos > lengths[:, None] if self.v == "off_by_one" else pos >= lengths[:, None]
        h = self.layer(x, pad)
        keep = (~pad).float()[..., None]
        return (h * keep).sum(1) / keep.sum(1)


# ------------------------------------------------------------------------------- Upsample
class UpNet(nn.Module):
    """conv, transposed conv (x2), nearest upsample (x2), conv, crop the border."""

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.conv_in = nn.Conv2d(3, 8, 3, padding=1)
        self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.conv_out = nn.Conv2d(8, 3, 3, padding=1, padding_mode="replicate" if v == "padding_mode" else "zeros")

    def forward(self, x):
        h = self.up(F.relu(self.conv_in(x)))
        if self.v == "clean_decomp":
            h = h.repeat_interleave(2, dim=-1).repeat_interleave(2, dim=-2)
        else:
            h = F.interpolate(h, scale_factor=2, mode="nearest")
        y = self.conv_out(noop(h, self.v))
        return y[:, :, 1:, 1:] if self.v == "off_by_one" else y[:, :, :-1, :-1]


# ------------------------------------------------------------------------------------ MoE
class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class MoE(nn.Module):
    """Top-2 of 4 experts per token, gate weights renormalised; experts run densely and are
    weighted (zero for unselected ones); residual around the layer."""

    E, K = 4, 2

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.router = nn.Linear(D, self.E, bias=False)
        self.experts = nn.ModuleList([Expert() for _ in range(self.E)])

    def forward(self, x):
        v = self.v
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        with autocast_bf16(v == "bf16_op"):
            logits = self.router(flat)
        logits = logits.float()
        if v == "clean_decomp":
            e = torch.exp(logits - logits.amax(-1, keepdim=True))
            probs = e / e.sum(-1, keepdim=True)
        else:
            probs = F.softmax(logits, dim=0 if v == "wrong_axis" else -1)
        w, idx = probs.topk(self.K, dim=-1)
        if v == "swapped_operands":
            w = w.sum(-1, keepdim=True) / w
        elif v != "missing_scale":
            w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        order = range(self.E - 1, -1, -1) if v == "clean_reorder" else range(self.E)
        for e_i in order:
            sel = idx == ((e_i + 1) % self.E if v == "off_by_one" else e_i)
            coef = (w * sel).sum(-1, keepdim=True)
            out = out + self.experts[e_i](flat) * coef
        out = noop(out, v).reshape(b, t, d)
        return out if v == "dropped_residual" else x + out


# ------------------------------------------------------------------------------------ RNN
class RNNNet(nn.Module):
    """LSTM -> GRU (with a residual) -> head on the last time step."""

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.lstm = nn.LSTM(8, D, batch_first=True)
        self.gru = nn.GRU(D, D, batch_first=True)
        self.head = nn.Linear(D, 4)

    def forward(self, x):
        h, _ = self.lstm(x)
        h = noop(h, self.v)
        g, _ = self.gru(h)
        if self.v != "dropped_residual":
            g = g + h
        return self.head(g[:, -2] if self.v == "off_by_one" else g[:, -1])


# -------------------------------------------------------------------------------- In-place
class InplaceNet(nn.Module):
    """An MLP written with in-place ops: mul_, relu_, add_, item assignment, clamp_."""

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, D), nn.Linear(D, D), nn.Linear(D, 4)

    def forward(self, x):
        v = self.v
        h = self.fc1(x)
        if v == "clean_decomp":           # the same, out of place
            h = F.relu(h * 0.5)
        else:
            if v == "wrong_scale":
                h.mul_(0.25)
            elif v != "missing_scale":
                h.mul_(0.5)
            h.relu_()
        r = self.fc2(noop(h, v))
        if v != "dropped_residual":
            r.add_(h)
        r[:, 1 if v == "off_by_one" else 0] = 0.0
        r.clamp_(-1.0, 1.0)
        m = h.mean(-1, keepdim=True)
        r = torch.sub(m, r) if v == "swapped_operands" else torch.sub(r, m)
        return self.fc3(r)


# --------------------------------------------------------------------------------- Losses
LOSSES = ("mse", "ce", "smooth_l1", "kl")


def _reductions(kind: str) -> Tuple[str, ...]:
    return ("batchmean", "mean", "sum", "none") if kind == "kl" else ("mean", "sum", "none")


def _loss_fn(kind: str, o: torch.Tensor, y: torch.Tensor, reduction: str) -> torch.Tensor:
    """torch's own loss function of `kind` (what a user calls)."""
    if kind == "mse":
        return F.mse_loss(o, y, reduction=reduction)
    if kind == "ce":
        return F.cross_entropy(o, y, reduction=reduction)
    if kind == "smooth_l1":
        return F.smooth_l1_loss(o, y, reduction=reduction, beta=1.0)
    return F.kl_div(F.log_softmax(o, -1), F.softmax(y, -1), reduction=reduction)


def _loss_by_hand(kind: str, o: torch.Tensor, y: torch.Tensor, reduction: str) -> torch.Tensor:
    """The same loss written out (clean_decomp), one reduction per call as the function runs it."""
    if kind == "ce":
        each = -F.log_softmax(o, -1).gather(1, y[:, None]).squeeze(1)
    elif kind == "kl":
        p = F.softmax(y, -1)
        each = p * (torch.log(p) - F.log_softmax(o, -1))
    else:
        d = o - y
        each = d * d if kind == "mse" else torch.where(d.abs() < 1.0, 0.5 * d * d, d.abs() - 0.5)
    if reduction == "none":
        return each
    if reduction == "batchmean":
        return each.sum() / o.shape[0]
    return each.mean() if reduction == "mean" else each.sum()


class LossNet(nn.Module):
    """A linear head and the framework's loss function of one kind, once per reduction, summed
    into the loss (the family's ``loss="output"``): the loss's own decomposition (torch's one
    call, MindSpore's primitives) is what the compare sees."""

    def __init__(self, kind: str, v: str):
        super().__init__()
        self.kind, self.v = kind, v
        self.fc = nn.Linear(8, 5)

    def forward(self, x, y):
        o = self.fc(x)
        loss = _loss_by_hand if self.v == "clean_decomp" else _loss_fn
        wrong = {"mean": "sum"} if self.v == "wrong_reduction" else {}    # a sum where a mean was meant
        parts = tuple(loss(self.kind, o, y, wrong.get(r, r)) for r in _reductions(self.kind))
        total = parts[0]
        for part in parts[1:]:
            total = total + (part if part.dim() == 0 else part.mean())
        return total


# ------------------------------------------------------------------------------- Tiny LM
VOCAB = 32
ROPE_THETA = 10000.0


class TinyLM(nn.Module):
    """A decoder LM as small checkpoints ship it: token embedding tied to the LM head, one
    pre-LN block with rotary attention (cos/sin made from an inv_freq buffer and positions that
    start at the KV cache's length), a causal mask, and a label-smoothed cross-entropy (the
    family's loss is its output)."""

    def __init__(self, v: str):
        super().__init__()
        self.v = v
        self.wte = nn.Embedding(VOCAB, D)
        self.ln, self.ln_f = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        if v != "untied_weights":             # the bug: the head keeps a copy of its own
            self.lm_head.weight = self.wte.weight
        theta = 500000.0 if v == "rope_theta" else ROPE_THETA
        self.register_buffer("inv_freq", 1.0 / (theta ** (torch.arange(0, HD, 2).float() / HD)), persistent=False)

    def rotate(self, x, cos, sin):
        x1, x2 = x[..., :HD // 2], x[..., HD // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def forward(self, ids, labels):
        v = self.v
        b, t = ids.shape
        x = self.wte(ids)
        heads = lambda z: z.view(b, t, HEADS, HD).transpose(1, 2)   # noqa: E731
        q, k, val = (heads(z) for z in self.qkv(self.ln(x)).split(D, dim=-1))
        # kv_offset: the queries' positions start after a cache of one token the keys do not hold
        # (shifting both would cancel: rotary scores depend on the distance only)
        past = 1 if v == "kv_offset" else 0
        tables = []
        for start in dict.fromkeys((past, 0)):
            freqs = torch.outer(torch.arange(start, start + t).float(), self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            tables.append((emb.cos(), emb.sin()))
        q, k = self.rotate(q, *tables[0]), self.rotate(k, *tables[-1])
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD))
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=2 if v == "wrong_mask" else 1)
        att = att.masked_fill(future, -1e9)             # wrong_mask: each token also sees the next one
        y = (F.softmax(att, dim=-1) @ val).transpose(1, 2).reshape(b, t, D)
        x = x + self.o(noop(y, v))
        logits = self.lm_head(self.ln_f(x))
        smoothing = 0.1 if v == "label_smoothing" else 0.0
        return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), label_smoothing=smoothing)


LOSS_SCALE = 1024.0


def tiny_lm_backward(model: nn.Module, v: str, loss: torch.Tensor) -> None:
    """The training loop's own work between the loss and the optimizer: an fp16-style static
    loss scale (scaled backward, gradients unscaled) and gradient clipping by norm. Bugs:
    loss_scale unscales by another scale than it scaled with; clip_value clips each gradient
    element by value where golden clips the gradients' total norm."""
    (loss * LOSS_SCALE).backward()
    unscale = 1.0 / (LOSS_SCALE * (2 if v == "loss_scale" else 1))
    params = [p for p in model.parameters() if p.grad is not None]
    for p in params:
        p.grad.mul_(unscale)
    if v == "clip_value":
        torch.nn.utils.clip_grad_value_(params, 0.01)
    else:
        torch.nn.utils.clip_grad_norm_(params, 0.05)


# ----------------------------------------------------------------------- transformers models
def _hf_bert(v: str):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=64, hidden_size=D, num_hidden_layers=2, num_attention_heads=HEADS,
                     intermediate_size=2 * D, max_position_embeddings=16, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, layer_norm_eps=EPS_BUG if v == "wrong_eps" else 1e-12,
                     hidden_act="gelu_pytorch_tanh" if v == "gelu_tanh" else "gelu",
                     initializer_range=0.3)         # O(1) activations: a GELU approximation is visible
    cfg._attn_implementation = "sdpa" if v == "clean_decomp" else "eager"
    torch.manual_seed(0)
    model = BertModel(cfg, add_pooling_layer=False)
    if v == "bf16_op":
        _autocast_forward(model.encoder.layer[1].output.dense)
    return _HFWrap(model, v, kind="bert")


def _hf_llama(v: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=D, intermediate_size=2 * D, num_hidden_layers=2,
                      num_attention_heads=HEADS, num_key_value_heads=1, max_position_embeddings=32,
                      rms_norm_eps=1e-3 if v == "wrong_eps" else 1e-6)
    cfg._attn_implementation = "sdpa" if v == "clean_decomp" else "eager"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    if v == "bf16_op":
        _autocast_forward(model.model.layers[0].mlp.down_proj)
    return _HFWrap(model, v, kind="llama")


def _autocast_forward(module: nn.Module) -> None:
    """Run this one module's forward under bfloat16 autocast (the bf16_op bug)."""
    plain = module.forward

    def forward(*a, **k):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return plain(*a, **k)
    module.forward = forward


class _HFWrap(nn.Module):
    """Calls a transformers model the way its users do; off_by_one passes positions 1..T
    (a caller's off-by-one). Not a module level of its own: the family model IS ``hf``."""

    def __init__(self, hf: nn.Module, v: str, kind: str):
        super().__init__()
        self.hf, self.v, self.kind = hf, v, kind

    def forward(self, ids, mask):
        t = ids.shape[1]
        kw = {"position_ids": torch.arange(1, t + 1)[None].expand(ids.shape[0], t)} if self.v == "off_by_one" else {}
        if self.kind == "bert":
            return self.hf(input_ids=ids, attention_mask=mask, **kw).last_hidden_state
        return self.hf(input_ids=ids, attention_mask=mask, labels=ids, **kw).loss


# ----------------------------------------------------------------------------- the families
@dataclass
class Family:
    name: str
    make: Callable[[str], nn.Module]
    inputs: Callable[[], Tuple[np.ndarray, ...]]
    cases: Dict[str, Optional[Place]]
    edits: Dict[str, WeightEdit] = field(default_factory=dict)
    loss: str = "mse"                          # mse: to a fixed random target; ce: cross-entropy; output: out is the loss
    ms_variants: Tuple[str, ...] = ()          # variants that have a MindSpore port ("clean_port" = faithful)
    ms_places: Dict[str, Place] = field(default_factory=dict)   # where the port's bug differs from torch's
    description: str = ""
    backward: Optional[Callable[[nn.Module, str, torch.Tensor], None]] = None   # loss -> gradients (default .backward())

    def variants(self):
        return list(self.cases)


def _randn(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _ids(seed, vocab=32, shape=(B, T)):
    return np.random.default_rng(seed).integers(0, vocab, size=shape).astype(np.int64)


CLEAN = lambda *kinds: {f"clean_{k}": None for k in kinds}   # noqa: E731
LIN = "linear"

FAMILIES: Dict[str, Family] = {}


def _family(f: Family) -> None:
    FAMILIES[f.name] = f


_family(Family(
    "mlp", MLP, lambda: (_randn((4, 8), 10),),
    cases={"transposed_weight": P("fc2", LIN, param=True),
           "perturbed_weight": P("fc1", LIN, param=True),
           "gelu_tanh": P("act", "gelu"),
           "bf16_op": P("fc2", (LIN, "downcast")),
           "dropped_residual": P("", "add"),
           "custom_backward": P("act2", ("mul", "sub"), direction="backward"),
           "nondeterministic": P("", "dropout"),
           "perturbed_input": P(("", "fc1"), LIN, param=True),
           **CLEAN("same", "noop", "decomp", "noise")},
    edits={"transposed_weight": WeightEdit("fc2.weight", "transpose"),
           "perturbed_weight": WeightEdit("fc1.weight", "perturb")},
    ms_variants=("clean_port", "transposed_weight", "perturbed_weight", "gelu_tanh", "dropped_residual",
                 "clean_noop"),
    description="residual MLP: fc1 GELU, fc2 custom-backward tanh + skip, fc3"))

_family(Family(
    "cnn", CNN, lambda: (_randn((2, 3, 8, 8), 11),),
    cases={"transposed_weight": P("conv2", "conv", param=True),
           "perturbed_weight": P("conv1", "conv", param=True),
           "wrong_eps": P("bn1", "batch_norm"),
           "padding_mode": P("conv1", ("pad", "conv")),
           "wrong_axis": P("", "mean"),
           "custom_backward": P("act2", ("mul", "sub", "add"), direction="backward"),
           "silu_approx": P("act2", ("silu", "sigmoid", "mul")),
           "nondeterministic": P("", "dropout"),
           "perturbed_input": P(("", "conv1"), "conv", param=True),
           **CLEAN("same", "noop", "decomp", "noise")},
    edits={"transposed_weight": WeightEdit("conv2.weight", "transpose"),
           "perturbed_weight": WeightEdit("conv1.weight", "perturb")},
    ms_variants=("clean_port", "transposed_weight", "perturbed_weight", "wrong_eps", "padding_mode",
                 "wrong_axis"),
    # nn.Conv2d of MindSpore has no reflect mode: the port pads in the model's code, then convolves
    ms_places={"padding_mode": P(("", "conv1"), ("pad", "conv"))},
    description="conv-BatchNorm-ReLU, conv-BatchNorm-custom swish, mean pool, head"))

_ATTN_MISSING = ("mul", "mask", "softmax")
_family(Family(
    "gpt_block", GPTBlockModel, lambda: (_randn((B, T, D), 12, 0.05),),
    cases={"wrong_eps": P("ln_1", "layer_norm"),
           "transposed_weight": P("attn.c_proj", LIN, param=True),
           "cancelled_weight_row": P("mlp.c_fc", LIN, param=True),
           "missing_scale": P("attn", _ATTN_MISSING),
           "wrong_scale": P("attn", "mul"),
           "gelu_tanh": P("mlp.act", "gelu"),
           "wrong_axis": P("attn", "softmax"),
           "dropped_residual": P("", "add"),
           "swapped_operands": P("attn", "matmul"),
           "off_by_one": P("attn", "mask"),
           "bf16_op": P("mlp.c_fc", (LIN, "downcast")),
           "nondeterministic": P("attn", "dropout"),
           "perturbed_input": P(("", "ln_1"), "layer_norm", param=True),
           **CLEAN("same", "noop", "decomp", "noise", "reorder")},
    edits={"transposed_weight": WeightEdit("attn.c_proj.weight", "transpose"),
           "cancelled_weight_row": WeightEdit("mlp.c_fc.weight", "cancel_row")},
    ms_variants=("clean_port", "wrong_eps", "transposed_weight", "cancelled_weight_row", "missing_scale",
                 "gelu_tanh", "wrong_axis", "dropped_residual", "swapped_operands", "off_by_one", "clean_noop"),
    description="GPT-2 pre-LN block: LayerNorm, causal attention (fused qkv), GELU MLP"))

_family(Family(
    "gpt", GPT, lambda: (_ids(13), _ids(14)),
    cases={"off_by_one": P(("", "wpe"), ("Torch.arange", "embedding")),
           "perturbed_weight": P("h.1.attn.c_attn", LIN, param=True),
           "transposed_weight": P("h.0.attn.c_proj", LIN, param=True),
           "cancelled_weight_row": P("h.1.mlp.c_fc", LIN, param=True),
           "wrong_eps": P("ln_f", "layer_norm"),
           "dropped_residual": P("h.1", "add"),
           "missing_scale": P("h.1.attn", _ATTN_MISSING),
           "swapped_operands": P("h.1.attn", "matmul"),
           **CLEAN("same", "noop", "decomp", "reorder")},
    edits={"perturbed_weight": WeightEdit("h.1.attn.c_attn.weight", "perturb"),
           "transposed_weight": WeightEdit("h.0.attn.c_proj.weight", "transpose"),
           "cancelled_weight_row": WeightEdit("h.1.mlp.c_fc.weight", "cancel_row")},
    loss="ce",
    description="2-block GPT with token/position embeddings, ln_f, lm head, cross-entropy"))

_family(Family(
    "llama_block", LlamaBlock, lambda: (_randn((B, T, D), 15, 0.05),),
    cases={"wrong_eps": P("input_layernorm", ("add", "rsqrt")),
           "wrong_axis": P("input_layernorm", "mean"),
           "off_by_one": P("self_attn", ("index", "cat")),
           "swapped_operands": P("self_attn", "cat"),
           "missing_scale": P("self_attn", _ATTN_MISSING),
           "transposed_weight": P("self_attn.o_proj", LIN, param=True),
           "perturbed_weight": P("mlp.down_proj", LIN, param=True),
           "bf16_op": P("mlp.up_proj", (LIN, "downcast")),
           "dropped_residual": P("", "add"),
           "silu_approx": P("mlp", "silu"),
           "nondeterministic": P("mlp", "dropout"),
           "perturbed_input": P(("", "input_layernorm"), ("pow", "mul", "add"), param=True),
           **CLEAN("same", "noop", "decomp", "decomp_silu", "reorder")},
    edits={"transposed_weight": WeightEdit("self_attn.o_proj.weight", "transpose"),
           "perturbed_weight": WeightEdit("mlp.down_proj.weight", "perturb")},
    ms_variants=("clean_port", "wrong_eps", "wrong_axis", "off_by_one", "swapped_operands", "missing_scale",
                 "transposed_weight", "perturbed_weight", "dropped_residual"),
    description="Llama block: RMSNorm, rotary attention, SwiGLU MLP"))

_family(Family(
    "encoder", Encoder, lambda: (_randn((B, T, D), 16, 0.05), np.array([5, 3], dtype=np.int64)),
    cases={"off_by_one": P("", "mask"),
           "wrong_axis": P("layer.attn", "softmax"),
           "wrong_eps": P("layer.ln1", "layer_norm"),
           "missing_scale": P("layer.attn", _ATTN_MISSING),
           "transposed_weight": P("layer.attn.o", LIN, param=True),
           "cancelled_weight_row": P("layer.ff1", LIN, param=True),
           "dropped_residual": P("layer", "add"),
           "swapped_operands": P("layer.attn", "matmul"),
           "gelu_tanh": P("layer.act", "gelu"),
           "nondeterministic": P("layer.attn", "dropout"),
           "perturbed_input": P(("", "layer", "layer.attn", "layer.attn.q"), LIN, param=True),
           **CLEAN("same", "noop", "decomp")},
    edits={"transposed_weight": WeightEdit("layer.attn.o.weight", "transpose"),
           "cancelled_weight_row": WeightEdit("layer.ff1.weight", "cancel_row")},
    ms_variants=("clean_port", "off_by_one", "wrong_axis", "wrong_eps", "missing_scale", "transposed_weight",
                 "cancelled_weight_row", "dropped_residual", "gelu_tanh"),
    description="post-LN encoder layer with a key padding mask (lengths 5 and 3), masked mean pool"))

_family(Family(
    "upsample", UpNet, lambda: (_randn((2, 3, 4, 4), 17),),
    cases={"padding_mode": P("conv_out", ("pad", "conv")),
           "transposed_weight": P("up", "conv", param=True),
           "perturbed_weight": P("conv_in", "conv", param=True),
           "off_by_one": P("", "index"),
           "perturbed_input": P(("", "conv_in"), "conv", param=True),
           **CLEAN("same", "noop", "decomp")},
    edits={"transposed_weight": WeightEdit("up.weight", "transpose"),
           "perturbed_weight": WeightEdit("conv_in.weight", "perturb")},
    description="conv, ConvTranspose2d x2, nearest upsample x2, conv, crop of the last row/column"))

_family(Family(
    "moe", MoE, lambda: (_randn((B, T, D), 18),),
    cases={"wrong_axis": P("", "softmax"),
           "missing_scale": P("", ("div", "sum", "mul")),
           "swapped_operands": P("", "div"),
           "off_by_one": P("", ("Tensor.__eq__",)),
           "perturbed_weight": P("router", LIN, param=True),
           "bf16_op": P("router", (LIN, "downcast")),
           "dropped_residual": P("", "add"),
           "perturbed_input": P(("", "router"), (LIN, "Tensor.reshape"), param=True),   # x.reshape consumes it first
           **CLEAN("same", "noop", "decomp", "reorder")},
    edits={"perturbed_weight": WeightEdit("router.weight", "perturb")},
    ms_variants=("clean_port", "wrong_axis", "missing_scale", "swapped_operands", "off_by_one",
                 "perturbed_weight", "dropped_residual"),
    description="top-2 of 4 router (softmax, topk, renormalise), dense experts, residual"))

_family(Family(
    "rnn", RNNNet, lambda: (_randn((B, T, 8), 19),),
    cases={"off_by_one": P("", "index"),
           "transposed_weight": P("lstm", "lstm", param=True),
           "perturbed_weight": P("gru", "gru", param=True),
           "dropped_residual": P("", "add"),
           "perturbed_input": P(("", "lstm"), "lstm", param=True),
           **CLEAN("same", "noop")},
    edits={"transposed_weight": WeightEdit("lstm.weight_hh_l0", "swap_blocks"),
           "perturbed_weight": WeightEdit("gru.weight_ih_l0", "perturb")},
    description="LSTM then GRU with a skip, head on the last step"))

_family(Family(
    "inplace", InplaceNet, lambda: (_randn((4, 8), 20),),
    cases={"missing_scale": P("", ("mul", "relu")),
           "wrong_scale": P("", "mul"),
           "dropped_residual": P("", ("add", "index")),
           "off_by_one": P("", "index"),
           "swapped_operands": P("", "sub"),
           "perturbed_weight": P("fc2", LIN, param=True),
           **CLEAN("same", "noop", "decomp")},
    edits={"perturbed_weight": WeightEdit("fc2.weight", "perturb")},
    description="MLP with in-place mul_, relu_, add_, item assignment, clamp_"))

_family(Family(
    "hf_bert", _hf_bert, lambda: (_ids(21, 64, (B, 6)), np.array([[1] * 6, [1] * 4 + [0] * 2], dtype=np.int64)),
    cases={"wrong_eps": P("hf.embeddings.LayerNorm", "layer_norm"),
           "gelu_tanh": P("hf.encoder.layer.0.intermediate.intermediate_act_fn", "gelu"),
           "cancelled_weight_row": P("hf.encoder.layer.0.intermediate.dense", LIN, param=True),
           "transposed_weight": P("hf.encoder.layer.1.attention.self.query", LIN, param=True),
           "perturbed_weight": P("hf.encoder.layer.0.attention.output.dense", LIN, param=True),
           "bf16_op": P("hf.encoder.layer.1.output.dense", (LIN, "downcast")),
           # positions 1..T made by the caller (the family's own forward): its arange, or the
           # model's first use of them
           "off_by_one": P(("", "hf.embeddings", "hf.embeddings.position_embeddings"),
                           ("Torch.arange", "embedding", "index")),
           **CLEAN("same", "decomp")},
    edits={"cancelled_weight_row": WeightEdit("hf.encoder.layer.0.intermediate.dense.weight", "cancel_row"),
           "transposed_weight": WeightEdit("hf.encoder.layer.1.attention.self.query.weight", "transpose"),
           "perturbed_weight": WeightEdit("hf.encoder.layer.0.attention.output.dense.weight", "perturb")},
    description="transformers BertModel from a tiny BertConfig (eager attention), padded batch"))

_family(Family(
    "hf_llama", _hf_llama, lambda: (_ids(22, 64, (B, 6)), np.array([[1] * 6, [1] * 6], dtype=np.int64)),
    cases={"wrong_eps": P("hf.model.layers.0.input_layernorm", ("add", "rsqrt")),
           "perturbed_weight": P("hf.model.layers.1.self_attn.o_proj", LIN, param=True),
           "bf16_op": P("hf.model.layers.0.mlp.down_proj", (LIN, "downcast")),
           **CLEAN("same", "decomp")},
    edits={"perturbed_weight": WeightEdit("hf.model.layers.1.self_attn.o_proj.weight", "perturb")},
    loss="output",
    description="transformers LlamaForCausalLM from a tiny LlamaConfig (GQA, eager attention), LM loss"))

for _kind in LOSSES:
    _family(Family(
        f"loss_{_kind}", lambda v, k=_kind: LossNet(k, v),
        (lambda k=_kind: (_randn((4, 8), 23), np.array([0, 2, 1, 4], dtype=np.int64) if k == "ce"
                          else _randn((4, 5), 24))),
        cases={"wrong_reduction": P("", "loss"), **CLEAN("same", "decomp")},
        loss="output", ms_variants=("clean_port", "clean_port_cells"),
        description=f"linear head and the {_kind} loss function with each reduction (torch's one call, "
                    f"MindSpore's primitives)"))

_family(Family(
    "tiny_lm", TinyLM, lambda: (_ids(25, VOCAB), _ids(26, VOCAB)),
    cases={"wrong_mask": P("", "mask"),
           "kv_offset": P("", "rotary"),
           "rope_theta": P("", ("rotary",)),
           "label_smoothing": P("", "loss"),
           "untied_weights": P(("", "wte", "lm_head"), ("embedding", LIN), param=True),
           "loss_scale": P(OUTSIDE, "mul"),
           "clip_value": P(OUTSIDE, ("clamp", "Torch._foreach_clamp*", "Tensor.clamp_*", "Torch.clamp_*")),
           **CLEAN("same", "noop")},
    loss="output", backward=tiny_lm_backward,
    description="decoder LM: tied embedding/head, rotary attention, causal mask, label-smoothed loss; a loss "
                "scale and gradient clipping in the training step"))
