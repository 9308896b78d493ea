"""Hugging Face transformers integrations.

* ``PrecisionDumpCallback`` -- a callback for ``Trainer`` training (below).
* ``generate_with_dump`` / ``split_by_request`` -- token ranges for ``generate``, from
  ``hf_generate.py``.

``import ts_integrations.transformers`` loads neither transformers nor torch: the callback
implements the ``TrainerCallback`` protocol without deriving from it. ``Trainer`` dispatches
every event by name (``CallbackHandler.call_event`` calls ``getattr(callback, event)(args,
state, control, model=..., ...)`` and keeps ``control`` when the result is None), so a class
with every event method is a callback; torch is imported when the first hook goes on a model.

    trainer = Trainer(model, args, train_dataset=ds,
                      callbacks=[PrecisionDumpCallback(config_path="config.yaml")])

One dump step is one optimizer step, numbered by ``state.global_step`` before the update
(so resuming from a checkpoint continues the numbering). Hook order for a configured step
with gradient_accumulation_steps=k::

  on_step_begin             arm the step: hook the root model (forward pre/post hooks)
  k times:
    model forward begins    start(model)         (root forward pre-hook)
    ... loss, backward ...
    backward ends           stop()               (autograd end-of-backward callback, queued
                                                  after DDP's own gradient all-reduce)
      on the last micro-batch (accelerate's sync_gradients): parameters_grad := .grad --
      accumulated and all-reduced, before HF's unscale+clip (with fp16 GradScaler the
      gradients are still multiplied by the loss scale: HF unscales inside
      clip_grad_norm_, with no callback between backward and clipping)
    on_substep_end          (k-1 times; stop() again if still collecting)
  clip_grad_norm_, on_pre_optimizer_step, optimizer.step(), on_optimizer_step
  on_step_end               step(); root-model hooks removed

Outside configured steps the callback does a set lookup per event and no hook of ours is
on the model. Evaluation / prediction is recorded only with dump_eval (the keyword, else the
config's ``dump_eval``): each forward of the model in eval mode (or without grad) into the
folder of the current state.global_step; then the root-model hooks stay on the model from
Trainer creation on (two flag checks per forward outside configured steps), so that
trainer.evaluate() before or after train() is recorded too.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

from ts_core import PrecisionDebugger
from ts_core.model_hooks import ModelHook, hooks_of

from ._common import StepDriver, final_micro_batch, make_debugger, output_loss, training_forward
from .hf_generate import generate_with_dump, split_by_request

__all__ = ["PrecisionDumpCallback", "generate_with_dump", "split_by_request"]


class _RootWatch(ModelHook):
    """Forward pre/post hooks on the root model plus the end of its backward (the hook owner's
    ``backward_end``): the events the Trainer does not send (each micro-batch's forward start
    and backward end). A client of the model's hook owner."""

    def __init__(self, driver: StepDriver):
        self.driver = driver
        self.armed: Optional[int] = None   # the configured step being trained, between step begin/end
        self.state: Any = None             # the Trainer's TrainerState (global_step for eval forwards)
        self.model: Any = None
        self.handles: list = []
        self._backward_end: Any = None     # watches this model's backward (None: the framework can't tell)
        self.model_loss: Any = None        # monitor: this micro-batch's model-output loss, not yet given
        self.user_loss = False             # monitor: observe_loss() was called in this micro-batch

    def install(self, model: Any) -> None:
        if model is None or (self.model is model and self.handles):
            return
        self.remove()
        self.model = model
        owner = hooks_of(model)
        self._backward_end = owner.backward_end(self._backward_done)
        self.handles = [owner.add(self)]          # never traced by torch.compile

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.model = None
        if self._backward_end is not None:
            self._backward_end.reset()

    def pre_forward(self, ctx: Any, module: Any, args: tuple, kwargs: dict) -> None:
        drv = self.driver
        if training_forward(module):
            if self.armed is not None:
                drv.begin(self.armed, module)
        elif drv.dump_eval and self.armed is None and self.state is not None:
            drv.begin(self.state.global_step, module)

    def post_forward(self, ctx: Any, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        drv = self.driver
        if not drv.in_window:
            return
        if not training_forward(module):
            drv.pause()                     # eval forward: no backward follows
            return
        if self.armed is not None:          # monitor mode: the model's own loss, given at backward end
            self.model_loss = output_loss(output)     # unless compute_loss gives its own (observe_loss)
        if self._backward_end is not None:    # else on_substep_end / on_pre_optimizer_step stop us
            self._backward_end.watch(output)

    def _backward_done(self) -> None:
        """The micro-batch's backward has finished (after DDP's gradient copies)."""
        self.give_loss()
        self.driver.pause()
        if self.armed is not None and final_micro_batch():
            self.driver.capture_param_grads()

    def give_loss(self) -> None:
        """The micro-batch is over: its loss to the monitor -- the model output's, unless a custom
        ``compute_loss`` gave its own through ``observe_loss``."""
        loss, self.model_loss = self.model_loss, None
        if not self.user_loss:
            self.driver.observe_loss(loss)
        self.user_loss = False


def _no_op(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
    """A Trainer event the callback has nothing to do at."""
    return None


class PrecisionDumpCallback:
    """Dump the configured training steps of a Hugging Face ``Trainer``.

    `config_path` and keyword overrides (``dump_path=``, ``step=``, ``level=``, any
    ``PrecisionDebugger`` option) build a debugger that the callback owns and closes when
    training ends; or pass your own ``debugger=``. ``dump_eval=True`` also records
    evaluation (default: the config's ``dump_eval``, which is off unless set).

    A ``TrainerCallback`` by protocol (see the module docstring): every event method exists and
    returns None, which leaves the Trainer's ``control`` unchanged.
    """

    def __init__(self, config_path: Optional[str] = None, debugger: Optional[PrecisionDebugger] = None, *,
                 dump_eval: Optional[bool] = None, task: Optional[str] = None, dump_path: Optional[str] = None,
                 level: Optional[str] = None, step: Optional[Sequence[int]] = None, **overrides: Any):
        handle = make_debugger(config_path, debugger, dict(task=task, dump_path=dump_path, level=level,
                                                           step=step, **overrides), type(self).__name__)
        self._driver = StepDriver(handle, dump_eval)
        self._watch = _RootWatch(self._driver)
        self._training = False

    @property
    def debugger(self) -> PrecisionDebugger:
        return self._driver.debugger

    @property
    def dumped_steps(self) -> List[int]:
        return list(self._driver.dumped_steps)

    # -- the events this callback acts on --------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._watch.state = state
        if self._driver.dump_eval:
            self._watch.install(model)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._watch.state = state
        self._training = True
        if self._driver.dump_eval:
            self._watch.install(model)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._watch.state = state
        step = state.global_step
        if not self._driver.collects(step):
            return
        if self._driver.open_step not in (None, step):
            self._driver.end_step()
        self._watch.armed = step
        self._watch.install(model)

    def observe_loss(self, loss: Any) -> None:
        """Monitor mode: the loss a custom ``Trainer.compute_loss`` trains on. Call it there (once
        per micro-batch); it replaces the model output's ``loss`` for that micro-batch. Without
        it the monitor sees the model output's ``loss`` (none when the model returns none)."""
        if self._watch.armed is not None:
            self._watch.user_loss = True
            self._driver.observe_loss(loss)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._watch.armed is not None:
            self._watch.give_loss()
            self._driver.pause()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._watch.armed is not None:
            self._watch.give_loss()
            self._driver.pause()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._watch.armed is None:
            return
        self._watch.give_loss()
        self._watch.armed = None
        self._driver.end_step()
        if not self._driver.dump_eval and self._driver.handle.config.monitor is None:
            self._watch.remove()
        if self._driver.should_stop:       # monitor.on_trigger: stop
            control.should_training_stop = True

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._driver.dump_eval:
            self._eval_done()

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        if self._driver.dump_eval:
            self._eval_done()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._training = False
        self._watch.armed = None
        if not self._driver.dump_eval:   # with dump_eval, later evaluate() calls are recorded too
            self._watch.remove()
        self._driver.finish()

    def _eval_done(self) -> None:
        self._driver.pause()
        if not self._training:       # a standalone evaluate()/predict(): nothing follows
            self._driver.finish()

    # -- the rest of the TrainerCallback protocol: nothing to do -------------------------------
    on_epoch_begin = on_epoch_end = on_optimizer_step = on_save = on_log = _no_op
    on_prediction_step = on_push_begin = _no_op
