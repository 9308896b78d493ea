"""Tiny real models for the dump-core tests (built locally, random weights, no downloads)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class CNN(nn.Module):
    """Conv + BatchNorm + in-place ReLU + a functional in-place op, as real CNNs have."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.head = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        x = self.relu(self.bn(self.conv(x)))
        x = (x * 1.0).flatten(1)
        x.add_(0.5)                   # in-place on a view
        x = F.relu_(x * 2.0)          # functional in-place
        return self.head(x)


def tiny_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=97, n_positions=32,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                     loss_type="ForCausalLMLoss")
    model = GPT2LMHeadModel(cfg)
    model.train()
    return model


def make(name: str, seed: int = 0):
    torch.manual_seed(seed)
    if name == "mlp":
        return MLP(), torch.randn(5, 6)
    if name == "cnn":
        return CNN(), torch.randn(2, 3, 6, 6)
    if name == "gpt2":
        model = tiny_gpt2(seed)
        return model, torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(seed))
    raise ValueError(name)


def loss_of(name: str, model, x):
    if name == "gpt2":
        return model(input_ids=x, labels=x).loss
    return model(x).pow(2).mean()


def train_steps(name: str, debugger=None, steps: int = 2, seed: int = 0):
    """Run `steps` SGD steps; returns (losses, grads of the last step) for bit comparisons."""
    model, x = make(name, seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, grads = [], {}
    for _ in range(steps):
        if debugger is not None:
            debugger.start(model)
        loss = loss_of(name, model, x)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().clone())
        if debugger is not None:
            debugger.stop()
            debugger.step()
    return losses, grads
