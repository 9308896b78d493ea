"""`make demo`: dump a tiny GPT-2 for 3 training steps (mix level, statistics, steps 1 and 2)
and show what was written. Runs on CPU with random weights; nothing is downloaded."""
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


def train(dump_path: str, steps: int = 3) -> PrecisionDebugger:
    seed_all(1234, rm_dropout=True)
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 256, (4, 32))
    debugger = PrecisionDebugger(dump_path=dump_path, task="statistics", level="mix", step=[1, 2])
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
    dump_path = os.path.join(args.out, "gpt2_fp32")
    t0 = time.time()
    train(dump_path)
    print(f"\nDump written to {os.path.abspath(dump_path)} in {time.time() - t0:.1f}s:")
    describe(dump_path)


if __name__ == "__main__":
    main()
