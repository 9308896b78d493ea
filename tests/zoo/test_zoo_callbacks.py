"""The zoo check through the training-loop integrations: one optimizer step of Llama and BERT
under the Hugging Face ``Trainer`` and under Lightning, with and without the dump callback
(mix/tensor): loss, gradients and updated parameters bit-identical, every leaf module that ran
recorded, two dumped runs compare clean, and nothing left on the model or on torch."""
from __future__ import annotations

import importlib.util
from typing import Dict, List

import pytest
import torch

from ts_core.compare import compare
from ts_core.verdicts import PASS

from ..conftest import load_dump
from ..torch_state import hooks_on, surface_changes, torch_surface
from .harness import StepResult, differences, watch_leaves_of
from .models import BATCH, build
from .records import missing_leaf_records, rank_data

ARCHS = ["llama", "bert"]
LR = 1e-3


class Rows(torch.utils.data.Dataset):
    """The zoo batch as a dataset of single rows (one optimizer step = the whole batch)."""

    def __init__(self, batch: dict):
        self.batch = batch

    def __len__(self) -> int:
        return BATCH

    def __getitem__(self, i: int) -> dict:
        return {k: v[i] for k, v in self.batch.items()}


def _result(model, losses, grads, calls) -> StepResult:
    params = {n: p.detach() for n, p in model.named_parameters()}
    assert len(losses) == 1 and grads
    return StepResult(losses[0], grads, params, model, calls)


# -------------------------------------------------------------------- Hugging Face Trainer
def hf_step(arch: str, out_dir: str, dump_path=None) -> StepResult:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from ts_integrations.transformers import PrecisionDumpCallback

    model, batch = build(arch)
    grads: Dict[str, torch.Tensor] = {}
    losses: List[torch.Tensor] = []
    calls: Dict[str, List[bool]] = {}

    class Grab(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    handles = watch_leaves_of(model, calls)
    handles.append(model.register_forward_hook(lambda m, a, out: losses.append(out.loss.detach().clone())))
    callbacks = [PrecisionDumpCallback(dump_path=dump_path, level="mix", task="tensor", step=[0])] \
        if dump_path else []
    args = TrainingArguments(output_dir=out_dir, use_cpu=True, per_device_train_batch_size=BATCH, max_steps=1,
                             learning_rate=LR, optim="adamw_torch", lr_scheduler_type="constant",
                             report_to=[], save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                             max_grad_norm=0.0)
    Trainer(model=model, args=args, train_dataset=Rows(batch), callbacks=callbacks + [Grab()]).train()
    for h in handles:
        h.remove()
    return _result(model, losses, grads, calls)


# -------------------------------------------------------------------------------- Lightning
def lightning_step(arch: str, root: str, dump_path=None) -> StepResult:
    import lightning.pytorch as pl

    from ts_integrations.lightning import PrecisionDumpCallback

    model, batch = build(arch)
    grads: Dict[str, torch.Tensor] = {}
    losses: List[torch.Tensor] = []
    calls: Dict[str, List[bool]] = {}

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, b, batch_idx):
            loss = self.model(**b).loss
            losses.append(loss.detach().clone())
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=LR)

    class Grab(pl.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            grads.update({n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None})

    module = Module()          # the callback hooks the LightningModule: paths start with "model."
    handles = watch_leaves_of(module, calls)
    callbacks = [PrecisionDumpCallback(dump_path=dump_path, level="mix", task="tensor", step=[0])] \
        if dump_path else []
    trainer = pl.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, default_root_dir=root, callbacks=callbacks + [Grab()])
    torch.manual_seed(1)
    trainer.fit(module, torch.utils.data.DataLoader(Rows(batch), batch_size=BATCH))
    for h in handles:
        h.remove()
    return _result(module, losses, grads, calls)


RUNNERS = [pytest.param(hf_step, id="hf_trainer"),
           pytest.param(lightning_step, id="lightning", marks=pytest.mark.skipif(
               importlib.util.find_spec("lightning") is None, reason="needs lightning installed"))]


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("arch", ARCHS)
def test_callback_step_is_bit_identical_recorded_and_restored(runner, arch, tmp_path):
    ref = runner(arch, str(tmp_path / "ref"))
    before = torch_surface()
    dumps = []
    for name in ("a", "b"):
        got = runner(arch, str(tmp_path / f"run_{name}"), dump_path=str(tmp_path / name))
        assert differences(ref, got) == []
        assert hooks_on(got.model) == []
        assert surface_changes(before, torch_surface()) == []
        dumps.append(got)
    for name in ("a", "b"):       # every tensor file written (a tied weight's gradient too)
        header = load_dump(str(tmp_path / name / "step0" / "rank"))
        assert "incomplete" not in header, header.get("incomplete")
    data = rank_data(str(tmp_path / "a"))
    assert missing_leaf_records(data, dumps[0].model, dumps[0].calls) == []
    result = compare(tmp_path / "a", tmp_path / "b", verbose=False, html=False, workers=1)
    assert result.first_divergence is None and result.verdict == PASS, result.counts
