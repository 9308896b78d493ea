"""The framework-neutral heart of a dump: numbering, scope, records, stacks, hierarchy.

Backends call ``begin`` when a call starts, ``forward_inputs`` before it runs (so in-place ops
cannot change what is recorded), ``forward_outputs`` after it, and ``backward`` when its
gradients arrive. Records wait in memory only until their statistics are resolved, which
happens in one batch every ``FLUSH_RECORDS`` records or ``FLUSH_SECONDS``.
"""
from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

from ..config import DebuggerConfig
from ..dumpfmt import (BACKWARD, FORWARD, api_key, module_key, params_grad_key, rank_dir, value_name,
                       without_direction)
from ..scope import Scope
from ..writer import DumpDir
from .stack import StackRecorder
from .summary import Summarizer, TensorAdapter

FLUSH_RECORDS = 512     # records waiting in memory before they go to the journal
FLUSH_SECONDS = 0.5     # a record reaches the journal at most ~this long after it was collected


class CallCounter:
    """Per-step call numbering: the n-th call of the same base name gets index n."""

    def __init__(self) -> None:
        self._next: Dict[str, int] = {}

    def next(self, base: str) -> int:
        n = self._next.get(base, 0)
        self._next[base] = n + 1
        return n

    def reset(self) -> None:
        self._next.clear()


class Call:
    """One API or module invocation being recorded."""

    __slots__ = ("base", "index", "fwd_key", "bwd_key", "name", "selected", "parent",
                 "is_module", "record", "dump", "parent_key")

    def __init__(self, base, index, fwd_key, bwd_key, name, selected, parent, is_module, dump, parent_key=None):
        self.base, self.index, self.fwd_key, self.bwd_key = base, index, fwd_key, bwd_key
        self.name, self.selected, self.parent, self.is_module = name, selected, parent, is_module
        self.record: Optional[dict] = None
        self.dump = dump
        # construct.json parent of the forward record: the enclosing module's forward, or the
        # backward of the module whose backward is running (ops of a custom autograd.Function)
        self.parent_key = parent.fwd_key if parent is not None else parent_key


class Collector:
    def __init__(self, cfg: DebuggerConfig, adapter: TensorAdapter, skip_dirs=()):
        self.cfg = cfg
        self.adapter = adapter
        self.rank: Optional[int] = None
        self.step = 0
        self.dump: Optional[DumpDir] = None
        self.counter = CallCounter()
        self.scope = Scope(cfg.list, cfg.scope)
        self.module_stack: List[Call] = []
        self.backward_modules: List[Call] = []     # modules whose backward is running, innermost last
        self.stacks = StackRecorder(skip_dirs) if cfg.stack else None
        self.summ = Summarizer(adapter, md5=cfg.summary_mode == "md5")
        self._pending: List[Tuple[DumpDir, str, dict]] = []
        self._last_flush = time.monotonic()
        self._late_warned = False
        self._write_warned = [False]        # one warning per debugger, not per step folder
        self._flush_lock = threading.Lock()
        self._idle_flusher: Optional[_IdleFlusher] = None
        self.dump_dirs: List[str] = []
        w = cfg.wants
        self.want = {(d, p): w(d, p) for d in (FORWARD, BACKWARD) for p in ("input", "output")}

    # -- step folders -------------------------------------------------------------------
    def open_step(self, step: int, rank: Optional[int]) -> None:
        self.close_step()
        self.step, self.rank = step, rank
        path = rank_dir(self.cfg.dump_path, step, rank)
        header = {"task": self.cfg.task, "level": self.cfg.level, "framework": self.adapter.framework}
        tensor_mode = self.cfg.task == "tensor"
        self.dump = DumpDir(path, header, tensor_to_numpy=self.adapter.to_numpy if tensor_mode else None,
                            raise_on_error=self.cfg.on_write_error == "raise", warned=self._write_warned)
        if self._idle_flusher is None:
            self._idle_flusher = _IdleFlusher(self)
        self.summ.reset()
        self.summ.save_tensor = self.dump.save_tensor if tensor_mode else None
        self.summ.link_tensor = self.dump.link_tensor if tensor_mode else None
        self._last_flush = time.monotonic()
        self.counter.reset()
        self.scope.reset()
        self.module_stack.clear()
        self.backward_modules.clear()
        if self.stacks is not None:
            self.stacks.reset()
        self.dump_dirs.append(path)

    def finalize(self) -> None:
        """Everything collected so far is on disk as complete JSON files."""
        self.flush()
        if self.dump is not None:
            self.dump.finalize()

    def close_step(self) -> None:
        self.flush()
        if self.dump is not None:
            self.dump.close()
            self.dump = None
        self.module_stack.clear()
        self.backward_modules.clear()

    def shutdown(self) -> None:
        """No more steps: stop the idle flusher thread."""
        self.close_step()
        if self._idle_flusher is not None:
            self._idle_flusher.stop()
            self._idle_flusher = None

    # -- calls --------------------------------------------------------------------------
    def begin(self, base: str, is_module: bool) -> Call:
        index = self.counter.next(base)
        if is_module:
            fwd, bwd = module_key(base, index, FORWARD), module_key(base, index, BACKWARD)
        else:
            fwd, bwd = api_key(base, index, FORWARD), api_key(base, index, BACKWARD)
        name = without_direction(fwd)
        parent = self.module_stack[-1] if self.module_stack else None
        selected = self.scope.begin(name, fwd, parent is not None and parent.selected)
        in_backward = self.backward_modules[-1].bwd_key if parent is None and self.backward_modules else None
        call = Call(base, index, fwd, bwd, name, selected, parent, is_module, self.dump, in_backward)
        if is_module:
            self.module_stack.append(call)
        if selected and self.stacks is not None and self.dump is not None:
            sid, frames = self.stacks.capture()
            self.dump.add_stack(fwd, sid, frames)
        return call

    def forward_inputs(self, call: Call, args: Any, kwargs: Optional[dict]) -> None:
        rec: Dict[str, Any] = {}
        if self.want[FORWARD, "input"]:
            s = self.summ.summarize
            key = call.fwd_key
            rec["input_args"] = [s(a, value_name(key, "input", i)) for i, a in enumerate(args)]
            rec["input_kwargs"] = {k: s(v, value_name(key, "input", k)) for k, v in (kwargs or {}).items()}
        call.record = rec

    def forward_outputs(self, call: Call, output: Any, params: Optional[Dict[str, Any]] = None) -> None:
        rec = call.record if call.record is not None else {}
        s = self.summ.summarize
        if self.want[FORWARD, "output"]:
            outs = output if isinstance(output, (list, tuple)) else [output]
            rec["output"] = [s(o, value_name(call.fwd_key, "output", i)) for i, o in enumerate(outs)]
        if params and self.want[FORWARD, "input"]:
            rec["parameters"] = {n: s(p, value_name(call.fwd_key, "parameters", n)) for n, p in params.items()}
        if self.want[FORWARD, "input"] or self.want[FORWARD, "output"]:
            self._emit(call.dump, call.fwd_key, rec)
            self._construct(call.dump, call.fwd_key, call.parent_key)
        call.record = None

    def end(self, call: Call) -> None:
        """The call returned (or raised): close module nesting and the scope range."""
        if call.is_module and self.module_stack and self.module_stack[-1] is call:
            self.module_stack.pop()
        self.scope.end(call.name)

    def backward_begins(self, call: Call) -> None:
        """A module's backward starts (the gradients of its outputs arrived): calls recorded until
        ``backward`` reports its input gradients belong to that module's backward."""
        if call.is_module and call.dump is self.dump:
            self.backward_modules.append(call)

    def backward(self, call: Call, grads_of_outputs: Any, grads_of_inputs: Any) -> None:
        if call.is_module and call in self.backward_modules:
            self.backward_modules.remove(call)
        if not (self.want[BACKWARD, "input"] or self.want[BACKWARD, "output"]):
            return
        dump = call.dump
        if dump is None or dump is not self.dump:
            self._late(call.bwd_key)
            return
        s = self.summ.summarize
        rec: Dict[str, Any] = {}
        if self.want[BACKWARD, "input"]:
            rec["input"] = [s(g, value_name(call.bwd_key, "input", i)) for i, g in enumerate(grads_of_outputs)]
        if self.want[BACKWARD, "output"]:
            rec["output"] = [s(g, value_name(call.bwd_key, "output", i)) for i, g in enumerate(grads_of_inputs)]
        self._emit(dump, call.bwd_key, rec)
        self._construct(dump, call.bwd_key, call.parent.bwd_key if call.parent else None)

    def params_grad(self, base: str, rec: Dict[str, Any], index: int = 0) -> None:
        """``Module.x.Linear.parameters_grad.N`` -> {param name: [summary]} (summaries made by the backend)."""
        key = params_grad_key(base, index)
        if self.dump is None or not self.want[BACKWARD, "output"]:
            return
        if not (self.scope.everything or self.scope.mentions(key)):
            return
        self._emit(self.dump, key, rec)

    def save_value(self, key: str, value: Any) -> None:
        """Debug-level ``save()``: one record holding a summary of `value`."""
        if self.dump is None:
            return
        self._emit(self.dump, key, self.summ.summarize(value, key))

    # -- output -------------------------------------------------------------------------
    def _emit(self, dump: DumpDir, key: str, rec: Any) -> None:
        self._pending.append((dump, key, rec))
        if len(self._pending) >= FLUSH_RECORDS or time.monotonic() - self._last_flush > FLUSH_SECONDS:
            self.flush()

    def _construct(self, dump: DumpDir, key: str, parent: Optional[str]) -> None:
        if self.cfg.level in ("L0", "mix"):
            dump.add_construct(key, parent)

    def flush(self) -> None:
        with self._flush_lock:
            n = len(self._pending)      # records appended meanwhile (another thread) stay queued
            self.summ.resolve()         # covers every record among the first n
            dumps: Dict[int, DumpDir] = {}
            for dump, key, rec in self._pending[:n]:
                dump.add_record(key, rec)
                dumps[id(dump)] = dump
            del self._pending[:n]
            for dump in dumps.values():
                dump.flush()
            self._last_flush = time.monotonic()

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def _late(self, key: str) -> None:
        if not self._late_warned:
            self._late_warned = True
            warnings.warn(f"tsprobe: gradient for {key} arrived after its step was closed and was not "
                          "recorded; call debugger.step() after loss.backward().", RuntimeWarning, stacklevel=3)


class _IdleFlusher(threading.Thread):
    """Flushes records that would otherwise wait for the next call: a run that hangs (a stuck
    collective) and is then killed still has everything collected up to ~1 s before."""

    def __init__(self, collector: Collector):
        super().__init__(name="tsprobe-idle-flush", daemon=True)
        self.collector = collector
        self._stop_event = threading.Event()
        self.start()

    def run(self) -> None:
        col = self.collector
        while not self._stop_event.wait(FLUSH_SECONDS / 2):
            if col.has_pending and time.monotonic() - col._last_flush > FLUSH_SECONDS:
                try:
                    col.flush()
                except Exception:   # never let the helper thread kill the process
                    pass

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
