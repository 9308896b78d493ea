"""Lightning recipe: dump steps of a `Trainer.fit` with `PrecisionDumpCallback`.

A tiny regressor trains for 4 optimizer steps with gradient accumulation 2; the steps listed
in configs/statistics_mix.yaml (0 and 1) are dumped, each with both micro-batches' forward and
backward and one parameters_grad per module. Nothing is downloaded; runs on CPU.

    python recipes/lightning_recipe.py [--dump-path DIR] [--devices 2] [--precision bf16-mixed]

With --devices 2 it runs DDP on two CPU processes (gloo): step{N}/rank0 and step{N}/rank1.
The three lines a user adds are marked (1) (2) (3).
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:                                     # the older package name works too
    import pytorch_lightning as pl

from ts_core.compare import summarize, summary_text  # `tsprobe summary`
from ts_integrations.lightning import PrecisionDumpCallback                  # (1)

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, os.pardir, "configs", "statistics_mix.yaml")


class TinyRegressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dump-path", default=os.path.join("dump_output", "lightning"))
    p.add_argument("--devices", type=int, default=1, help="2: DDP on two CPU processes")
    p.add_argument("--precision", default="32-true", help="e.g. bf16-mixed")
    p.add_argument("--max-steps", type=int, default=4)
    args = p.parse_args(argv)

    pl.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    dump = PrecisionDumpCallback(config_path=CONFIG, dump_path=args.dump_path)  # (2)
    trainer = pl.Trainer(
        max_steps=args.max_steps, accumulate_grad_batches=2, gradient_clip_val=1.0,
        accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
        precision=args.precision, callbacks=[dump],                            # (3)
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=os.path.join(args.dump_path, os.pardir))
    trainer.fit(TinyRegressor(), DataLoader(data, batch_size=4))
    if trainer.global_rank == 0:
        print(f"lightning recipe: {trainer.global_step} optimizer steps; dumped to {args.dump_path}")
        print(summary_text(summarize(args.dump_path)))


if __name__ == "__main__":
    main()
