"""accelerate: dump a hand-written training loop, one micro-batch at a time.

::

    debugger = PrecisionDebugger(config_path="config.yaml")
    for batch in loader:
        with accelerator.accumulate(model), collect(accelerator, debugger, model):
            loss = model(**batch).loss
            accelerator.backward(loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)    # outside: not recorded
        optimizer.step(); optimizer.zero_grad()

``collect`` records the forward and backward of the micro-batch it wraps into the folder of the
current optimizer step. When ``accelerator.sync_gradients`` is true at the end of the block,
that micro-batch completed an optimizer step: ``parameters_grad`` is taken from ``.grad``
(accumulated over the step's micro-batches and all-reduced across processes; before
unscaling and clipping, which accelerate does in ``clip_grad_norm_`` / ``optimizer.step()``
after the block) and the step is closed. Steps are counted by the debugger (0-based optimizer
steps); to resume, pass ``step=`` (your completed optimizer steps) or call
``debugger.set_init_step(n)`` once. Each process writes ``rank{R}``, R being
torch.distributed's rank, which is accelerate's ``process_index``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

from ts_core import PrecisionDebugger

from ._common import unwrap

__all__ = ["collect"]


@contextlib.contextmanager
def collect(accelerator: Any, debugger: PrecisionDebugger, model: Any = None, *,
            step: Optional[int] = None) -> Iterator[PrecisionDebugger]:
    """Record one micro-batch's forward and backward (see the module docstring).

    `model` is the prepared (possibly DDP-wrapped) model or the plain one; modules are named
    as in the unwrapped model. `step` (optional) is the 0-based optimizer step this micro-batch
    belongs to; by default the debugger's own count, advanced whenever a block ends with
    ``accelerator.sync_gradients``.
    """
    if not isinstance(debugger, PrecisionDebugger):
        raise TypeError(f"collect(accelerator, debugger, model): debugger must be a PrecisionDebugger, "
                        f"got {type(debugger).__name__}")
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"collect(step=...) takes the 0-based optimizer step, got {step!r}")
        if debugger.current_step != step:
            debugger.set_init_step(step)
    inner = unwrap(model) if model is not None else None
    collecting = debugger.wants_step(debugger.current_step)      # configured step, or monitor mode
    if collecting:
        debugger.start(inner)
    try:
        yield debugger
    finally:
        if collecting:
            debugger.stop()
        if accelerator.sync_gradients:
            if collecting:
                debugger.record_param_grads()
            debugger.step()
