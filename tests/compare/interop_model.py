"""A small torch program whose backward records differ in order between tsprobe and msprobe
(issue 25): F.linear on 2-D inputs (addmm: bias, input, weight^T), with and without a bias,
square and not; linear and matmul on 3-D inputs (a reshaped internal result); conv, layer_norm,
embedding, 2-D matmul; multi-output ops (split, max with indices). One step: forward, loss,
backward and an SGD step, all between start and stop. Run by tsprobe here and by msprobe in a
fresh process (``python interop_model.py msprobe CONFIG``)."""
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class InteropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.fc = nn.Linear(6, 6)                  # on a 3-D input
        self.conv = nn.Conv1d(3, 3, 3, padding=1)
        self.sq = nn.Linear(6, 6, bias=False)      # 2-D, square, no bias: weight^T has weight's shape
        self.wide = nn.Linear(6, 5, bias=False)    # 2-D, no bias
        self.head = nn.Linear(6, 4, bias=False)    # 3-D, no bias
        self.norm = nn.LayerNorm(4)

    def forward(self, idx):
        h = self.conv(self.fc(self.emb(idx)))     # [2, 3, 6]
        a, b = h.split(3, dim=-1)
        v, _ = torch.max(a, dim=-1)
        h = torch.cat([a * v.unsqueeze(-1), b], -1)
        h2 = F.linear(h[0], self.fc.weight, self.fc.bias)     # 2-D with bias
        h2 = self.sq(h2)
        m = torch.matmul(h2, h2.t()) + torch.matmul(h, h2.t()).sum(0)
        out = self.norm(self.head(h))
        return out.pow(2).mean() + m.mean() + self.wide(h2).mean()


def build():
    torch.manual_seed(0)
    return InteropNet(), torch.tensor([[1, 2, 3], [4, 5, 6]])


def one_step(debugger) -> None:
    model, idx = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger.start(model)
    loss = model(idx)
    loss.backward()
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()


def msprobe_dump(config_path: str) -> None:
    from msprobe.pytorch import PrecisionDebugger

    one_step(PrecisionDebugger(config_path=config_path))


if __name__ == "__main__" and sys.argv[1] == "msprobe":
    msprobe_dump(sys.argv[2])
