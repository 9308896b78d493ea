"""Lightning PrecisionDumpCallback on real `Trainer.fit` runs with a tiny LightningModule."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("lightning.pytorch")

from ts_core import ConfigError, PrecisionDebugger  # noqa: E402
from ts_integrations.lightning import PrecisionDumpCallback  # noqa: E402

from ._helpers import ROOT, SpyDebugger, grad_norm, keys_like, param_grad_keys, records, step_dirs  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self, lr: float = 0.1):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 1)
        self.lr = lr

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)      # Lightning compares torch.mean identities across calls
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def loader(n: int = 32, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=4)


def trainer(tmp_path, callbacks, **kw) -> "pl.Trainer":
    opts = dict(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                limit_val_batches=0, default_root_dir=str(tmp_path / "lightning"))
    opts.update(kw)
    return pl.Trainer(callbacks=callbacks, **opts)


class Recorder(pl.Callback):
    """Logs the trainer's hooks into the shared event list (placed after the dump callback)."""

    HOOKS = ("on_train_batch_start", "on_after_backward", "on_before_optimizer_step", "on_train_batch_end")

    def __init__(self, events, grads=None):
        self.events = events
        self.grads = grads

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.events.append("on_train_batch_start")

    def on_after_backward(self, trainer, pl_module):
        self.events.append("on_after_backward")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.events.append("on_before_optimizer_step")
        if self.grads is not None:
            self.grads[trainer.global_step] = {"before_clip": pl_module.fc1.weight.grad.norm().item()}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.events.append("on_train_batch_end")
        done = trainer.global_step - 1             # the optimizer step this batch completed, if any
        if self.grads is not None and done in self.grads and "after_clip" not in self.grads[done]:
            self.grads[done]["after_clip"] = pl_module.fc1.weight.grad.norm().item()


def test_exact_hook_order_with_accumulation(tmp_path, dump_root):
    events: list = []
    dbg = SpyDebugger(events, dump_path=dump_root, level="mix", step=[1, 3])
    trainer(tmp_path, [PrecisionDumpCallback(debugger=dbg), Recorder(events)],
            accumulate_grad_batches=2).fit(Tiny(), loader())
    idle_micro = ["on_train_batch_start", "on_after_backward", "on_train_batch_end"]
    idle_last = ["on_train_batch_start", "on_after_backward", "on_before_optimizer_step", "on_train_batch_end"]

    def dumped(n):
        return (["start%d" % n, "on_train_batch_start", "stop", "on_after_backward", "on_train_batch_end",
                 "start%d" % n, "on_train_batch_start", "stop", "on_after_backward", "on_before_optimizer_step",
                 "step%d" % n, "on_train_batch_end"])

    assert events == idle_micro + idle_last + dumped(1) + idle_micro + idle_last + dumped(3)
    dbg.close()


def test_only_configured_steps_are_dumped_and_everything_is_restored(tmp_path, dump_root):
    linear = F.linear
    model = Tiny()
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[1, 3])
    trainer(tmp_path, [cb], max_steps=5).fit(model, loader())
    assert step_dirs(dump_root) == ["step1", "step3"]
    assert os.listdir(os.path.join(dump_root, "step1")) == ["rank"]
    assert cb.dumped_steps == [1, 3]
    for step in (1, 3):
        data = records(dump_root, step)
        assert keys_like(data, "Module.fc1.Linear.forward.") == ["Module.fc1.Linear.forward.0"]
        assert "Functional.linear.0.forward" in data
    # training went on past the last dumped step with every patch and hook removed
    assert F.linear is linear
    assert not model.fc1._forward_pre_hooks and not model.fc1._forward_hooks
    assert not model.fc1.weight._post_accumulate_grad_hooks


def test_accumulation_two_forwards_one_parameters_grad_and_nothing_but_forward_backward(tmp_path, dump_root):
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[1])
    trainer(tmp_path, [cb], accumulate_grad_batches=2).fit(Tiny(), loader())
    data = records(dump_root, 1)
    assert keys_like(data, "Module.fc1.Linear.forward.") == ["Module.fc1.Linear.forward.0",
                                                             "Module.fc1.Linear.forward.1"]
    assert keys_like(data, "Module.fc1.Linear.backward.") == ["Module.fc1.Linear.backward.0",
                                                              "Module.fc1.Linear.backward.1"]
    assert param_grad_keys(data) == ["Module.fc1.Linear.parameters_grad.0", "Module.fc2.Linear.parameters_grad.0"]
    # the micro-batches' forward/backward (training_step, self.log, Lightning's loss / 2) ...
    apis = {k.split(".")[1] for k in data if not k.startswith("Module.")}
    assert {"linear", "relu", "mse_loss", "__truediv__"} <= apis
    # ... and not the data loading (collate: torch.stack), the optimizer, zero_grad or clipping
    assert not apis & {"stack", "add_", "_foreach_add_", "zero_", "_foreach_norm", "mul_", "_foreach_mul_"}, apis


def test_parameters_grad_is_taken_before_clipping(tmp_path, dump_root):
    grads: dict = {}
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[1, 2])
    trainer(tmp_path, [cb, Recorder([], grads)], accumulate_grad_batches=2, gradient_clip_val=1e-4,
            max_steps=3).fit(Tiny(), loader())
    for step in (1, 2):
        recorded = grad_norm(records(dump_root, step), "Module.fc1.Linear.parameters_grad.0")
        assert recorded == pytest.approx(grads[step]["before_clip"], rel=1e-5)
        assert grads[step]["after_clip"] <= 1.01e-4 < recorded / 100   # clipping acted afterwards


def test_bf16_mixed_precision(tmp_path, dump_root):
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[0])
    trainer(tmp_path, [cb], precision="bf16-mixed", accumulate_grad_batches=2, max_steps=1).fit(Tiny(), loader())
    data = records(dump_root, 0)
    assert data["Functional.linear.0.forward"]["output"][0]["dtype"] == "torch.bfloat16"
    assert data["Module.fc1.Linear.parameters_grad.0"]["weight"][0]["dtype"] == "torch.float32"
    assert len(keys_like(data, "Module.fc2.Linear.forward.")) == 2


def test_resume_from_checkpoint_keeps_step_numbers(tmp_path, dump_root):
    ckpt = str(tmp_path / "two_steps.ckpt")
    first = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[1, 3])
    t1 = trainer(tmp_path, [first], max_steps=2)
    t1.fit(Tiny(), loader())
    t1.save_checkpoint(ckpt)
    assert step_dirs(dump_root) == ["step1"]
    step1 = records(dump_root, 1)

    second = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[1, 3])
    trainer(tmp_path, [second], max_steps=4).fit(Tiny(), loader(), ckpt_path=ckpt)
    assert step_dirs(dump_root) == ["step1", "step3"]
    assert records(dump_root, 1) == step1                  # untouched by the resumed run
    assert keys_like(records(dump_root, 3), "Module.fc1.Linear.forward.") == ["Module.fc1.Linear.forward.0"]
    assert second.dumped_steps == [1, 3]                    # carried in the callback's state_dict
    assert second.state_dict()["next_step"] == 4


def validating_trainer(tmp_path, cb, **kw):
    # 8 train batches per epoch; validation after every 4 of them = after optimizer step 1
    return trainer(tmp_path, [cb], accumulate_grad_batches=2, limit_val_batches=2, val_check_interval=4,
                   num_sanity_val_steps=2, **kw)


def test_validation_is_not_dumped_by_default(tmp_path, dump_root):
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[0, 2])
    validating_trainer(tmp_path, cb).fit(Tiny(), loader(), loader(8, seed=1))
    for step in (0, 2):
        data = records(dump_root, step)
        assert len(keys_like(data, "Module.fc1.Linear.forward.")) == 2
        assert len(keys_like(data, "Module.fc1.Linear.backward.")) == 2


def test_validation_dumped_with_dump_eval(tmp_path, dump_root):
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[0, 2], dump_eval=True)
    validating_trainer(tmp_path, cb).fit(Tiny(), loader(), loader(8, seed=1))
    # step 0: sanity-check batches are never dumped
    assert len(keys_like(records(dump_root, 0), "Module.fc1.Linear.forward.")) == 2
    # validation after optimizer step 1 runs at global_step 2: into step2, before its training
    data = records(dump_root, 2)
    assert len(keys_like(data, "Module.fc1.Linear.forward.")) == 4
    assert len(keys_like(data, "Module.fc1.Linear.backward.")) == 2
    assert keys_like(data, "Module.fc1.Linear.backward.") == ["Module.fc1.Linear.backward.2",
                                                              "Module.fc1.Linear.backward.3"]


def test_standalone_validate_with_dump_eval(tmp_path, dump_root):
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[0], dump_eval=True)
    trainer(tmp_path, [cb], limit_val_batches=3, inference_mode=False).validate(Tiny(), loader(12, seed=1))
    data = records(dump_root, 0)
    assert len(keys_like(data, "Module.fc1.Linear.forward.")) == 3
    assert not param_grad_keys(data) and not keys_like(data, "Module.fc1.Linear.backward.")


def test_eval_under_inference_mode(tmp_path, dump_root):
    """trainer.validate() runs under torch.inference_mode by default: inference tensors have no
    version counter, and are still recorded."""
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[0], dump_eval=True)
    run = trainer(tmp_path, [cb], limit_val_batches=2)
    run.validate(Tiny(), loader(8, seed=1))
    assert len(keys_like(records(dump_root, 0), "Module.fc1.Linear.forward.")) == 2


def test_yaml_config_and_overrides(tmp_path, dump_root):
    cb = PrecisionDumpCallback(config_path=os.path.join(ROOT, "configs", "statistics_L1.yaml"),
                               dump_path=dump_root, step=[2])
    assert cb.debugger.config.level == "L1" and cb.debugger.config.step == [2]
    trainer(tmp_path, [cb], max_steps=3).fit(Tiny(), loader())
    data = records(dump_root, 2)
    assert "Functional.linear.0.forward" in data and not keys_like(data, "Module.")


def test_user_debugger_is_not_closed(tmp_path, dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0, 1, 2, 3, 4, 5])
    trainer(tmp_path, [PrecisionDumpCallback(debugger=dbg)], max_steps=2).fit(Tiny(), loader())
    assert step_dirs(dump_root) == ["step0", "step1"]
    dbg.current_step = 5                                    # the user keeps using it
    dbg.start()
    torch.ones(2).add(1)
    dbg.step()
    assert "Torch.add.0.forward" in records(dump_root, 5) or "Tensor.add.0.forward" in records(dump_root, 5)
    dbg.close()


def test_constructor_errors(dump_root):
    with pytest.raises(ConfigError, match="level"):
        PrecisionDumpCallback(dump_path=dump_root, level="L9")
    with pytest.raises(ValueError, match="not both"):
        PrecisionDumpCallback(debugger=PrecisionDebugger(dump_path=dump_root), step=[1])


def test_works_with_the_pytorch_lightning_package(tmp_path, dump_root):
    ptl = pytest.importorskip("pytorch_lightning")

    class PtlTiny(ptl.LightningModule):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(4, 8)

        def training_step(self, batch, batch_idx):
            return self.fc1(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[1])
    assert isinstance(cb, ptl.Callback) and isinstance(cb, pl.Callback)
    ptl.Trainer(max_steps=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, callbacks=[cb],
                default_root_dir=str(tmp_path)).fit(PtlTiny(), loader())
    assert step_dirs(dump_root) == ["step1"]
    assert param_grad_keys(records(dump_root, 1)) == ["Module.fc1.Linear.parameters_grad.0"]


def test_self_log_is_not_recorded_and_the_module_is_left_as_found(tmp_path, dump_root):
    """self.log / self.log_dict inside training_step run Lightning's bookkeeping (squeeze, to,
    ...): not the model's computation, never recorded. After the fit the module's own log is back."""

    class Logs(Tiny):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log_dict({"a": loss * 1.0, "b": loss})
            return loss

    module = Logs()
    cb = PrecisionDumpCallback(dump_path=dump_root, level="L1", step=[1])
    trainer(tmp_path, [cb]).fit(module, loader())
    apis = {".".join(k.split(".")[:2]) for k in records(dump_root, 1)}
    # the model and the loss (and the `loss * 1.0` the user wrote) are recorded, logging is not
    assert {"Functional.linear", "Torch.relu", "Functional.mse_loss", "Tensor.__mul__"} <= apis, apis
    assert not apis & {"Tensor.squeeze", "Tensor.to"}, apis          # what Lightning's log calls here
    assert "log" not in module.__dict__ and "log_dict" not in module.__dict__
