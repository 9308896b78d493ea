"""MindSpore ``Model.train`` callbacks, msprobe-compatible (seed 003 §6.2/§6.3)::

    from ts_core import PrecisionDebugger
    from ts_integrations.mindspore import MsprobeStep, MsprobeInitStep

    debugger = PrecisionDebugger(config_path="config.json")
    model = Model(net, loss_fn, optimizer)
    model.train(2, dataset, callbacks=[MsprobeInitStep(), MsprobeStep(debugger)],
                dataset_sink_mode=False)

``MsprobeStep(debugger)``: ``start`` at ``on_train_step_begin``, ``stop`` + ``step`` at
``on_train_step_end`` (after the backward and the optimizer update of that step), so each
configured step is dumped exactly once, into ``step{N}``. N is the debugger's step counter: 0
for the first step of a fresh run (``cur_step_num - 1``), counting on across ``Model.train``
calls. At L0/mix, when no model was handed to the debugger (``debugger.start(net)``) or to
``MsprobeStep(debugger, model=net)``, the network comes from
``run_context.original_args().network`` and is unwrapped to the user's backbone
(``TrainOneStepCell.network``, ``WithLossCell._backbone``, ...), so Cells are named by their
path in the backbone: ``Cell.fc1.Dense.forward.0``, as with ``debugger.start(net)``. At L1 a
model is used only when given (msprobe: Primitive calls are captured only then).

``MsprobeInitStep()``: a resumed run dumps under its true step numbers. At the first
``on_train_epoch_begin`` of each ``Model.train`` it sets the active debugger's step counter
(``PrecisionDebugger.current().set_init_step``) to the global index of the step about to run:
``(cur_epoch_num - 1) * batch_num + cur_step_num`` for ``initial_epoch=k`` (MindSpore restarts
``cur_step_num`` at 0 in every ``Model.train``), or the restored ``cur_step_num`` itself when it
is already cumulative (``>= batch_num``). Place it anywhere in the callback list: epoch-begin
events precede every step-begin event.

Dataset sink mode: see docs/mindspore.md. In short, hooks run only in PyNative, one Python
step at a time; with ``dataset_sink_mode=True`` on Ascend/GPU a "step" of the callbacks is one
sink of ``sink_size`` iterations run as a graph, where nothing can be recorded (MsprobeStep
warns). On CPU MindSpore always trains without sinking, so everything works. Monitor mode
refuses a real sink in GRAPH_MODE (one callback per sink: no step to watch) with a ValueError
at ``on_train_begin`` naming what to change.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

import mindspore as ms
from mindspore import nn

from ts_core import PrecisionDebugger

__all__ = ["MsprobeStep", "MsprobeInitStep", "backbone_of"]

_WRAPPER_ATTRS = (
    # (class names, attribute holding the wrapped network)
    (("TrainOneStepCell", "TrainOneStepWithLossScaleCell", "WithGradCell", "ForwardValueAndGrad",
      "GradAccumulationCell", "PipelineCell", "MicroBatchInterleaved"), "network"),
    (("WithLossCell", "_OutputTo32", "_OutputTo16"), "_backbone"),
    (("WithEvalCell",), "_network"),
)


def backbone_of(network: Any) -> Any:
    """The user's network inside MindSpore's training wrappers (TrainOneStepCell,
    WithLossCell, AMP casts, ...): a Cell that is none of them."""
    for _ in range(16):
        inner = None
        for mro_cls in type(network).__mro__:
            for names, attr in _WRAPPER_ATTRS:
                if mro_cls.__name__ in names:
                    candidate = getattr(network, attr, None)
                    if isinstance(candidate, nn.Cell):
                        inner = candidate
                        break
            if inner is not None:
                break
        if inner is None:
            return network
        network = inner
    return network


def _choose_mindspore(debugger: PrecisionDebugger, network: Any) -> None:
    """``start()`` without a model picks the framework from the config or from the one
    framework imported; with torch imported too it cannot. This callback knows it is
    MindSpore: bind the debugger to the network (nothing is hooked by that)."""
    if debugger.config.framework or not isinstance(network, nn.Cell):
        return
    if debugger.config.collects_step(debugger.current_step):
        debugger.bind(network)


class MsprobeStep(ms.train.Callback):
    """Dump the configured steps of ``Model.train``: start at each step's begin, stop and
    step at its end. ``model=`` optionally names the Cell to hook (default at L0/mix: the
    backbone of the network being trained)."""

    def __init__(self, debugger: PrecisionDebugger, model: Optional[nn.Cell] = None):
        super().__init__()
        if not isinstance(debugger, PrecisionDebugger):
            raise TypeError(f"MsprobeStep(debugger): expected a ts_core.PrecisionDebugger, "
                            f"got {type(debugger).__name__}")
        if model is not None and not isinstance(model, (nn.Cell, list, tuple)):
            raise TypeError(f"MsprobeStep(model=...): expected a mindspore.nn.Cell, got {type(model).__name__}")
        self.debugger = debugger
        self.model = model
        self._warned: set = set()

    def _model_for(self, run_context) -> Any:
        if self.model is not None:
            return self.model
        dbg = self.debugger
        if dbg.config.level not in ("L0", "mix") or dbg.is_hooked():
            return None
        network = run_context.original_args().get("network")
        return backbone_of(network) if isinstance(network, nn.Cell) else None

    def on_train_begin(self, run_context) -> None:
        args = run_context.original_args()
        # MindSpore's own record of the path taken: True only when it really sinks (on CPU it
        # trains without sinking and sets False). In GRAPH_MODE a sink of sink_size steps is one
        # compiled graph and one callback; in PYNATIVE_MODE it still steps (and calls back) per step.
        if (args.get("dataset_sink_mode") and ms.get_context("mode") == ms.GRAPH_MODE
                and self.debugger.monitor is not None):
            raise ValueError("tsprobe monitor: Model.train(dataset_sink_mode=True) in GRAPH_MODE runs each sink "
                             f"of sink_size={args.get('sink_size')} steps as one compiled graph with one callback, "
                             "so no step can be watched. Train with dataset_sink_mode=False, or in "
                             "mindspore.PYNATIVE_MODE (where sink mode calls back every step), or drop the "
                             "'monitor' section.")
        if args.get("dataset_sink_mode") and ms.get_context("device_target") != "CPU":
            self._warn_once("sink", "dataset_sink_mode=True runs each sink as a compiled graph: Python hooks "
                            "do not fire there, so MsprobeStep records nothing. Train with "
                            "dataset_sink_mode=False to dump (see docs/mindspore.md).")
        # Anything recorded since an early debugger.start(net) is not a training step.
        self.debugger.stop()

    def on_train_step_begin(self, run_context) -> None:
        model = self._model_for(run_context)
        network = run_context.original_args().get("network")
        if model is None:
            _choose_mindspore(self.debugger, network)
            monitor = self.debugger.monitor
            if monitor is not None and isinstance(network, nn.Cell):
                monitor.watch(self.model or backbone_of(network))      # monitor mode: hooks once
        self.debugger.start(model)

    def on_train_step_end(self, run_context) -> None:
        self.debugger.stop()
        loss = None
        if self.debugger.monitor is not None:     # monitor mode: the step's loss (net_outputs)
            loss = run_context.original_args().get("net_outputs")
            if isinstance(loss, (tuple, list)):   # loss-scale cells return (loss, overflow, scale)
                loss = loss[0] if loss else None
        self.debugger.step(loss=loss)
        if self.debugger.should_stop:            # monitor.on_trigger: stop
            run_context.request_stop()

    def on_train_end(self, run_context) -> None:
        self.debugger.stop()

    def _warn_once(self, tag: str, message: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            warnings.warn(f"tsprobe: {message}", RuntimeWarning, stacklevel=3)


class MsprobeInitStep(ms.train.Callback):
    """Set the active debugger's step counter to the true global step of a resumed run
    (``Model.train(..., initial_epoch=k)``, or a restored ``cur_step_num``)."""

    def __init__(self) -> None:
        super().__init__()
        self._done = False
        self.init_step: Optional[int] = None     # the value set, for inspection

    def on_train_begin(self, run_context) -> None:
        self._done = False

    def on_train_epoch_begin(self, run_context) -> None:
        if not self._done:
            args = run_context.original_args()
            self._apply(args.get("cur_step_num") or 0, args)

    def on_train_step_begin(self, run_context) -> None:
        if not self._done:    # a trainer that sends no epoch events: cur_step_num is 1-based here
            args = run_context.original_args()
            self._apply(max((args.get("cur_step_num") or 1) - 1, 0), args)

    def _apply(self, done_steps: int, args) -> None:
        self._done = True
        batch_num = args.get("batch_num") or 0
        epoch = args.get("cur_epoch_num") or 1
        if batch_num and done_steps < batch_num:
            init = (epoch - 1) * batch_num + done_steps
        else:
            init = done_steps
        debugger = PrecisionDebugger.current()
        if debugger is None:
            warnings.warn("tsprobe: MsprobeInitStep found no active PrecisionDebugger; create it before "
                          "Model.train", RuntimeWarning, stacklevel=3)
            return
        debugger.set_init_step(int(init))
        self.init_step = int(init)
