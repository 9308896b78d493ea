"""A Lightning fit under ``ModelParallelStrategy`` on 2 CPU processes (Lightning starts the second
itself): FSDP2 over the data-parallel mesh, or tensor parallel over the tensor-parallel one,
applied in ``configure_model`` as Lightning documents. With ``--dump`` the tsprobe callback
records it. Rank 0 writes the losses and the updated parameters (full tensors) to ``--out``.

    python lightning_worker.py --parallel fsdp2 --out result.npz [--dump DIR]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stack_worker import VOCAB, TinyLM, tp_plan  # noqa: E402


def main() -> None:
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    ap = argparse.ArgumentParser()
    ap.add_argument("--parallel", choices=["fsdp2", "tp"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dump", default=None)
    args = ap.parse_args()

    class LM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.lm = TinyLM()
            self.losses: list = []

        def configure_model(self) -> None:
            if args.parallel == "tp":
                tp_plan(self.lm, self.device_mesh["tensor_parallel"], sequence=False)
                return
            from torch.distributed.fsdp import fully_shard

            for block in self.lm.blocks:
                fully_shard(block, mesh=self.device_mesh["data_parallel"])
            fully_shard(self.lm, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch, batch_idx):
            tokens = batch[0]
            loss = F.cross_entropy(self.lm(tokens).flatten(0, 1), torch.roll(tokens, -1, 1).flatten())
            self.losses.append(loss.detach().clone())
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

        def on_train_end(self) -> None:
            full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().numpy().copy()
                    for n, p in self.named_parameters()}
            if self.global_rank == 0:
                np.savez(args.out, losses=np.array([x.item() for x in self.losses]), **full)

    callbacks = []
    if args.dump:
        from ts_integrations.lightning import PrecisionDumpCallback

        callbacks.append(PrecisionDumpCallback(debugger=None, dump_path=args.dump, task="statistics",
                                               level="mix", step=[0, 1]))
    dp, tp = (2, 1) if args.parallel == "fsdp2" else (1, 2)
    g = torch.Generator().manual_seed(7)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randint(0, VOCAB, (16, 8), generator=g)),
                                       batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=2, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                        strategy=ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp))
    trainer.fit(LM(), data)
    if torch.distributed.is_initialized():      # gloo's threads stopped before exit (an abort at exit otherwise)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
