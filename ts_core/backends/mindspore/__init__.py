"""MindSpore PyNative backend: API wrapping (L1), Cell hooks (L0), both (mix), Primitive calls
made through the model's Cells (L1/mix with ``start(model)``).

What is MindSpore's own (the flow is ``backends/base.py``): models are ``nn.Cell``; parameter
gradients come from ``Parameter.register_hook`` only (a Parameter keeps no accumulated
gradient, so there is nothing to re-read); backward hooks are placed only while PyNative
records a gradient; a Cell's input gradients are the sum of the per-use taps placed inside it
(``module_grads_from_uses``: at L0 the API and Primitive wrappers are installed to tap only,
see grad_capture); a capture whose input tap never fires (MindSpore prunes branches that lead
to no requested input) is completed at the end of the step (grad_capture.Pending); Cells that
define ``bprop`` get their forward post hook through their ``__call__`` (bprop_cells); GRAPH_MODE
runs no Python hook, which ``install`` warns about; ``mindspore.jit`` regions compile without
seeing tsprobe and are recorded at their boundary (jit_regions).
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Optional

import mindspore as ms
from mindspore import nn

from ..base import Backend
from ._runtime import is_pynative, warm_up
from .access import MindSporeAccess
from .api_hooks import ApiPatcher
from .bprop_cells import has_bprop
from .grad_capture import CellCapture, CellWatch, GradCapture, InputTap, Pending, flat_tensors
from .jit_regions import JitPatcher
from .primitive_hooks import PrimitivePatcher
from .tensors import MindSporeAdapter

__all__ = ["MindSporeBackend", "MindSporeAdapter"]


class MindSporeBackend(Backend):
    """Records ``nn.Cell`` models in PyNative, the APIs of api_list.yaml, and the Primitive
    calls made through the model's Cells."""

    adapter_class = MindSporeAdapter
    access_class = MindSporeAccess
    skip_dirs = (os.path.dirname(ms.__file__),)
    api_patcher_class = ApiPatcher
    module_prefix = "Cell"
    module_grads_from_uses = True

    def __init__(self, cfg: Any, collector: Any, switch: Any):
        warm_up()
        super().__init__(cfg, collector, switch)
        self.pending: Optional[Pending] = Pending() if self.want_backward else None
        self.watch = CellWatch()
        self.primitives = PrimitivePatcher(self._run_primitive, switch)
        # mindspore.jit regions: compiled without seeing tsprobe at every level, recorded as
        # Jit.{name}.{n} at the API levels (jit_regions).
        self.jits = JitPatcher(self.api_runner, switch)
        self._warned_graph = False

    def _check_runtime_impl(self) -> None:
        self.jits.install()      # every install passes here first: before a hook or wrapper meets a jit region
        if not is_pynative() and not self._warned_graph:
            self._warned_graph = True
            warnings.warn("tsprobe: MindSpore is in GRAPH_MODE; Python hooks do not run inside compiled "
                          "graphs, so nothing is recorded there. Use PYNATIVE_MODE.", stacklevel=4)

    def _wrap_model_calls_impl(self, model: nn.Cell) -> None:
        self.primitives.install(model)

    def _grad_capture_impl(self, emit) -> GradCapture:
        return GradCapture(emit, self.pending, self.watch)

    # The per-use design below is this class's; a subclass that sets module_grads_from_uses
    # False (mindtorch, with captures of its own) gets the base's behaviour.
    def _module_capture_impl(self, emit, module: nn.Cell) -> Any:
        # A bprop Cell runs as one custom op: each input has one use, its tap is exact.
        if not self.module_grads_from_uses or has_bprop(module):
            return self._grad_capture_impl(emit)
        return CellCapture(emit, self.pending, self.watch)

    def _before_aliasing_call_impl(self, capture: GradCapture, args: tuple, kwargs: dict):
        if not self.module_grads_from_uses:
            return super()._before_aliasing_call_impl(capture, args, kwargs)
        return capture.before_aliasing_call(args, kwargs)

    def _returned_impl(self, capture: GradCapture, out: Any) -> Any:
        if not self.module_grads_from_uses:
            return out
        return capture.returned(out)

    def _call_with_use_taps_impl(self, orig, args: tuple, kwargs: dict) -> Any:
        if not self.watch:
            return orig(*args, **kwargs)
        tap = InputTap(self.watch)
        args, kwargs = tap.apply(args, kwargs, every=False)
        return tap.restore(orig(*args, **kwargs))

    def _run_primitive(self, orig, base: str, name: str, args: tuple, kwargs: dict, inplace: bool) -> Any:
        """A Primitive call (see primitive_hooks). One with side effects (``nn.BatchNorm2d``'s
        BatchNorm updates its moving statistics) is not tapped for its own record, but it still
        reads the inputs of the Cells running now: those uses are tapped for the Cells (never a
        Parameter, which such a Primitive may write)."""
        if not (inplace and self.watch and self._grad_recording()):
            return self.api_runner(orig, base, name, args, kwargs, inplace)
        tap = InputTap(self.watch)
        args, kwargs = tap.apply(args, kwargs, every=False, parameters=False)
        return tap.restore(self.api_runner(orig, base, name, args, kwargs, inplace))

    def _abandon_capture_impl(self, capture: Any) -> None:
        if isinstance(capture, CellCapture):
            capture.abandon()

    def _watch_module_outputs_impl(self, capture: GradCapture, output: Any, args: tuple, inplace: bool) -> None:
        capture.watch_outputs(output)

    def _watch_api_outputs_impl(self, capture: GradCapture, out: Any, args: tuple, kwargs: dict,
                                inplace: bool) -> None:
        # An output that is an input returned as-is carries no gradient of this call
        # (in-place calls excepted: their output is the input's new value).
        skip = () if inplace else {id(t) for t in flat_tensors((args, kwargs), [])}
        capture.watch_outputs(out, skip)

    def _new_step_impl(self) -> None:
        self.watch.clear()
        if self.pending is not None:
            self.pending.clear()

    def _end_step_impl(self) -> None:
        self.jits.end_traces()
        self.watch.clear()
        if self.pending is not None:
            self.pending.flush()

    def _close_impl(self) -> None:
        self.primitives.restore()
        self.jits.restore()
        self.watch.clear()
        if self.pending is not None:
            self.pending.clear()
