"""The models of the mindtorch tests, written once against the torch API: the same file runs on
real PyTorch (the main venv) and on mindtorch (``.venv-mindtorch``, where ``import torch``
resolves to mindtorch). Weights cross between the two as a ``.npz`` of named parameters;
inputs are built with numpy (``torch.manual_seed`` does not make mindtorch's ``randn``
reproducible)."""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ = 97, 12
MODELS = ("toy", "embed", "gpt2", "llama")
# tests/mindspore/ports.py's torch models (the clean-pair corpus of issue 25), trained with F.mse_loss
PORTS = ("mlp", "cnn", "transformer")
PORT_OUT = {"mlp": (4, 4), "cnn": (2, 5), "transformer": (2, 5, 16)}


class Net(nn.Module):
    """Seed 002's example network (two Linear layers and a ReLU) with a GELU, a LayerNorm and a
    residual add between them."""

    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(8, 4)
        self.norm = nn.LayerNorm(4)
        self.linear2 = nn.Linear(4, 2)

    def forward(self, x):
        x1 = self.linear1(x)
        h = self.norm(F.gelu(x1)) + x1
        return F.relu(self.linear2(h))


class Embed(nn.Module):
    """An embedding with a padding index (its row gets no gradient in torch) and a Linear head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 8, padding_idx=0)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.emb(ids))


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "sdpa"
    return GPT2LMHeadModel(cfg)


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                      bos_token_id=0, eos_token_id=0, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def port(name: str) -> Callable[[], nn.Module]:
    def build_port() -> nn.Module:
        from tests.mindspore import ports

        return ports.torch_model(name)
    return build_port


BUILD: Dict[str, Callable[[], nn.Module]] = {"toy": Net, "embed": Embed, "gpt2": tiny_gpt2, "llama": tiny_llama,
                                             **{name: port(name) for name in PORTS}}


def build(name: str) -> nn.Module:
    model = BUILD[name]()
    model.train()
    return model


def export_weights(model: nn.Module, path: str) -> None:
    np.savez(path, **{k: p.detach().numpy().copy() for k, p in model.named_parameters()})


def import_weights(model: nn.Module, path: str) -> None:
    """Set every parameter from `path`; the two transformers versions must name them alike."""
    with np.load(path) as saved:
        values = {k: saved[k] for k in saved.files}
    mine = dict(model.named_parameters())
    if set(mine) != set(values):
        raise AssertionError(f"parameter names differ: only here {sorted(set(mine) - set(values))}, "
                             f"only in {path}: {sorted(set(values) - set(mine))}")
    for k, p in mine.items():
        if tuple(p.shape) != values[k].shape:
            raise AssertionError(f"{k}: shape {tuple(p.shape)} here, {values[k].shape} in {path}")
    model.load_state_dict({k: torch.tensor(v) for k, v in values.items()}, strict=False)


def batch(name: str, step: int) -> Tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of `step` as numpy arrays."""
    rng = np.random.default_rng(100 + step)
    if name in PORTS:
        from tests.mindspore import ports

        return ports.make_input(name, seed=step), rng.standard_normal(PORT_OUT[name]).astype(np.float32)
    if name == "toy":
        return rng.standard_normal((10, 8)).astype(np.float32), rng.standard_normal((10, 2)).astype(np.float32)
    if name == "embed":
        ids = np.array([[0, 1, 2, 0, 3], [4, 0, 5, 1, 0]], np.int64)        # 0 is the padding index
        return ids, rng.standard_normal((2, 5, 3)).astype(np.float32)
    ids = rng.integers(0, VOCAB, (2, SEQ)).astype(np.int64)
    return ids, ids


def loss_of(name: str, model: nn.Module, x, y, save: Callable[[Any, str], None] = lambda value, name: None):
    """The training loss; `save(value, name)` sees the toy's output (debug-level ``save``)."""
    if name in PORTS:
        return F.mse_loss(model(x), y)
    if name in ("toy", "embed"):
        out = model(x)
        save(out, "out")
        return ((out - y) ** 2).mean()
    return model(input_ids=x, labels=y).loss


def write_weights(root: str, names: Tuple[str, ...] = MODELS) -> Dict[str, str]:
    """Random weights of each model in `names` (torch's own init, seed 0) as .npz under `root`."""
    paths = {}
    for name in names:
        torch.manual_seed(0)
        paths[name] = os.path.join(root, f"weights_{name}.npz")
        export_weights(build(name), paths[name])
    return paths
