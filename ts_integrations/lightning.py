"""PyTorch Lightning: ``Trainer(callbacks=[PrecisionDumpCallback(config_path="config.yaml")])``.

Works with ``import lightning`` and with ``import pytorch_lightning`` (the class derives from
the ``Callback`` of each one installed).

One dump step is one optimizer step, numbered by ``trainer.global_step`` before the update.
Hook order (automatic optimization; with ``accumulate_grad_batches=k`` the first k-1
micro-batches skip the optimizer part)::

    on_fit_start              install the debugger's (inert) patches and hooks for the whole fit
    on_train_batch_start      start(pl_module)       every micro-batch of a configured step
      training_step / on_before_zero_grad / on_before_backward / backward
    on_after_backward         stop()                 collection pauses; the step stays open
    on_before_optimizer_step  parameters_grad := .grad   (accumulated, all-reduced, unscaled,
                                                          before gradient clipping)
      clipping, optimizer.step()                     not recorded
    on_train_batch_end        step()                 once trainer.global_step has moved on

Validation / test / predict batches are recorded only with ``dump_eval=True``: each batch
from its ``on_*_batch_start`` to ``on_*_batch_end``, into the folder of the current
``trainer.global_step`` (sanity-check batches never; batches under ``torch.inference_mode``,
Lightning's default for evaluation, are skipped with a warning: use
``Trainer(inference_mode=False)``). ``state_dict`` carries the dumped steps and the next step
over a checkpoint; numbering itself follows ``trainer.global_step``, which Lightning restores.

Why patches stay installed for the whole fit: ``LightningModule.log`` stores
``getattr(torch, "mean")`` with each logged key and raises when a later call sees another
function, which is what L1 patches appearing at the first dumped step (or vanishing after the
last) would cause. Outside the configured steps they are inert (one flag read per call).
A callback-owned debugger is closed at ``teardown`` (everything restored); a ``debugger=``
you pass keeps its patches until you ``close()`` it.

Logging is never recorded: ``self.log``/``self.log_dict`` inside ``training_step`` run
Lightning's bookkeeping (``squeeze``, ``stride``, ``to``, ``mean`` of the logged value), which
is not the model's computation. From ``on_fit_start`` to ``teardown`` the module's ``log`` and
``log_dict`` are wrapped (instance attributes, removed at the end) to pause collection while
they run.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Dict, Optional, Sequence

from ts_core import PrecisionDebugger

from ._common import StepDriver, make_debugger


def _callback_bases() -> tuple:
    bases = []
    if importlib.util.find_spec("lightning") is not None:
        from lightning.pytorch import Callback as _LCallback

        bases.append(_LCallback)
    if importlib.util.find_spec("pytorch_lightning") is not None:
        from pytorch_lightning import Callback as _PLCallback

        bases.append(_PLCallback)
    if not bases:
        raise ImportError("ts_integrations.lightning needs `lightning` or `pytorch_lightning` installed "
                          "(pip install lightning)")
    return tuple(bases)


class PrecisionDumpCallback(*_callback_bases()):
    """Dump the configured training steps of a Lightning ``Trainer``.

    ``PrecisionDumpCallback(config_path=None, debugger=None, *, dump_eval=None, **overrides)``:
    `config_path` and keyword overrides (``dump_path=``, ``step=``, ``level=``, any
    ``PrecisionDebugger`` option) build a debugger that the callback owns and closes when the
    run ends; or pass your own ``debugger=``. ``dump_eval=True`` also records evaluation
    (default: the config's ``dump_eval``, which is off unless set).
    """

    def __init__(self, config_path: Optional[str] = None, debugger: Optional[PrecisionDebugger] = None, *,
                 dump_eval: Optional[bool] = None, task: Optional[str] = None, dump_path: Optional[str] = None,
                 level: Optional[str] = None, step: Optional[Sequence[int]] = None, **overrides: Any):
        super().__init__()
        self._quiet: list = []               # modules whose log/log_dict are wrapped
        handle = make_debugger(config_path, debugger, dict(task=task, dump_path=dump_path, level=level,
                                                           step=step, **overrides), type(self).__name__)
        self._driver = StepDriver(handle, dump_eval)
        self._next_step = 0

    @property
    def debugger(self) -> PrecisionDebugger:
        return self._driver.debugger

    @property
    def dumped_steps(self) -> list:
        """Steps whose folders this callback closed (carried over a checkpoint)."""
        return list(self._driver.dumped_steps)

    # -- training -----------------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module) -> None:
        # Install patches before the first self.log of the fit and keep them to its end:
        # Lightning compares the torch.mean it stored with the current one (see _common).
        self._driver.prepare(pl_module)
        self._quiet_logging(pl_module)

    def _quiet_logging(self, pl_module) -> None:
        """Wrap the module's log/log_dict so that nothing they call is recorded."""
        if pl_module in self._quiet:
            return
        dbg = self._driver.debugger
        depth = [0]                          # log_dict calls log: only the outermost call switches

        def quiet(orig):
            def logged(*args: Any, **kwargs: Any) -> Any:
                if not dbg.in_window or depth[0]:
                    depth[0] += 1
                    try:
                        return orig(*args, **kwargs)
                    finally:
                        depth[0] -= 1
                depth[0] += 1
                dbg.set_collecting(False)
                try:
                    return orig(*args, **kwargs)
                finally:
                    depth[0] -= 1
                    dbg.set_collecting(True)
            return logged

        for name in ("log", "log_dict"):
            setattr(pl_module, name, quiet(getattr(pl_module, name)))
        self._quiet.append(pl_module)

    def _unquiet_logging(self) -> None:
        for module in self._quiet:
            for name in ("log", "log_dict"):
                module.__dict__.pop(name, None)
        self._quiet = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._driver.begin(trainer.global_step, pl_module)

    def on_after_backward(self, trainer, pl_module) -> None:
        self._driver.pause()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._driver.capture_param_grads()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        drv = self._driver
        drv.pause()                       # the training_step returned None: no backward ran
        drv.observe_loss(outputs.get("loss") if isinstance(outputs, dict) else outputs)
        self._next_step = trainer.global_step
        if drv.open_step is not None and trainer.global_step > drv.open_step:
            drv.end_step()
            if drv.should_stop:           # monitor.on_trigger: stop
                trainer.should_stop = True

    # -- validation / test / predict (dump_eval=True) --------------------------------------
    def _eval_begin(self, trainer, pl_module) -> None:
        if self._driver.dump_eval and not trainer.sanity_checking:
            self._driver.begin(trainer.global_step, pl_module)

    def _eval_end(self, trainer) -> None:
        if not self._driver.dump_eval:
            return
        self._driver.pause()
        if trainer.state.fn != "fit":     # trainer.validate()/test()/predict(): nothing follows
            self._driver.end_step()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_begin(trainer, pl_module)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self._driver.dump_eval:
            self._driver.pause()

    def on_validation_end(self, trainer, pl_module) -> None:
        self._eval_end(trainer)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_begin(trainer, pl_module)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self._driver.dump_eval:
            self._driver.pause()

    def on_test_end(self, trainer, pl_module) -> None:
        self._eval_end(trainer)

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._eval_begin(trainer, pl_module)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self._driver.dump_eval:
            self._driver.pause()

    def on_predict_end(self, trainer, pl_module) -> None:
        self._eval_end(trainer)

    # -- end of a run -------------------------------------------------------------------
    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._unquiet_logging()
        self._driver.finish()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._unquiet_logging()
        self._driver.finish()

    # -- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {"next_step": self._next_step, "dumped_steps": list(self._driver.dumped_steps)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._next_step = int(state_dict.get("next_step", 0))
        for s in state_dict.get("dumped_steps", []):
            if s not in self._driver.dumped_steps:
                self._driver.dumped_steps.append(int(s))
        self._driver.debugger.set_init_step(self._next_step)


__all__ = ["PrecisionDumpCallback"]
