"""The framework-neutral heart of a dump: numbering, scope, records, stacks, hierarchy.

Backends call ``begin`` when a call starts, ``forward_inputs`` before it runs (so in-place ops
cannot change what is recorded), ``forward_outputs`` after it, and ``backward`` when its
gradients arrive. Records wait in memory only until their statistics are resolved, which
happens in one batch every ``FLUSH_RECORDS`` records or ``FLUSH_SECONDS`` -- except statistics
still on an accelerator, which wait for the step end (one transfer, no sync mid-step).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from ..config import DebuggerConfig
from ..errors import warn_user
from ..dumpfmt import (BACKWARD, FORWARD, api_key, module_key, params_grad_key, rank_dir, value_name,
                       without_direction)
from ..scope import Scope
from ..writer import DumpDir
from .diffdump import DiffDump, Held
from .stack import StackRecorder
from .summary import Summarizer, TensorAdapter

FLUSH_RECORDS = 512     # records waiting in memory before they go to the journal
FLUSH_SECONDS = 0.5     # a record reaches the journal at most ~this long after it was collected
# async_dump: nothing is flushed inside the step unless what waits for the step end passes one of
# these bounds (then one early flush, and a warning once): device copies of tensors for files and
# CRCs, and tensor summaries whose statistics or checksums are still on the device.
ASYNC_MAX_BYTES = 1 << 30
ASYNC_MAX_PENDING = 100_000


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
        self.summ = Summarizer(adapter, summary_mode=cfg.summary_mode, values=cfg.task != "structure",
                               defer=cfg.async_dump)
        self.diff = DiffDump(cfg.bench_path, cfg.diff_nums, cfg.summary_mode) if cfg.bench_path else None
        self._tensor_list = tuple(cfg.tensor_list)
        self._files = cfg.task == "tensor" or bool(self._tensor_list)      # step folders hold tensor files
        self._async_warned = False
        self._pending: List[Tuple[DumpDir, str, dict]] = []
        self._last_flush = time.monotonic()
        self._late_warned = False
        self._write_warned = [False]        # one warning per debugger, not per step folder
        self._flush_lock = threading.Lock()
        self._idle_flusher: Optional[_IdleFlusher] = None
        self.dump_dirs: List[str] = []
        self._plain_bases: Dict[str, bool] = {}     # base name -> has no forward/backward part
        w = cfg.wants
        self.want = {(d, p): w(d, p) for d in (FORWARD, BACKWARD) for p in ("input", "output")}
        # statistics tasks: no value of any record needs a name (no tensor file, nothing held)
        self._unnamed = not self._files and self.diff is None
        self._hierarchy = cfg.level in ("L0", "mix")       # construct.json has entries

    # -- step folders -------------------------------------------------------------------
    def forget_seen_values(self) -> None:
        """Tensors may have changed without their version counters moving: a collective writes
        into its tensors in place (gloo, NCCL), DDP's reducer into gradient buckets. What was
        summarised of a tensor seen unchanged is then not reused (statistics, CRC, file link)."""
        self.summ.reset()

    def open_step(self, step: int, rank: Optional[int]) -> None:
        self.close_step()
        self.step, self.rank = step, rank
        path = rank_dir(self.cfg.dump_path, step, rank)
        header = {"task": self.cfg.task, "level": self.cfg.level, "framework": self.adapter.framework}
        files = self._files
        self.dump = DumpDir(path, header, tensor_to_numpy=self.adapter.to_numpy if files else None,
                            raise_on_error=self.cfg.on_write_error == "raise", warned=self._write_warned,
                            tensor_format=self.cfg.tensor_format)
        if self._idle_flusher is None and not self.cfg.async_dump:
            self._idle_flusher = _IdleFlusher(self)
        self.summ.save_tensor = self.dump.save_tensor if files else None
        self.summ.link_tensor = self.dump.link_tensor if files else None
        if self.diff is not None:
            self.diff.open_step(step, rank)
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
        self.flush(but=self.dump)           # its journal: only what its JSON files will not hold
        if self.dump is not None:
            self.dump.finalize()

    def close_step(self) -> None:
        self.flush()
        if self.dump is not None:
            self.dump.close()
            self.dump = None
        self.summ.reset()           # the step's caches (and summaries kept to share): also for open_step
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
        counts = self.counter._next                     # self.counter.next(base), inlined
        index = counts.get(base, 0)
        counts[base] = index + 1
        if is_module:
            fwd, bwd = module_key(base, index, FORWARD), module_key(base, index, BACKWARD)
        else:
            fwd, bwd = api_key(base, index, FORWARD), api_key(base, index, BACKWARD)
        # the call's name without direction (``without_direction``, without splitting the key)
        plain = self._plain_bases.get(base)
        if plain is None:
            plain = self._plain_bases[base] = without_direction(base) == base
        name = f"{base}.{index}" if plain else without_direction(fwd)
        parent = self.module_stack[-1] if self.module_stack else None
        scope = self.scope
        selected = scope.everything or scope.begin(name, fwd, parent is not None and parent.selected)
        in_backward = self.backward_modules[-1].bwd_key if parent is None and self.backward_modules else None
        call = Call(base, index, fwd, bwd, name, selected, parent, is_module, self.dump, in_backward)
        if is_module:
            self.module_stack.append(call)
        if selected and self.stacks is not None and self.dump is not None:
            sid, frames = self.stacks.capture()
            self.dump.add_stack(fwd, sid, frames)
        return call

    def files_for(self, key: str) -> bool:
        """Does the record `key` get tensor files when it is summarised? (task tensor: yes;
        tensor_list: when an entry is a substring of the key, as msprobe matches; statistics
        tasks: no; diff-only dump: decided after the record is complete, see
        ``_save_if_introduced``)."""
        if self.diff is not None or not self._files:
            return False
        return not self._tensor_list or any(e in key for e in self._tensor_list)

    def summarize_for(self, key: str, value: Any, name: str) -> Any:
        """Summary of one value of the record `key` (``parameters_grad``, debug ``save``)."""
        return self.summ.summarize(value, name, self.files_for(key))

    def _hold(self) -> Optional[Held]:
        return [] if self.diff is not None and self.diff.searching else None

    def _values(self, key: str, part: str, values: Any, files: bool, hold: Optional[Held]) -> list:
        """Summaries of a record's positional values (``KEY.part.i``). Value names only name
        tensor files and held values: without either (every statistics task) none is built,
        ~2,000 names a GPT-2 step."""
        if files or hold is not None:
            s = self.summ.summarize
            return [s(v, value_name(key, part, i), files, hold) for i, v in enumerate(values)]
        return self.summ.plain(values)

    def _named(self, key: str, part: str, values: dict, files: bool, hold: Optional[Held]) -> dict:
        """Summaries of a record's named values (``KEY.part.name``: keyword arguments, parameters)."""
        s = self.summ.summarize
        if files or hold is not None:
            return {k: s(v, value_name(key, part, k), files, hold) for k, v in values.items()}
        return {k: s(v, "", False) for k, v in values.items()}

    def _naming(self, key: str) -> Tuple[bool, Optional[Held]]:
        """(tensor files?, held values) for the record `key`; statistics tasks need neither."""
        if self._unnamed:
            return False, None
        return self.files_for(key), self._hold()

    def forward_inputs(self, call: Call, args: Any, kwargs: Optional[dict]) -> None:
        rec: Dict[str, Any] = {}
        if self.want[FORWARD, "input"]:
            key = call.fwd_key
            files, hold = self._naming(key)
            rec["input_args"] = self._values(key, "input", args, files, hold)
            rec["input_kwargs"] = self._named(key, "input", kwargs, files, hold) if kwargs else {}
            if hold is not None and self.diff.inputs_match(key, rec):
                # copies now: the call may still change its inputs in place
                self.diff.hold(key, [(out, name, self.adapter.snapshot(t)) for out, name, t in hold])
        call.record = rec

    def forward_outputs(self, call: Call, output: Any, params: Optional[Dict[str, Any]] = None) -> None:
        rec = call.record if call.record is not None else {}
        key = call.fwd_key
        files, hold = self._naming(key)
        if self.want[FORWARD, "output"]:
            outs = output if isinstance(output, (list, tuple)) else (output,)
            rec["output"] = self._values(key, "output", outs, files, hold)
        if params and self.want[FORWARD, "input"]:
            rec["parameters"] = self._named(key, "parameters", params, files, hold)
        if self.diff is not None:
            held = self.diff.take_held(key)
            if held is not None and hold is not None:
                self._save_if_introduced(call.dump, key, rec, held, hold)
        if self.want[FORWARD, "input"] or self.want[FORWARD, "output"]:
            self._emit(call.dump, key, rec)
            self._construct(call.dump, key, call.parent_key)
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
        key = call.bwd_key
        files, hold = self._naming(key)
        rec: Dict[str, Any] = {}
        if self.want[BACKWARD, "input"]:
            rec["input"] = self._values(key, "input", grads_of_outputs, files, hold)
        if self.want[BACKWARD, "output"]:
            rec["output"] = self._values(key, "output", grads_of_inputs, files, hold)
        if hold is not None:
            self._save_if_introduced(dump, key, rec, [], hold)
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
        self._emit(self.dump, key, self.summarize_for(key, value, key))

    def _save_if_introduced(self, dump: DumpDir, key: str, rec: dict, copies: Held, fresh: Held) -> None:
        """Diff-only dump: the tensors of a record that introduced a difference go to files
        (`copies`: inputs copied before the call ran; `fresh`: values made by the call)."""
        if not self.diff.introduces(key, rec):
            return
        snapshot = self.adapter.snapshot
        for out, name, snap in copies + [(o, n, snapshot(t)) for o, n, t in fresh]:
            out["data_name"] = dump.save_tensor(name, snap)
        self.diff.saved(key)

    # -- output -------------------------------------------------------------------------
    def _emit(self, dump: DumpDir, key: str, rec: Any) -> None:
        """A record whose values are all on the host, with nothing queued before it, is encoded
        now: only its JSON text stays in memory. Queued record dicts live until the next flush,
        long enough to be promoted into Python's oldest GC generation, and every ~100k promoted
        objects make the interpreter run a full collection over the whole training process's
        heap (~0.5 s with torch and transformers loaded)."""
        summ = self.summ
        if not (self._pending or summ.pending or summ.pending_xor or summ.deferred):    # summ.n_pending, inlined
            dump.add_record(key, rec)
        else:
            self._pending.append((dump, key, rec))
        if self.cfg.async_dump:
            if self._flush_due():
                self.flush()
        elif (len(self._pending) >= FLUSH_RECORDS or time.monotonic() - self._last_flush > FLUSH_SECONDS) \
                and not self._device_wait():
            self.flush()            # _flush_due's first case, inlined (once per record)

    def _device_wait(self) -> bool:
        """Statistics waiting on an accelerator: a flush now would be a host sync in the middle of
        the step, which makes the GPU's queue drain and the training wait for every record's Python
        cost. They wait for the step end (its one transfer), as with async_dump, unless too many."""
        summ = self.summ
        return summ.on_device and summ.n_pending <= ASYNC_MAX_PENDING

    def _flush_due(self) -> bool:
        summ = self.summ
        if not self.cfg.async_dump:
            return (len(self._pending) >= FLUSH_RECORDS or time.monotonic() - self._last_flush > FLUSH_SECONDS) \
                and not self._device_wait()
        if summ.deferred_bytes <= ASYNC_MAX_BYTES and summ.n_pending <= ASYNC_MAX_PENDING:
            return False
        if not self._async_warned:
            self._async_warned = True
            warn_user(f"tsprobe: async_dump: more than {ASYNC_MAX_BYTES >> 20} MiB of tensor copies or "
                          f"{ASYNC_MAX_PENDING} tensor summaries waited for the step end; flushed early "
                          "(one host sync) to bound memory. Narrow the dump with list/scope to avoid it.",
                          RuntimeWarning)
        return True

    def _construct(self, dump: DumpDir, key: str, parent: Optional[str]) -> None:
        if self._hierarchy:
            dump.add_construct(key, parent)

    def flush(self, but: Optional[DumpDir] = None) -> None:
        """Queued records into their step folders, and the folders' journal lines to the OS
        (except `but`'s: it is finalized next)."""
        with self._flush_lock:
            n = len(self._pending)      # records appended meanwhile (another thread) stay queued
            self.summ.resolve()         # covers every record among the first n
            dumps: Dict[int, DumpDir] = {} if self.dump is None else {id(self.dump): self.dump}
            for dump, key, rec in self._pending[:n]:
                dump.add_record(key, rec)
                dumps[id(dump)] = dump
            del self._pending[:n]
            for dump in dumps.values():
                if dump is not but:
                    dump.flush()
            self._last_flush = time.monotonic()

    @property
    def has_pending(self) -> bool:
        """Records not yet handed to the OS: queued, or encoded into the journal's buffer."""
        dump = self.dump
        return bool(self._pending) or (dump is not None and dump.unflushed)

    def _late(self, key: str) -> None:
        if not self._late_warned:
            self._late_warned = True
            warn_user(f"tsprobe: gradient for {key} arrived after its step was closed and was not "
                      "recorded; call debugger.step() after loss.backward().", RuntimeWarning)


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
            if col.has_pending and time.monotonic() - col._last_flush > FLUSH_SECONDS and not col._device_wait():
                try:
                    col.flush()
                except Exception:   # never let the helper thread kill the process
                    pass

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
