"""Hugging Face PrecisionDumpCallback on real `Trainer.train` runs with tiny local models."""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from ts_core import PrecisionDebugger  # noqa: E402
from ts_integrations.transformers import PrecisionDumpCallback  # noqa: E402

from ..core.models import tiny_gpt2  # noqa: E402
from ._helpers import SpyDebugger, keys_like, param_grad_keys, records, step_dirs  # noqa: E402


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 1)

    def forward(self, x, labels=None):
        out = self.fc2(torch.relu(self.fc1(x)))
        return {"loss": F.mse_loss(out, labels), "logits": out}


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n: int = 64, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 16):
        self.ids = torch.randint(0, 97, (n, 12), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def targs(tmp_path, **kw) -> TrainingArguments:
    opts = dict(output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=4, max_steps=4,
                learning_rate=0.1, report_to=[], save_strategy="no", disable_tqdm=True, logging_steps=1,
                dataloader_num_workers=0, max_grad_norm=0.0)
    opts.update(kw)
    return TrainingArguments(**opts)


class Recorder(TrainerCallback):
    """Logs the Trainer's events (placed after the dump callback) and whether the root model
    carries a forward hook at each step begin."""

    def __init__(self, events):
        self.events = events
        self.hooked = {}

    def on_step_begin(self, args, state, control, model=None, **kw):
        self.events.append("on_step_begin")
        self.hooked[state.global_step] = bool(model._forward_pre_hooks)

    def on_substep_end(self, args, state, control, **kw):
        self.events.append("on_substep_end")

    def on_pre_optimizer_step(self, args, state, control, **kw):
        self.events.append("on_pre_optimizer_step")

    def on_optimizer_step(self, args, state, control, **kw):
        self.events.append("on_optimizer_step")

    def on_step_end(self, args, state, control, **kw):
        self.events.append("on_step_end")


def test_exact_hook_order_with_accumulation(tmp_path, dump_root):
    events: list = []
    dbg = SpyDebugger(events, dump_path=dump_root, level="mix", step=[1, 3])
    rec = Recorder(events)
    Trainer(model=Regressor(), args=targs(tmp_path, gradient_accumulation_steps=2), train_dataset=Pairs(),
            callbacks=[PrecisionDumpCallback(debugger=dbg), rec]).train()
    idle = ["on_step_begin", "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end"]

    def dumped(n):      # start at each forward, stop at the end of each backward
        return ["on_step_begin", f"start{n}", "stop", "on_substep_end", f"start{n}", "stop",
                "on_pre_optimizer_step", "on_optimizer_step", f"step{n}", "on_step_end"]

    assert events == idle + dumped(1) + idle + dumped(3)
    # outside the configured steps no hook of ours is on the model
    assert rec.hooked == {0: False, 1: True, 2: False, 3: True}
    dbg.close()


def test_only_configured_steps_and_everything_restored(tmp_path, dump_root):
    linear = F.linear
    model = Regressor()
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[1, 3])
    Trainer(model=model, args=targs(tmp_path, max_steps=5), train_dataset=Pairs(), callbacks=[cb]).train()
    assert step_dirs(dump_root) == ["step1", "step3"]
    assert cb.dumped_steps == [1, 3]
    for step in (1, 3):
        data = records(dump_root, step)
        assert keys_like(data, "Module.fc1.Linear.forward.") == ["Module.fc1.Linear.forward.0"]
        assert param_grad_keys(data) == ["Module.fc1.Linear.parameters_grad.0", "Module.fc2.Linear.parameters_grad.0"]
    assert F.linear is linear
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert not model.fc1._forward_pre_hooks and not model.fc1.weight._post_accumulate_grad_hooks


def test_accumulation_two_forwards_one_parameters_grad_before_clipping(tmp_path, dump_root):
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[1, 3])
    trainer = Trainer(model=Regressor(), args=targs(tmp_path, gradient_accumulation_steps=2, max_grad_norm=1e-3),
                      train_dataset=Pairs(), callbacks=[cb])
    trainer.train()
    reported = {h["step"]: h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h}
    for step in (1, 3):
        data = records(dump_root, step)
        assert keys_like(data, "Module.fc1.Linear.forward.") == ["Module.fc1.Linear.forward.0",
                                                                 "Module.fc1.Linear.forward.1"]
        assert len(keys_like(data, "Module.fc1.Linear.backward.")) == 2
        assert len(param_grad_keys(data)) == 2
        # the norm of the recorded gradients is the (pre-clipping) norm the Trainer reports
        total = math.sqrt(sum(s[0]["Norm"] ** 2 for k in param_grad_keys(data) for s in data[k].values()))
        assert total == pytest.approx(reported[step + 1], rel=1e-4)
        assert total > 100 * 1e-3
        # nothing after the backward: no isnan/isinf of the loss, no clipping, no optimizer
        apis = {k.split(".")[1] for k in data if not k.startswith("Module.")}
        assert not apis & {"isnan", "isinf", "__iadd__", "_foreach_norm", "stack", "add_", "mul_"}, apis


def test_bf16_mixed_precision(tmp_path, dump_root):
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[0])
    Trainer(model=Regressor(), args=targs(tmp_path, bf16=True, max_steps=1, gradient_accumulation_steps=2),
            train_dataset=Pairs(), callbacks=[cb]).train()
    data = records(dump_root, 0)
    assert data["Functional.linear.0.forward"]["output"][0]["dtype"] == "torch.bfloat16"
    assert data["Module.fc1.Linear.parameters_grad.0"]["weight"][0]["dtype"] == "torch.float32"
    assert len(keys_like(data, "Module.fc2.Linear.forward.")) == 2


def test_gpt2_mix_level(tmp_path, dump_root):
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[1])
    model = tiny_gpt2()
    Trainer(model=model, args=targs(tmp_path, max_steps=2, learning_rate=1e-3, gradient_accumulation_steps=2),
            train_dataset=Tokens(), callbacks=[cb]).train()
    data = records(dump_root, 1)
    assert len(keys_like(data, "Module.transformer.h.0.attn.GPT2Attention.forward.")) == 2
    assert "Module.transformer.h.1.mlp.c_fc.Conv1D.parameters_grad.0" in data
    assert data["Module.transformer.wte.Embedding.parameters_grad.0"]["weight"][0]["shape"] == [97, 32]


def test_resume_from_checkpoint_keeps_step_numbers(tmp_path, dump_root):
    run1 = tmp_path / "run"
    Trainer(model=Regressor(), args=targs(run1, max_steps=2, save_strategy="steps", save_steps=2),
            train_dataset=Pairs(), callbacks=[PrecisionDumpCallback(dump_path=dump_root, step=[1, 3])]).train()
    assert step_dirs(dump_root) == ["step1"]
    first = records(dump_root, 1)
    ckpt = str(run1 / "out" / "checkpoint-2")
    assert os.path.isdir(ckpt)
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[1, 3])
    Trainer(model=Regressor(), args=targs(run1, max_steps=4, save_strategy="steps", save_steps=2),
            train_dataset=Pairs(), callbacks=[cb]).train(resume_from_checkpoint=ckpt)
    assert step_dirs(dump_root) == ["step1", "step3"]
    assert records(dump_root, 1) == first
    assert cb.dumped_steps == [3]
    assert keys_like(records(dump_root, 3), "Module.fc1.Linear.forward.") == ["Module.fc1.Linear.forward.0"]


def eval_args(tmp_path):
    return targs(tmp_path, eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=4,
                 gradient_accumulation_steps=2)


def test_evaluation_not_dumped_by_default(tmp_path, dump_root):
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[2])
    Trainer(model=Regressor(), args=eval_args(tmp_path), train_dataset=Pairs(), eval_dataset=Pairs(8, seed=1),
            callbacks=[cb]).train()
    assert len(keys_like(records(dump_root, 2), "Module.fc1.Linear.forward.")) == 2


def test_evaluation_dumped_with_dump_eval(tmp_path, dump_root):
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[2], dump_eval=True)
    trainer = Trainer(model=Regressor(), args=eval_args(tmp_path), train_dataset=Pairs(),
                      eval_dataset=Pairs(8, seed=1), callbacks=[cb])
    trainer.train()
    # evaluation after optimizer step 1 runs at global_step 2: 2 eval batches, then step 2's training
    data = records(dump_root, 2)
    assert len(keys_like(data, "Module.fc1.Linear.forward.")) == 4
    assert keys_like(data, "Module.fc1.Linear.backward.") == ["Module.fc1.Linear.backward.2",
                                                              "Module.fc1.Linear.backward.3"]
    # a standalone evaluate() afterwards, at global_step 4, is not a configured step
    trainer.evaluate()
    assert step_dirs(dump_root) == ["step2"]


def test_standalone_evaluate_with_dump_eval(tmp_path, dump_root):
    linear = F.linear
    cb = PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[0], dump_eval=True)
    trainer = Trainer(model=Regressor(), args=targs(tmp_path, per_device_eval_batch_size=4),
                      eval_dataset=Pairs(12, seed=1), callbacks=[cb])
    trainer.evaluate()
    data = records(dump_root, 0)
    assert len(keys_like(data, "Module.fc1.Linear.forward.")) == 3
    assert not keys_like(data, "Module.fc1.Linear.backward.") and not param_grad_keys(data)
    assert F.linear is linear                  # the callback's debugger was closed after evaluate()


def test_user_debugger_and_constructor_errors(tmp_path, dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0, 9])
    Trainer(model=Regressor(), args=targs(tmp_path, max_steps=1), train_dataset=Pairs(),
            callbacks=[PrecisionDumpCallback(debugger=dbg)]).train()
    assert "Functional.linear.0.forward" in records(dump_root, 0)
    dbg.current_step = 9                       # still open: the user may go on using it
    dbg.start()
    torch.ones(1).mul(2)
    dbg.step()
    assert step_dirs(dump_root) == ["step0", "step9"]
    with pytest.raises(ValueError, match="not both"):
        PrecisionDumpCallback(debugger=dbg, dump_path=dump_root)
    with pytest.raises(TypeError, match="PrecisionDebugger"):
        PrecisionDumpCallback(debugger=object())


def test_module_import_is_light():
    import subprocess
    import sys

    code = ("import sys, ts_integrations.transformers as m; "
            "print(sorted(x for x in ('transformers', 'torch') if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_callback_implements_every_trainer_event(dump_root):
    """Trainer dispatches by name (getattr(callback, event)); the callback does not derive from
    TrainerCallback, so it must have each event, and leave `control` alone (return None)."""
    import inspect

    import ts_integrations.transformers as module
    from ts_integrations import hf_generate

    events = sorted(n for n in dir(TrainerCallback) if n.startswith("on_"))
    assert len(events) >= 16
    cb = PrecisionDumpCallback(dump_path=dump_root, step=[5])
    state = transformers.TrainerState()
    for name in events:
        assert callable(getattr(PrecisionDumpCallback, name, None)), name
        assert getattr(cb, name)(None, state, transformers.TrainerControl(), model=None) is None, name
    assert inspect.isclass(PrecisionDumpCallback) and PrecisionDumpCallback.__module__ == module.__name__
    assert "__getattr__" not in vars(module)            # nothing built at run time
    assert module.generate_with_dump is hf_generate.generate_with_dump
    assert cb.dumped_steps == [] and not os.path.exists(dump_root)


def test_config_dump_eval_is_honoured_and_the_keyword_wins(tmp_path, dump_root):
    config = tmp_path / "config.yaml"
    config.write_text(f"dump_path: {dump_root}\nlevel: mix\nstep: [0]\ndump_eval: true\n")
    trainer_args = targs(tmp_path, per_device_eval_batch_size=4)
    cb = PrecisionDumpCallback(config_path=str(config))
    Trainer(model=Regressor(), args=trainer_args, eval_dataset=Pairs(8, seed=1), callbacks=[cb]).evaluate()
    assert len(keys_like(records(dump_root, 0), "Module.fc1.Linear.forward.")) == 2
    off = str(tmp_path / "off")
    cb = PrecisionDumpCallback(config_path=str(config), dump_path=off, dump_eval=False)
    Trainer(model=Regressor(), args=trainer_args, eval_dataset=Pairs(8, seed=1), callbacks=[cb]).evaluate()
    assert not os.path.exists(off)


@pytest.mark.slow
def test_torch_compile_trainer_with_the_callback_is_bit_identical(tmp_path, dump_root):
    """``TrainingArguments(torch_compile=True)``: the callback's step-window hooks on the compiled
    model run at a graph break at its edge, never traced (traced, they ran the debugger on fake
    tensors and dynamo failed); the trained weights equal the run without the callback, bit for
    bit, and both configured steps are dumped with the parameter gradients (compile_mode
    boundaries: the modules inside the compiled model are not hooked)."""
    def train(callbacks):
        torch._dynamo.reset()
        model = Regressor()
        Trainer(model=model, args=targs(tmp_path, torch_compile=True, max_steps=3), train_dataset=Pairs(),
                callbacks=callbacks).train()
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    plain = train([])
    with_tool = train([PrecisionDumpCallback(dump_path=dump_root, level="mix", step=[0, 1])])
    assert plain.keys() == with_tool.keys() and all(torch.equal(plain[k], with_tool[k]) for k in plain)
    for step in (0, 1):
        data = records(dump_root, step)
        assert {"Module.fc1.Linear.parameters_grad.0", "Module.fc2.Linear.parameters_grad.0"} <= set(data)
        assert data["Module.fc1.Linear.parameters_grad.0"]["weight"][0]["shape"] == [8, 4]
