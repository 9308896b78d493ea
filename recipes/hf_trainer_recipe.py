"""Hugging Face Trainer recipe: dump steps of `Trainer.train` with `PrecisionDumpCallback`.

A one-layer GPT-2 (random weights, config built locally, nothing downloaded) trains for 4
optimizer steps with gradient accumulation 2 on random token ids; the steps listed in
configs/statistics_mix.yaml (0 and 1) are dumped, each with both micro-batches' forward and
backward and one parameters_grad per module. Runs on CPU.

    python recipes/hf_trainer_recipe.py [--dump-path DIR] [--bf16] [--torch-compile]

The three lines a user adds are marked (1) (2) (3).
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from ts_core.compare import summarize, summary_text  # `tsprobe summary`
from ts_integrations.transformers import PrecisionDumpCallback               # (1)

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, os.pardir, "configs", "statistics_mix.yaml")


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 32, length: int = 16, vocab: int = 97):
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=97, n_positions=32,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump-path", default=os.path.join("dump_output", "hf_trainer"))
    p.add_argument("--output-dir", default=None, help="Trainer output dir (default: a temporary one)")
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (CPU autocast)")
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--torch-compile", action="store_true", help="TrainingArguments(torch_compile=True)")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=args.output_dir or tmp, use_cpu=True, max_steps=args.max_steps,
            per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=1e-3,
            bf16=args.bf16, save_strategy="no", report_to=[], disable_tqdm=True, logging_steps=1,
            torch_compile=args.torch_compile)
        dump = PrecisionDumpCallback(config_path=CONFIG, dump_path=args.dump_path)  # (2)
        trainer = Trainer(model=tiny_gpt2(), args=targs, train_dataset=RandomTokens(),
                          callbacks=[dump])                                     # (3)
        trainer.train()
        if trainer.is_world_process_zero():
            print(f"hf trainer recipe: {trainer.state.global_step} optimizer steps; "
                  f"dumped to {args.dump_path}")
            print(summary_text(summarize(args.dump_path)))


if __name__ == "__main__":
    main()
