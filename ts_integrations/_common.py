"""Glue shared by the training integrations: one debugger, step gating, parameter gradients.

An integration only knows *when* things happen in a trainer it does not own; this module turns
"a micro-batch of optimizer step N begins / its backward ended / the optimizer step is done"
into ``PrecisionDebugger.start / stop / step``. Every decision about what is recorded stays in
ts_core. Nothing here imports a training framework; torch is imported lazily.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

from ts_core import PrecisionDebugger


def make_debugger(config_path: Optional[str], debugger: Optional[PrecisionDebugger],
                  overrides: dict, who: str) -> "DebuggerHandle":
    """``config_path=`` / keyword overrides build a debugger we own; ``debugger=`` is the user's."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if debugger is not None:
        if config_path is not None or given:
            raise ValueError(f"{who}: pass either debugger=... or config_path=/config keywords "
                             f"({', '.join(sorted(given)) or 'config_path'}), not both")
        if not isinstance(debugger, PrecisionDebugger):
            raise TypeError(f"{who}: debugger= takes a ts_core.PrecisionDebugger, "
                            f"got {type(debugger).__name__}")
        return DebuggerHandle(debugger, None)
    factory = lambda: PrecisionDebugger(config_path, **given)    # noqa: E731
    return DebuggerHandle(factory(), factory)


class DebuggerHandle:
    """The debugger an integration drives. One we built is closed when training ends (every
    patch restored) and rebuilt from the same arguments if the trainer is used again; one the
    user passed is never closed by us."""

    def __init__(self, debugger: PrecisionDebugger, factory: Optional[Callable[[], PrecisionDebugger]]):
        self._debugger = debugger
        self._factory = factory
        self._closed = False
        self.config = debugger.config        # what to collect; the same for a rebuilt debugger

    @property
    def owned(self) -> bool:
        return self._factory is not None

    def get(self) -> PrecisionDebugger:
        if self._closed:
            self._debugger = self._factory()
            self._closed = False
        return self._debugger

    def close(self) -> None:
        if self.owned and not self._closed:
            self._debugger.close()
            self._closed = True


class StepDriver:
    """Maps trainer events to one debugger.

    ``begin(step, model)`` -- a micro-batch (or an eval batch) that belongs to optimizer step
    `step` starts: collect, into that step's folder. No-op outside the configured steps.
    ``pause()`` -- the micro-batch's backward is done: stop collecting, keep the step open.
    ``capture_param_grads()`` -- take ``parameters_grad`` from ``.grad`` now.
    ``end_step()`` -- the optimizer step is done: close the step's folder.
    Monitor mode (config section ``monitor``): every training step is begun and ended, and
    ``observe_loss(loss)`` hands the monitor the micro-batch's loss; ``should_stop`` says
    that a capture asked training to stop (``monitor.on_trigger: stop``).
    """

    def __init__(self, handle: DebuggerHandle, dump_eval: Optional[bool] = None):
        self.handle = handle
        # the integration's keyword wins over the config's `dump_eval`
        self.dump_eval = bool(handle.config.dump_eval if dump_eval is None else dump_eval)
        self.open_step: Optional[int] = None      # step whose folder we opened and not yet closed
        self.in_window = False
        self.keep_patches = False                 # prepare() was called: patches stay until finish()
        self.dumped_steps: List[int] = []

    @property
    def debugger(self) -> PrecisionDebugger:
        return self.handle.get()

    def collects(self, step: int) -> bool:
        cfg = self.handle.config
        return cfg.collects_step(step) or cfg.monitor is not None

    def observe_loss(self, loss: Any) -> None:
        """Monitor mode: the loss of a micro-batch of the open step (ignored otherwise)."""
        if loss is not None and self.open_step is not None and self.handle.config.monitor is not None:
            self.handle.get().observe_loss(loss)

    @property
    def should_stop(self) -> bool:
        return self.handle.config.monitor is not None and self.handle.get().should_stop

    def prepare(self, model: Any) -> None:
        """Install the debugger's patches and hooks now (collecting nothing) and keep them until
        finish(), for frameworks that compare torch function identities across steps."""
        self.handle.get().prepare(model)
        self.keep_patches = True

    def begin(self, step: int, model: Any) -> bool:
        if not self.collects(step):
            return False
        if self.open_step is not None and self.open_step != step:
            self.end_step()
        dbg = self.handle.get()
        if self.in_window:
            return True
        if dbg.current_step != step:
            dbg.set_step(step)
        dbg.start(model)
        self.open_step = step
        self.in_window = True
        return True

    def pause(self) -> None:
        if self.in_window:
            self.in_window = False
            self.handle.get().stop()

    def capture_param_grads(self) -> None:
        if self.open_step is not None:
            self.handle.get().record_param_grads()

    def end_step(self) -> None:
        if self.open_step is None:
            return
        self.pause()
        step, self.open_step = self.open_step, None
        dbg = self.handle.get()
        dbg.set_step(step)
        dbg.step()
        if step not in self.dumped_steps:
            self.dumped_steps.append(step)

    def finish(self) -> None:
        """Training (or an eval run) is over: close the open step, release what we own."""
        try:
            self.end_step()
        finally:
            self.in_window = False
            self.open_step = None
            self.keep_patches = False
            self.handle.close()


def unwrap(model: Any) -> Any:
    """The user's module inside DDP/DataParallel/compile wrappers, so that keys read
    ``Module.fc1...`` on one rank and on many."""
    seen = 0
    while seen < 8:
        inner = getattr(model, "module", None) if type(model).__name__ in (
            "DistributedDataParallel", "DataParallel") else getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model, seen = inner, seen + 1
    return model


def training_forward(module: Any) -> bool:
    """A forward that a backward follows: `module` in training mode with autograd on (an eval
    forward, or one under ``torch.no_grad()``, is not). torch is imported here, not before: a
    hook runs only on a model, once torch is loaded."""
    import torch

    return bool(module.training) and torch.is_grad_enabled()


def final_micro_batch() -> bool:
    """accelerate's ``sync_gradients``: this backward ends the optimizer step's accumulation (its
    gradients are complete and reduced). Without an accelerate state, every backward is final."""
    try:
        from accelerate.state import GradientState

        return bool(GradientState().sync_gradients)
    except Exception:
        return True


def output_loss(output: Any) -> Any:
    """``output.loss`` of a transformers ModelOutput (or a dict), else None."""
    if isinstance(output, dict):
        return output.get("loss")
    return getattr(output, "loss", None)
