"""`make demo`: a PyTorch -> MindSpore migration, debugged.

One small transformer block (LayerNorm, attention, GELU; recipes/demo_models.py) is written in
PyTorch and ported to MindSpore with the same weights. Each trains two steps with tsprobe
dumping every module and API call (level mix, the level users dump at; full tensors):

- PyTorch: a plain training loop with ``PrecisionDebugger`` start/stop/step;
- MindSpore: ``Model.train`` with the ``MsprobeStep`` callback, twice: a faithful port, and
  the port as a hurried migration writes it (``nn.LayerNorm`` keeps MindSpore's default
  epsilon 1e-7 where torch uses 1e-5).

``ts_core.compare.compare`` then pairs the torch dump with each MindSpore dump by data flow
(``Module.attn.q.Linear`` <-> ``Cell.attn.q.Dense``, LayerNorm ``weight`` <-> ``gamma``, torch's
``F.linear`` <-> the Reshape + MatMul + BiasAdd that ``nn.Dense`` runs, ``F.mse_loss`` <-> sub +
square; calls one side runs alone, such as MindSpore's Shape/Reshape or torch's optimizer
updates, cannot raise a divergence): the faithful port passes, the buggy one is pinned to the
LayerNorm of ``ln1``, and report.html is written. Then (``--no-gpt2`` skips it) the same-framework demo: a tiny GPT-2
dumped twice, once with a LayerNorm eps changed, compared. CPU only, nothing downloaded.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
T0 = time.time()


def say(msg: str) -> None:
    print(f"[{time.time() - T0:5.1f}s] {msg}", flush=True)


# ------------------------------------------------------------------- cross-framework part
def train_torch(dump_path: str) -> None:
    import torch

    from demo_models import batches, torch_block
    from ts_core import PrecisionDebugger

    model = torch_block(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(dump_path=dump_path, task="tensor", level="mix", step=[0, 1])
    for step, (x, y) in enumerate(batches()):
        debugger.start(model)                                   # the three lines a user adds
        loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
        say(f"  torch step {step}: loss {loss.item():.6f}")
    debugger.close()


def train_mindspore(dump_path: str, port_bug=None) -> None:
    import mindspore as ms
    import mindspore.dataset as ds
    import numpy as np
    from mindspore import nn
    from mindspore.train import LossMonitor, Model

    from demo_models import batches, copy_weights, mindspore_block, torch_block
    from ts_core import PrecisionDebugger
    from ts_integrations.mindspore import MsprobeStep

    net = mindspore_block(port_bug)
    copy_weights(torch_block(seed=0), net)                      # same initial weights as torch
    data = batches()
    xs = np.concatenate([x for x, _ in data])
    ys = np.concatenate([y for _, y in data])
    dataset = ds.NumpySlicesDataset({"x": xs, "y": ys}, shuffle=False).batch(len(data[0][0]))
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.1))
    debugger = PrecisionDebugger(dump_path=dump_path, task="tensor", level="mix", step=[0, 1])
    model.train(1, dataset, callbacks=[MsprobeStep(debugger), LossMonitor(1)], dataset_sink_mode=False)
    debugger.close()


def cross_framework(out: str) -> None:
    import mindspore as ms
    from ts_core.backends.mindspore.numpy_init import init_numpy_quietly

    from ts_core.compare import compare

    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    init_numpy_quietly()           # MindSpore's NumPy-1.x message under NumPy 2 (harmless here)
    torch_dump = os.path.join(out, "torch")
    faithful = os.path.join(out, "mindspore_faithful")
    buggy = os.path.join(out, "mindspore_wrong_eps")

    say("== 1/3 PyTorch: transformer block, 2 SGD steps (plain loop + PrecisionDebugger)")
    train_torch(torch_dump)
    say("== 2/3 MindSpore port, same weights, 2 steps (Model.train + MsprobeStep)")
    say("  faithful port:")
    train_mindspore(faithful)
    say("  port with MindSpore's default nn.LayerNorm epsilon (1e-7 instead of torch's 1e-5):")
    train_mindspore(buggy, port_bug="wrong_eps")

    say("== 3/3 tsprobe compare TORCH_DUMP MS_DUMP")
    ok = compare(torch_dump, faithful, os.path.join(out, "compare_faithful"), verbose=False)
    if ok.first_divergence is not None or ok.verdict == "error":
        raise SystemExit(f"demo: the faithful port should pass, got {ok.verdict}: {ok.first_divergence}")
    rows = ok.rows
    matched = [r for r in rows if r.golden_key and r.target_key]
    n_pass = sum(r.verdict == "pass" for r in matched)
    say(f"  torch vs faithful port: {sum(p.counts['matched'] for p in ok.pairs)} calls paired over "
        f"{len(ok.pairs)} steps, {n_pass}/{len(matched)} values pass, first divergence: "
        f"{ok.first_divergence.key if ok.first_divergence else 'none'}")
    example = next((r for r in matched if r.target_key and ".ln1.LayerNorm.forward" in r.target_key
                    and r.arg == "parameters.weight"), None)
    if example:
        say(f"  e.g. {example.golden_key} {example.arg} <-> {example.target_key} (gamma): {example.verdict}")

    say("  torch vs port with the wrong epsilon:")
    result = compare(torch_dump, buggy, os.path.join(out, "compare_wrong_eps"))
    fd = result.first_divergence
    print()
    if fd is None or ".ln1." not in f"{fd.key} {fd.module}":
        raise SystemExit(f"demo: the wrong epsilon should be named at ln1's LayerNorm, got {fd}")
    say(f"FIRST DIVERGENCE: {fd.key}  <->  {fd.target_key}   (step {fd.step}, {fd.direction}, in {fd.module})")
    print(f"    {fd.reason}")
    print(f"    cause: {fd.cause}")
    if fd.source:
        print(f"    source: {fd.source}")
    say(f"Report: {os.path.abspath(result.report_path)}")


# -------------------------------------------------------------- same-framework part (GPT-2)
def gpt2(out: str) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from ts_core import PrecisionDebugger, seed_all
    from ts_core.compare import compare

    def train(dump_path: str, bug: bool) -> None:
        seed_all(1234, rm_dropout=True)
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                         bos_token_id=0, eos_token_id=0, loss_type="ForCausalLMLoss")
        model = GPT2LMHeadModel(cfg)
        if bug:
            model.transformer.h[1].ln_2.eps = 1e-2
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.randint(0, 256, (4, 32))
        debugger = PrecisionDebugger(dump_path=dump_path, task="statistics", level="mix", step=[0, 1])
        for step in range(2):
            debugger.start(model)
            loss = model(input_ids=data, labels=data).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            debugger.stop()
            debugger.step()
        debugger.close()

    say("== GPT-2 (same framework): dumped twice, LayerNorm eps of transformer.h.1.ln_2 changed to 1e-2")
    golden, target = os.path.join(out, "gpt2_golden"), os.path.join(out, "gpt2_eps_bug")
    train(golden, False)
    train(target, True)
    result = compare(golden, target, os.path.join(out, "gpt2_compare"), verbose=False)
    fd = result.first_divergence
    say(f"  first divergence: {fd.key if fd else 'none'}")
    say(f"  report: {os.path.abspath(result.report_path)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo_output", help="folder for dumps and reports (replaced)")
    parser.add_argument("--no-gpt2", action="store_true", help="skip the same-framework GPT-2 part")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    say("loading PyTorch and MindSpore ...")
    cross_framework(args.out)
    if not args.no_gpt2:
        print()
        gpt2(args.out)
    say("done")


if __name__ == "__main__":
    main()
