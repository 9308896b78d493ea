"""Monitor mode: watch every training step cheaply, keep the last K steps in memory, and write
them as ordinary dumps the moment something goes wrong.

Each step the debugger drives (``start`` ... ``stop`` ... ``step``), the monitor's hooks
(backends/monitor_tap.py) record every module call of the step into a ``StepLog``: summaries of
inputs, outputs, gradients of outputs and inputs, parameter gradients (L0 records), their
statistics kept as device values or native host rows and brought over in one batched transfer
at the end of the step. From that the monitor derives the step's signals (loss, global and
per-module gradient norm, count of tensors holding NaN/Inf), appends them to
``dump_path/monitor.jsonl`` (and TensorBoard when asked), keeps the StepLog in a ring buffer of
``keep_steps`` steps and checks the triggers: NaN/Inf anywhere, a loss spike, a gradient-norm
spike (spike.py).

On a trigger at step k (up to ``max_captures`` times, and always at the first NaN/Inf, so that
an early loss spike does not use up the capture the NaN needs) every step in the ring buffer is written
as ``dump_path/step{s}/rank{R}/dump.json`` (+ stack.json, construct.json) at level L0, the first
NaN/Inf of step k is named from that dump exactly as ``tsprobe summary`` names it (record,
direction, source line), and the debugger then dumps ``after_steps`` more steps with the
top-level task and level, and stops or raises if so configured.

Nothing here may break training: an exception inside the monitor warns once and switches the
monitor off (hooks become no-ops at once and are removed at the next step boundary).
"""
from __future__ import annotations

import math
import os
import sys
import warnings
from collections import deque
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from ..dumpfmt import DUMP_JSON, MONITOR_JSONL, TENSORBOARD_DIR, rank_dir, split_module_name, write_rank_files
from ..errors import DumpWriteError
from .options import MonitorConfig
from .sinks import JsonlSink, open_tensorboard
from .spike import SpikeDetector

LEVEL = "L0"            # what the ring buffer records (API-level recording every step costs 2-6x)


class Monitor:
    def __init__(self, cfg: Any):
        self.cfg = cfg                                   # the debugger's DebuggerConfig
        self.options: MonitorConfig = cfg.monitor
        o = self.options
        self.ring: deque = deque(maxlen=o.keep_steps)
        self.loss_spike = SpikeDetector(o.loss_spike) if o.loss_spike is not None else None
        self.grad_spike = SpikeDetector(o.grad_spike) if o.grad_spike is not None else None
        self.captures: List[Dict[str, Any]] = []         # one dict per capture written
        self.should_stop = False                         # on_trigger: stop, after a capture
        self.disabled = False
        self._tap: Any = None
        self._summ: Any = None
        self._adapter: Any = None
        self._log: Any = None                            # StepLog of the step being recorded
        self._rank: Optional[int] = None
        self._jsonl: Optional[JsonlSink] = None
        self._tensorboard: Any = None
        self._warned: set = set()

    # -- what the debugger calls -------------------------------------------------------------
    def start(self, step: int, model: Any) -> None:
        """A step (or one more micro-batch of it) begins: hook `model` if new, record."""
        if self.disabled:
            self._teardown()
            return
        if model is not None:
            self.watch(model)
        if self._tap is None:
            return
        try:
            log = self._log
            if log is not None and log.step != step:
                self.end_step()                           # the previous step never ended
            if self._log is None:
                rank = self._tap.backend.rank()
                if not self.cfg.collects_rank(rank):
                    return
                from ..record.steplog import StepLog

                self._rank = rank
                self._summ.reset()
                self._log = StepLog(step, rank, self.options.max_records_per_step)
            self._tap.begin(self._log)
        except Exception as exc:
            self._fail(exc)

    def watch(self, model: Any) -> None:
        """Hook `model` (once per model). A `model` of no supported framework is a TypeError."""
        if self.disabled:
            return
        try:
            if self._tap is None:
                self._bind(model)
            self._tap.install(model)
        except TypeError:
            raise
        except Exception as exc:
            self._fail(exc)

    def pause(self) -> None:
        """The step's forward/backward is over (or a micro-batch of it): record nothing more."""
        if self._tap is not None:
            self._tap.pause()

    def observe_loss(self, loss: Any) -> None:
        """The loss of the step being recorded (several calls: their mean). A tensor stays on
        its device until the step's one transfer."""
        log = self._log
        if log is None or self.disabled:
            return
        try:
            if self._adapter.is_tensor(loss):
                from ..backends._depth import internal

                with internal():
                    log.losses.append(self._summ.summarize(loss, ""))
            elif isinstance(loss, (int, float)) and not isinstance(loss, bool):
                log.losses.append(float(loss))
            else:
                self._warn_once("loss", f"observe_loss(loss): expected a tensor or a number, got "
                                        f"{type(loss).__name__}; the loss is not monitored")
        except Exception as exc:
            self._fail(exc)

    def capture_param_grads(self) -> None:
        """Take parameter gradients from where the framework accumulates them, now (after a
        data-parallel all-reduce or AMP unscaling)."""
        if self._log is not None and not self.disabled:
            try:
                self._tap.reread_param_grads(self._log)
            except Exception as exc:
                self._fail(exc)

    def end_step(self) -> Optional[Dict[str, Any]]:
        """The step is over: signals, triggers, a capture when one fires (returned)."""
        log, self._log = self._log, None
        if log is None or self.disabled:
            self._teardown()
            return None
        try:
            self._tap.pause()
            log.closed = True                             # gradients arriving later are ignored
            self._summ.resolve()                          # the step's one batched transfer
            return self._after_step(log)
        except DumpWriteError:
            raise
        except Exception as exc:
            self._fail(exc)
            return None

    def close(self) -> None:
        """End an unfinished step, remove every hook, close the outputs."""
        try:
            if self._log is not None:
                self.end_step()
        finally:
            self.disabled = True
            self._teardown()
            for sink in (self._jsonl, self._tensorboard):
                if sink is not None:
                    try:
                        sink.close()
                    except Exception:
                        pass
            self._jsonl = self._tensorboard = None

    # -- a step's signals and triggers -------------------------------------------------------
    def _after_step(self, log: Any) -> Optional[Dict[str, Any]]:
        o = self.options
        loss, norm, bad = log.loss(), log.grad_norm(), log.nonfinite_counts()
        row: Dict[str, Any] = {"step": log.step, "rank": log.rank, "loss": loss, "grad_norm": norm,
                               "nonfinite": bad}
        if o.module_grad_norms:
            row["module_grad_norms"] = {split_module_name(base)[1] or base: n
                                        for base, n in log.module_grad_norms().items()}
        if log.truncated:
            row["truncated"] = True
            self._warn_once("truncated", f"step {log.step} made more than {o.max_records_per_step} module "
                                         "calls; later ones were not recorded (monitor.max_records_per_step)")
        reasons = []
        if o.nan and (any(bad.values()) or _nonfinite(loss) or _nonfinite(norm)):
            reasons.append("nan")
        if self.loss_spike is not None and self.loss_spike.check(loss):
            reasons.append("loss_spike")
        if self.grad_spike is not None and self.grad_spike.check(norm):
            reasons.append("grad_spike")
        log.compact()
        self.ring.append(log)
        capture = None
        if reasons:
            row["trigger"] = reasons
            first_nan = "nan" in reasons and not any("nan" in c["reasons"] for c in self.captures)
            if len(self.captures) < o.max_captures or (first_nan and o.max_captures > 0):
                capture = self._capture(log, reasons, loss, norm)
                row["capture"] = {"first": capture["first"], "dumps": capture["dumps"]}
                if o.on_trigger == "stop":
                    self.should_stop = True
        self._emit(row, flush=capture is not None)
        return capture

    def _capture(self, log: Any, reasons: List[str], loss: Optional[float], norm: Optional[float]) -> Dict[str, Any]:
        dumps = []
        for past in self.ring:                            # oldest first, ending with `log`
            path = rank_dir(self.cfg.dump_path, past.step, past.rank)
            if not past.persisted:
                if not os.path.isfile(os.path.join(path, DUMP_JSON)):     # a regular dump stays as it is
                    self._write(past, path)
                past.persisted = True
            dumps.append(path)
        capture = {"step": log.step, "rank": log.rank, "reasons": reasons, "loss": loss, "grad_norm": norm,
                   "first": _first_nonfinite(dumps[-1]), "dumps": dumps}
        self.captures.append(capture)
        self._announce(capture)
        return capture

    def _write(self, log: Any, path: str) -> None:
        data, construct, stacks = log.unpack()
        header = {"task": "statistics", "level": LEVEL, "framework": self._adapter.framework, "dump_data_dir": None}
        if log.truncated:
            header["incomplete"] = True
        try:
            os.makedirs(path, exist_ok=True)
            write_rank_files(path, header, data, stacks, construct)
        except OSError as exc:
            if self.cfg.on_write_error == "raise":
                raise DumpWriteError(f"tsprobe monitor could not write {path}: {exc}") from exc
            self._warn_once("write", f"writing the capture in {path} failed ({exc}); training goes on")

    def _emit(self, row: Dict[str, Any], flush: bool) -> None:
        o = self.options
        if o.jsonl:
            if self._jsonl is None:
                self._jsonl = JsonlSink(os.path.join(self.cfg.dump_path, MONITOR_JSONL))
            self._jsonl.write(row)
        if o.tensorboard and "tensorboard" not in self._warned:
            if self._tensorboard is None:
                log_dir = o.tensorboard_dir or os.path.join(self.cfg.dump_path, TENSORBOARD_DIR)
                self._tensorboard = open_tensorboard(log_dir, self._rank)
                if self._tensorboard is None:
                    self._warned.add("tensorboard")
                    return
            self._tensorboard.write(row)
            if flush:
                self._tensorboard.flush()

    def _announce(self, capture: Dict[str, Any]) -> None:
        if os.environ.get("TSPROBE_QUIET") == "1":
            return
        first = capture["first"]
        where = (f"; first NaN/Inf: {first['tensor']} ({first['direction']})"
                 + (f" at {first['source']}" if first.get("source") else "")) if first else ""
        print(f"[tsprobe] monitor: step {capture['step']} rank {capture['rank'] if capture['rank'] is not None else '-'}"
              f": {', '.join(capture['reasons'])} (loss={capture['loss']}, grad_norm={capture['grad_norm']})"
              f"{where}; dumped {len(capture['dumps'])} step(s): {', '.join(capture['dumps'])}", file=sys.stderr)

    # -- binding, failure --------------------------------------------------------------------
    def _bind(self, model: Any) -> None:
        """The framework backend of `model`, for the monitor alone (the regular dump has its own)."""
        from ..backends import framework_of, load_backend
        from ..backends.monitor_tap import MonitorTap
        from ..record.collector import Collector

        backend_cls = load_backend(framework_of(model, self.cfg.framework))
        cfg = replace(self.cfg, task="statistics", level=LEVEL, summary_mode="statistics", data_mode=["all"],
                      scope=[], list=[], monitor=None)
        collector = Collector(cfg, backend_cls.adapter_class(), backend_cls.skip_dirs)
        backend = backend_cls(cfg, collector, SimpleNamespace(active=False))     # never collects itself
        self._summ = collector.summ
        self._adapter = collector.adapter
        self._tap = MonitorTap(backend, self._fail, self.options.backward)

    def _fail(self, exc: BaseException) -> None:
        if not self.disabled:
            self.disabled = True
            if self._tap is not None:
                self._tap.pause()          # hooks are no-ops from now on; removed at the next boundary
            warnings.warn(f"tsprobe monitor: switched off after an internal error ({type(exc).__name__}: "
                          f"{exc}); training goes on unmonitored. Please report this.", RuntimeWarning,
                          stacklevel=3)

    def _teardown(self) -> None:
        """Remove the hooks of a monitor that is off (outside any forward, so it is safe)."""
        if self.disabled and self._tap is not None:
            self._tap.remove()
            self._tap = None
            self._log = None

    def _warn_once(self, tag: str, message: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            warnings.warn(f"tsprobe monitor: {message}", RuntimeWarning, stacklevel=3)


def _nonfinite(v: Optional[float]) -> bool:
    return v is not None and not math.isfinite(v)


def _first_nonfinite(path: str) -> Optional[Dict[str, Any]]:
    """The first NaN/Inf of the dump at `path`, as ``tsprobe summary`` names it (None when the
    dump holds none, or could not be written)."""
    from ..compare.errors import DumpFormatError
    from ..compare.report.summary import summarize

    try:
        items = summarize(path)
    except DumpFormatError:
        return None
    return items[0]["first_nonfinite"] if items else None
