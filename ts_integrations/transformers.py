"""Hugging Face transformers integrations.

This module holds two independent parts; each imports what it needs only when it is used
(``import ts_integrations.transformers`` itself loads neither transformers nor torch):

* ``PrecisionDumpCallback`` -- a ``transformers.TrainerCallback`` for ``Trainer`` training
  (section "Trainer callback" below).
* ``generate_with_dump`` / ``split_by_request`` -- token ranges for ``generate``, from
  ``hf_generate.py``.
"""
from __future__ import annotations

from typing import Any

__all__ = ["PrecisionDumpCallback", "generate_with_dump", "split_by_request"]


# ======================================================================================
# Trainer callback: PrecisionDumpCallback
# ======================================================================================
#
#     trainer = Trainer(model, args, train_dataset=ds,
#                       callbacks=[PrecisionDumpCallback(config_path="config.yaml")])
#
# One dump step is one optimizer step, numbered by ``state.global_step`` before the update
# (so resuming from a checkpoint continues the numbering). Hook order for a configured step
# with gradient_accumulation_steps=k:
#
#   on_step_begin             arm the step: hook the root model (forward pre/post hooks)
#   k times:
#     model forward begins    start(model)         (root forward pre-hook)
#     ... loss, backward ...
#     backward ends           stop()               (autograd end-of-backward callback, queued
#                                                   after DDP's own gradient all-reduce)
#       on the last micro-batch (accelerate's sync_gradients): parameters_grad := .grad --
#       accumulated and all-reduced, before HF's unscale+clip (with fp16 GradScaler the
#       gradients are still multiplied by the loss scale: HF unscales inside
#       clip_grad_norm_, with no callback between backward and clipping)
#     on_substep_end          (k-1 times; stop() again if still collecting)
#   clip_grad_norm_, on_pre_optimizer_step, optimizer.step(), on_optimizer_step
#   on_step_end               step(); root-model hooks removed
#
# Outside configured steps the callback does a set lookup per event and no hook of ours is
# on the model. Evaluation / prediction is recorded only with dump_eval=True: each forward of
# the model in eval mode (or without grad) into the folder of the current state.global_step;
# then the root-model hooks stay on the model from Trainer creation on (two flag checks per
# forward outside configured steps), so that trainer.evaluate() before or after train() is
# recorded too.

def _build_trainer_callback():
    import torch
    from transformers import TrainerCallback

    from ts_core import PrecisionDebugger

    from ._common import StepDriver, make_debugger

    try:
        from torch.autograd import Variable

        _queue_callback = Variable._execution_engine.queue_callback
    except (ImportError, AttributeError):        # pragma: no cover - every supported torch has it
        _queue_callback = None

    def _sync_gradients() -> bool:
        try:
            from accelerate.state import GradientState

            return bool(GradientState().sync_gradients)
        except Exception:                       # no accelerate state: treat every backward as final
            return True

    def _grad_tensors(output: Any, out: list, depth: int = 0) -> list:
        if isinstance(output, torch.Tensor):
            if output.requires_grad:
                out.append(output)
        elif depth < 4 and isinstance(output, dict):
            for v in output.values():
                _grad_tensors(v, out, depth + 1)
        elif depth < 4 and isinstance(output, (list, tuple)):
            for v in output:
                _grad_tensors(v, out, depth + 1)
        return out

    class _RootWatch:
        """Forward pre/post hooks on the root model plus an end-of-backward callback."""

        def __init__(self, owner: "PrecisionDumpCallback"):
            self.owner = owner
            self.model = None
            self.handles: list = []
            self.queued = False

        def install(self, model: Any) -> None:
            if model is None or (self.model is model and self.handles):
                return
            self.remove()
            self.model = model
            self.handles = [model.register_forward_pre_hook(self._pre),
                            model.register_forward_hook(self._post, always_call=True)]

        def remove(self) -> None:
            for h in self.handles:
                h.remove()
            self.handles = []
            self.model = None
            self.queued = False

        def _pre(self, module, args):
            owner, drv = self.owner, self.owner._driver
            if module.training and torch.is_grad_enabled():
                if owner._armed is not None:
                    drv.begin(owner._armed, module)
            elif drv.dump_eval and owner._armed is None and owner._state is not None:
                drv.begin(owner._state.global_step, module)

        def _post(self, module, args, output):
            drv = self.owner._driver
            if not drv.in_window:
                return
            if not (module.training and torch.is_grad_enabled()):
                drv.pause()                     # eval forward: no backward follows
                return
            if _queue_callback is None:
                return                          # on_substep_end / on_pre_optimizer_step stop us
            for t in _grad_tensors(output, []):
                t.register_hook(self._on_output_grad)

        def _on_output_grad(self, grad):
            if not self.queued:
                self.queued = True
                _queue_callback(self._backward_finishing)
            return None

        def _backward_finishing(self) -> None:
            # runs when autograd finished this backward; queue once more so that we come
            # after callbacks queued meanwhile (DDP copies the all-reduced gradients there)
            _queue_callback(self._backward_done)

        def _backward_done(self) -> None:
            self.queued = False
            drv = self.owner._driver
            drv.pause()
            if self.owner._armed is not None and _sync_gradients():
                drv.capture_param_grads(self.model)

    class PrecisionDumpCallback(TrainerCallback):
        """Dump the configured training steps of a Hugging Face ``Trainer``.

        ``PrecisionDumpCallback(config_path=None, debugger=None, *, dump_eval=None, **overrides)``:
        `config_path` and keyword overrides (``dump_path=``, ``step=``, ``level=``, any
        ``PrecisionDebugger`` option) build a debugger that the callback owns and closes when
        training ends; or pass your own ``debugger=``. ``dump_eval=True`` also records
        evaluation (default: off, or the config's ``dump_eval`` where ts_core's config has that key).
        """

        def __init__(self, config_path=None, debugger=None, *, dump_eval=None, task=None,
                     dump_path=None, level=None, step=None, **overrides):
            handle = make_debugger(config_path, debugger, dict(task=task, dump_path=dump_path, level=level,
                                                               step=step, **overrides), type(self).__name__)
            self._driver = StepDriver(handle, dump_eval)
            self._watch = _RootWatch(self)
            self._armed = None          # the configured step being trained, between step begin/end
            self._state = None          # the Trainer's TrainerState (global_step for eval forwards)
            self._training = False

        @property
        def debugger(self) -> PrecisionDebugger:
            return self._driver.debugger

        @property
        def dumped_steps(self) -> list:
            return list(self._driver.dumped_steps)

        def on_init_end(self, args, state, control, model=None, **kwargs):
            self._state = state
            if self._driver.dump_eval:
                self._watch.install(model)

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self._state = state
            self._training = True
            if self._driver.dump_eval:
                self._watch.install(model)

        def on_step_begin(self, args, state, control, model=None, **kwargs):
            self._state = state
            step = state.global_step
            if not self._driver.collects(step):
                return
            if self._driver.open_step not in (None, step):
                self._driver.end_step()
            self._armed = step
            self._watch.install(model)

        def on_substep_end(self, args, state, control, **kwargs):
            if self._armed is not None:
                self._driver.pause()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if self._armed is not None:
                self._driver.pause()

        def on_step_end(self, args, state, control, **kwargs):
            if self._armed is None:
                return
            self._armed = None
            self._driver.end_step()
            if not self._driver.dump_eval:
                self._watch.remove()

        def _eval_done(self):
            self._driver.pause()
            if not self._training:       # a standalone evaluate()/predict(): nothing follows
                self._driver.finish()

        def on_evaluate(self, args, state, control, **kwargs):
            if self._driver.dump_eval:
                self._eval_done()

        def on_predict(self, args, state, control, metrics=None, **kwargs):
            if self._driver.dump_eval:
                self._eval_done()

        def on_train_end(self, args, state, control, **kwargs):
            self._training = False
            self._armed = None
            if not self._driver.dump_eval:   # with dump_eval, later evaluate() calls are recorded too
                self._watch.remove()
            self._driver.finish()

    PrecisionDumpCallback.__module__ = __name__
    return PrecisionDumpCallback


def __getattr__(name: str) -> Any:
    if name == "PrecisionDumpCallback":
        cls = _build_trainer_callback()
        globals()[name] = cls
        return cls
    if name in ("generate_with_dump", "split_by_request"):      # token ranges: hf_generate.py
        from . import hf_generate

        return getattr(hf_generate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# ======================================================================================
# end of the Trainer callback section
# ======================================================================================
