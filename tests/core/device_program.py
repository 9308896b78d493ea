"""One GPT-2 training step dumped by tsprobe, the same program on any device and thread: the
workload of issue 37's CPU-vs-CUDA comparison (dropout, deterministic algorithms, AdamW and
gradient clipping inside the dumped step), small. Run as a script it dumps every configuration
given as JSON on the command line (a subprocess, so ``TSPROBE_NATIVE`` can be set for it):
``python -m tests.core.device_program ROOT '[[name, level, mode, dropout, det, threaded, device, foreach], ...]'``.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from typing import Optional

import torch

STEPS = 2


def gpt2(dropout: float, device: str = "cpu"):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=97, n_positions=32, resid_pdrop=dropout,
                     embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=0, eos_token_id=0,
                     loss_type="ForCausalLMLoss")
    model = GPT2LMHeadModel(cfg).to(device)
    model.train()
    return model


def dump_step(root: str, level: str, mode: str, dropout: float, deterministic: bool, threaded: bool = False,
              device: str = "cpu", foreach: Optional[bool] = None) -> dict:
    """Train STEPS steps of the tiny GPT-2 (AdamW with `foreach`, clipping), the last one dumped
    at `level` in `mode` (statistics, md5, tensor); `threaded`: ``loss.backward()`` runs on a
    thread of its own, as autograd runs it on CUDA. Returns the loss and the gradients (before
    clipping: as the dump records them), on the host."""
    from ts_core import PrecisionDebugger

    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        model = gpt2(dropout, device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)
        x = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(1)).to(device)
        task = "tensor" if mode == "tensor" else "statistics"
        kwargs = {"summary_mode": mode} if mode == "md5" else {}
        dbg = PrecisionDebugger(dump_path=root, level=level, task=task, step=[STEPS - 1], **kwargs)
        torch.manual_seed(2)          # dropout's stream: the same on every run of one device
        for _ in range(STEPS):
            dbg.start(model)
            loss = model(input_ids=x, labels=x).loss
            if threaded:
                failed = []
                t = threading.Thread(target=lambda: _backward(loss, failed))
                t.start()
                t.join()
                assert not failed, failed
            else:
                loss.backward()
            grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            dbg.stop()
            dbg.step()
        dbg.close()
        return {"loss": loss.detach().cpu(), "grads": grads}
    finally:
        torch.use_deterministic_algorithms(before)


def _backward(loss: torch.Tensor, failed: list) -> None:
    try:
        loss.backward()
    except BaseException as e:        # reported by the caller's assert
        failed.append(repr(e))


if __name__ == "__main__":
    torch.set_num_threads(1)
    out_root = sys.argv[1]
    results = {}
    for name, level, mode, dropout, det, threaded, device, foreach in json.loads(sys.argv[2]):
        got = dump_step(os.path.join(out_root, name), level, mode, dropout, det, threaded, device, foreach)
        results[name] = {"loss": got["loss"].item()}
    print(json.dumps(results))
