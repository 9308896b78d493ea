"""`make demo`: dump a tiny GPT-2 for 3 training steps (mix level, statistics, steps 0-2)
twice -- once as written, once with a bug injected (LayerNorm eps of block 1 changed, as a
sloppy port might do) -- then compare the two dumps and name the first op that diverged.
Runs on CPU with random weights; nothing is downloaded."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from ts_core import PrecisionDebugger, seed_all


def build_model() -> GPT2LMHeadModel:
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                     bos_token_id=0, eos_token_id=0, loss_type="ForCausalLMLoss")
    return GPT2LMHeadModel(cfg)


def train(dump_path: str, steps: int = 3, bug: bool = False) -> PrecisionDebugger:
    seed_all(1234, rm_dropout=True)
    model = build_model()
    if bug:
        model.transformer.h[1].ln_2.eps = 1e-2    # the injected migration bug
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 256, (4, 32))
    debugger = PrecisionDebugger(dump_path=dump_path, task="statistics", level="mix", step=[0, 1, 2])
    for step in range(steps):
        debugger.start(model)                       # the three lines a user adds:
        loss = model(input_ids=data, labels=data).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()                             # (2)
        debugger.step()                             # (3)
        print(f"step {step}: loss {loss.item():.4f}")
    debugger.close()
    return debugger


def describe(dump_path: str) -> None:
    for step in sorted(os.listdir(dump_path)):
        for rank in sorted(os.listdir(os.path.join(dump_path, step))):
            folder = os.path.join(dump_path, step, rank)
            with open(os.path.join(folder, "dump.json"), encoding="utf-8") as f:
                data = json.load(f)["data"]
            kinds = {"module": 0, "api": 0, "backward": 0, "parameters_grad": 0}
            for key in data:
                if "parameters_grad" in key:
                    kinds["parameters_grad"] += 1
                    continue
                if ".backward" in key:
                    kinds["backward"] += 1
                kinds["module" if key.startswith("Module.") else "api"] += 1
            print(f"  {folder}: {len(data)} records "
                  f"({kinds['module']} module, {kinds['api']} API, of which {kinds['backward']} backward; "
                  f"{kinds['parameters_grad']} parameters_grad)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="demo_output", help="folder for the dumps (replaced)")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    golden = os.path.join(args.out, "gpt2_golden")
    target = os.path.join(args.out, "gpt2_eps_bug")
    t0 = time.time()
    print("== run 1: golden")
    train(golden)
    print("== run 2: LayerNorm eps of transformer.h.1.ln_2 changed to 1e-2")
    train(target, bug=True)
    print(f"\nDumps written in {time.time() - t0:.1f}s:")
    describe(golden)
    describe(target)

    from ts_core.compare import compare

    print("\n== tsprobe compare golden target")
    result = compare(golden, target, os.path.join(args.out, "compare"))
    first = result.first_divergence
    print(f"\nFirst divergence: {first.key if first else 'none'}")
    print(f"Report: {os.path.abspath(result.report_path)}")


if __name__ == "__main__":
    main()
