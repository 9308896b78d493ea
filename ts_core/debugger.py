"""PrecisionDebugger: lifecycle, step and rank gating, one per process (msprobe's singleton).

Typical loop (msprobe-compatible)::

    debugger = PrecisionDebugger(config_path="config.json")
    for batch in data:
        debugger.start(model)
        loss = model(batch).sum(); loss.backward()
        debugger.stop()           # before the optimizer: its in-place ops are not the model's
        optimizer.step()
        debugger.step()           # monitor mode: debugger.step(loss=loss)
"""
from __future__ import annotations

import atexit
import os
import sys
import weakref
from dataclasses import replace
from typing import Any, List, Optional, Sequence

from .backends import framework_of, load_backend
from .backends.base import Backend
from .config import DebuggerConfig, build_config, check_paths
from .dumpfmt import debug_key
from .errors import AnomalyError, ConfigError, warn_user
from .hot_reload import ConfigWatcher
from .monitor import Monitor
from .record.collector import Collector


class _Switch:
    """The one flag every hook reads first: are we collecting right now?"""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active = False


class PrecisionDebugger:
    """One per process, as msprobe's (a singleton): ``PrecisionDebugger(...)`` with the arguments
    of the open debugger returns that debugger, so a script may build it in several places.
    Unlike msprobe, other arguments are not ignored silently: the new debugger replaces the open
    one, which is closed (its step written) with a warning, and the old object's later calls
    say so. ``close()`` ends the process's debugger; ``current()`` returns it."""

    _current: Optional["PrecisionDebugger"] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> "PrecisionDebugger":
        prev = cls._current
        if prev is not None and not prev._closed and type(prev) is cls and prev._args == _args_key(args, kwargs):
            return prev
        return super().__new__(cls)

    def __init__(self, config_path: Optional[str] = None, task: Optional[str] = None,
                 dump_path: Optional[str] = None, level: Optional[str] = None,
                 step: Optional[Sequence[int]] = None, **overrides: Any):
        if self is PrecisionDebugger._current and not self._closed:
            return                  # the process's debugger, asked for again with its own arguments
        self._args = _args_key((config_path, task, dump_path, level, step), overrides)
        self._replaced_by = ""
        overrides.update(task=task, dump_path=dump_path, level=level, step=step)
        self.config: DebuggerConfig = build_config(config_path, **overrides)
        check_paths(self.config)
        # dump_enable in the file: the file is watched at step boundaries (hot_reload.py)
        self._watcher = ConfigWatcher(config_path, overrides) \
            if config_path and self.config.dump_enable is not None else None
        self.current_step = 0
        self._switch = _Switch()
        self._module_dump_switch = _Switch()     # module_dump(): only that module records
        self._module_dumping = False
        self._models: List[Any] = []             # weak refs to the last model(s) given to start()
        self._collector: Optional[Collector] = None
        self._backend: Optional[Backend] = None
        self._in_window = False          # between start() and stop()
        self._closed = False
        self._token_range: Optional[tuple] = None
        self._iteration = 0
        self._debug_counts: dict = {}
        self._debug_dump: Any = None        # the step folder the counts number keys in
        self._warned: set = set()
        self._keep_installed = False     # prepare(): patches stay until close()
        self._steps_begun: set = set()   # steps start() was called in: a requested step not among them never came
        atexit.register(_never_came_at_exit, weakref.ref(self))
        self._monitor: Optional[Monitor] = Monitor(self.config) if self.config.monitor is not None else None
        prev = PrecisionDebugger._current
        if prev is not None and not prev._closed:
            prev._replaced_by = _caller()
            warn_user(f"tsprobe: a PrecisionDebugger with other arguments ({_caller()}) replaces the open one "
                      "(one per process, as in msprobe): the first is closed and its dump finished. Call "
                      "close() on the first before creating another to silence this.")
            prev.close()
        PrecisionDebugger._current = self

    # -- lifecycle ----------------------------------------------------------------------
    def start(self, model: Any = None, token_range: Optional[Sequence[int]] = None) -> None:
        """Begin (or resume) collecting for the current step; no-op outside configured steps/ranks."""
        self._check_open()
        if token_range is not None:
            token_range = self._check_token_range(model, token_range)
        if self._collector is None or self._collector.dump is None:
            self._poll_config()         # a step boundary: no step folder is open
        if model is not None:
            self._remember(model)
        elif self._backend is None:
            model = self._remembered()      # the model of before a config reload
        if self._monitor is not None:
            self._monitor.start(self.current_step, model)
        self._steps_begun.add(self.current_step)
        if self.config.dump_enable is False or not self.config.collects_step(self.current_step):
            return
        if self._backend is None:
            self._make_backend(model)
        rank = self._backend.rank()
        if not self.config.collects_rank(rank):
            return
        col = self._collector
        if col.dump is None or col.step != self.current_step:
            col.open_step(self.current_step, rank)
            self._backend.new_step()
            self._iteration = 0             # token_range: each step counts from its own prefill
        if self._backend.needs_model(model):
            self._warn_once("model", f"level {self.config.level} records modules only when the model is "
                            "passed: call debugger.start(model).")
        self._backend.install(model)
        if self.config.fingerprint:        # what this run was given, for tsprobe config-check
            from .configcheck.collect import on_start

            try:
                on_start(self, model, self._collector.adapter)
            except Exception as exc:    # an aid for config-check: never the reason a run stops
                self._warn_once("fingerprint", f"recording the run fingerprint failed ({exc!r}); "
                                "training goes on without it (set fingerprint: false to skip it).")
        if token_range is not None:
            if self._token_range is None:
                self._backend.watch_iterations(model if not isinstance(model, (list, tuple)) else model[0],
                                               self._iteration_begin, self._iteration_end)
            self._token_range = token_range
        self._in_window = True
        self._set_switches(self.config.level != "debug" and self._token_range is None)

    def stop(self) -> None:
        """Stop collecting; everything collected so far is written as complete JSON files."""
        if self._monitor is not None:
            self._monitor.pause()
        if self._collector is None or not self._in_window:
            return
        self._in_window = False
        self._set_switches(False)
        self._backend.end_step()
        self._note_what_the_dump_cannot_hold()
        self._collector.finalize()
        if self.config.fingerprint:     # what the first forward did not write (collect.py)
            from .configcheck.collect import on_stop

            on_stop(self)

    forward_backward_dump_end = stop

    def _note_what_the_dump_cannot_hold(self) -> None:
        """A dump is never empty in silence: what the backend says the step's dump cannot hold (a
        model compiled as a whole) goes into its dump.json (``notes``, which compare repeats) and,
        once per debugger, into a warning."""
        dump = self._collector.dump
        notes = self._backend.step_notes() if dump is not None else []
        if not notes:
            return
        held = dump.header.setdefault("notes", [])
        held.extend(n for n in notes if n not in held)
        if not getattr(self, "_notes_warned", False):
            self._notes_warned = True
            warn_user(f"tsprobe: step {self.current_step}: {notes[0]}", RuntimeWarning)

    def step(self, loss: Any = None) -> None:
        """End the step: flush and close its folder, then count the next step. Monitor mode:
        `loss` is the step's loss (as ``observe_loss(loss)``); the monitor checks the step and
        may capture it (``monitor.on_trigger: raise`` then raises AnomalyError, dumps written)."""
        self._check_open()
        if loss is not None:
            self.observe_loss(loss)
        self.stop()
        self._close_step()
        capture = self._monitor.end_step() if self._monitor is not None else None
        if capture is not None:
            self._after_capture(capture)
        self.current_step += 1
        self._poll_config()
        last = self.config.last_step
        if last is not None and self.current_step > last and self._backend is not None \
                and not self._keep_installed:
            self._backend.close()       # nothing left to collect: restore everything now
            self._collector.shutdown()
        if capture is not None and self.config.monitor.on_trigger == "raise":
            raise AnomalyError(capture)

    def prepare(self, model: Any = None) -> None:
        """Install every patch and hook now, collecting nothing, and keep them until close()
        (no restore after the last configured step). For callbacks inside frameworks that
        compare torch function identities over a run (Lightning's ``self.log``)."""
        self._check_open()
        if self._monitor is not None:
            self._monitor.watch(model)
            mon = self.config.monitor
            if not self.config.step and not mon.after_steps:
                return                  # monitor only: no regular dump can ever happen
        if self._backend is None:
            self._make_backend(model)
        self._backend.install(model)
        self._remember(model)
        self._keep_installed = True

    def record_param_grads(self) -> None:
        """Take ``parameters_grad`` of the hooked modules from their parameters' current
        ``.grad`` (replacing what backward captured), e.g. after AMP unscaling or a data-parallel
        all-reduce. Written at the next stop()/step(); only while a step folder is open."""
        if self._collector is not None and self._collector.dump is not None:
            self._backend.capture_param_grads()
        if self._monitor is not None:
            self._monitor.capture_param_grads()

    def set_init_step(self, step: int) -> None:
        """msprobe's name: the step number a resumed run starts at."""
        if not _is_step_number(step):
            raise ConfigError("init_step", step, "use a non-negative int")
        self.current_step = step

    def set_step(self, step: int) -> None:
        """Number the step being collected: the next ``start()`` records into ``step{step}``.
        For integrations whose trainer owns the step count (a Trainer's ``global_step``)."""
        if not _is_step_number(step):
            raise ValueError(f"set_step(step): got {step!r}; use a non-negative int "
                             "(the 0-based step number)")
        self.current_step = step

    def close(self) -> None:
        """Finish the current step's files, remove every hook and restore every patch."""
        if self._closed:
            return
        try:
            self.stop()
            self._close_step()
        finally:        # a write error raised above (on_write_error: raise) still restores everything
            self._closed = True
            self._say_steps_never_came()
            self._debug_dump = None
            from .configcheck.collect import on_close

            on_close(self)
            if PrecisionDebugger._current is self:
                PrecisionDebugger._current = None
            try:
                if self._monitor is not None:
                    self._monitor.close()
            finally:
                if self._backend is not None:
                    self._backend.close()
                    self._collector.shutdown()

    def __enter__(self) -> "PrecisionDebugger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- monitor mode ------------------------------------------------------------------------
    def observe_loss(self, loss: Any) -> None:
        """Monitor mode: the loss of the current step (a tensor, left on its device, or a number);
        several calls in one step (micro-batches) count as their mean. No-op without a monitor."""
        if self._monitor is not None:
            self._monitor.observe_loss(loss)

    @property
    def monitor(self) -> Optional[Monitor]:
        """The monitor (config section ``monitor``), or None: its ``captures``, ``ring``..."""
        return self._monitor

    @property
    def should_stop(self) -> bool:
        """True once a monitor capture asked training to stop (``monitor.on_trigger: stop``);
        the integrations stop their trainer, a hand-written loop checks it."""
        return self._monitor is not None and self._monitor.should_stop

    def wants_step(self, step: int) -> bool:
        """Will ``start()`` at `step` do anything: a configured dump, or monitoring?"""
        return self.config.collects_step(step) or (self._monitor is not None and not self._monitor.disabled)

    def _after_capture(self, capture: dict) -> None:
        """``monitor.after_steps``: the steps after a capture are dumped as configured steps."""
        n = self.config.monitor.after_steps
        if n:
            k = capture["step"]
            self.config = replace(self.config, step=sorted(set(self.config.step) | set(range(k + 1, k + 1 + n))))

    # -- what integrations may ask ------------------------------------------------------------
    @classmethod
    def current(cls) -> Optional["PrecisionDebugger"]:
        """The debugger of this process that is not closed (the latest one created), or None."""
        dbg = cls._current
        return dbg if dbg is not None and not dbg._closed else None

    def is_hooked(self, model: Any = None) -> bool:
        """Whether `model` (with None: any model) carries this debugger's module hooks (level L0
        or mix, after ``start(model)``/``prepare(model)``). Always False once closed."""
        return self._backend is not None and not self._closed and self._backend.is_hooked(model)

    # -- per-forward control for integrations (token ranges of batched inference engines) -----
    @property
    def in_window(self) -> bool:
        """True between start() and stop() when the current step and rank are collected."""
        return self._in_window

    def set_collecting(self, on: bool) -> None:
        """Switch collection on or off inside the start()/stop() window, e.g. per forward of an
        inference engine whose forwards are not one token each. No effect outside the window."""
        self._set_switches(bool(on) and self._in_window and self.config.level != "debug")

    @property
    def open_dump_dir(self) -> Optional[str]:
        """The step/rank folder being written now, or None."""
        col = self._collector
        return col.dump.path if col is not None and col.dump is not None else None

    def record_keys(self) -> list:
        """Keys recorded so far in the open step folder, in recording order (flushes first)."""
        col = self._collector
        if col is None or col.dump is None:
            return []
        col.flush()
        return list(col.dump.data)

    def bind(self, model: Any) -> None:
        """Choose the framework backend from `model` now, without collecting (for integrations
        that learn the model before the first ``start``). No-op once a backend is chosen."""
        self._check_open()
        if self._backend is None:
            self._make_backend(model)

    # -- debug level ----------------------------------------------------------------------
    def save(self, variable: Any, name: str, save_backward: bool = True) -> None:
        """Level ``debug``: record `variable` as ``{name}.{n}.debug`` (and its gradient as
        ``{name}_grad.{n}.debug`` when it arrives)."""
        self._check_open()
        if not isinstance(name, str) or not name:
            raise TypeError("save(variable, name): name must be a non-empty string")
        if self.config.level != "debug":
            self._warn_once("save", "debugger.save() records only at level 'debug'; set level: debug.")
            return
        if self.config.dump_enable is False or not self.config.collects_step(self.current_step):
            return
        if self._backend is None:
            self._make_backend(None, variable)
        col = self._collector
        rank = self._backend.rank()
        if not self.config.collects_rank(rank):
            return
        if col.dump is None or col.step != self.current_step:
            col.open_step(self.current_step, rank)
        if col.dump is not self._debug_dump:     # numbering restarts in every step folder,
            self._debug_dump = col.dump          # also one that start() opened
            self._debug_counts.clear()
        n = self._debug_counts.get(name, 0)
        self._debug_counts[name] = n + 1
        col.save_value(debug_key(name, n), variable)
        if save_backward:
            self._backend.save_backward(debug_key(f"{name}_grad", n), variable)

    # -- one module as a whole (msprobe's module_dump) --------------------------------------
    def module_dump(self, module: Any, dump_name: str) -> None:
        """Until ``module_dump_end()``, record only `module` itself, as one module record
        ``Module.{dump_name}.{Class}.forward.{n}`` (and its backward), whatever the level: no
        API call and no other module is recorded meanwhile, including the ones inside it.
        Records only between ``start()`` and ``stop()``, like everything else."""
        self._check_open()
        if not isinstance(dump_name, str) or not dump_name:
            raise TypeError(f"module_dump(module, dump_name): dump_name must be a non-empty string, "
                            f"got {dump_name!r}")
        if self._backend is None:
            self._make_backend(module)
        self._backend.module_dump(module, dump_name, self._module_dump_switch)
        self._module_dumping = True
        self._set_switches(False)

    def module_dump_end(self) -> None:
        """End ``module_dump``: everything the config selects is recorded again."""
        self._module_dumping = False
        self._set_switches(self._in_window and self.config.level != "debug" and self._token_range is None)

    # -- custom APIs ----------------------------------------------------------------------
    def register_custom_api(self, module: Any, api_name: str, api_prefix: Optional[str] = None) -> None:
        self._check_open()
        if self._backend is None:
            self._make_backend(None)
        self._backend.register_custom_api(module, api_name, api_prefix)

    def restore_custom_api(self, module: Any, api_name: str) -> None:
        if self._backend is None:
            raise ValueError(f"restore_custom_api: '{api_name}' was never registered")
        self._backend.restore_custom_api(module, api_name)

    # -- internals ------------------------------------------------------------------------
    @property
    def dump_dirs(self) -> list:
        """Every step/rank folder written so far."""
        return list(self._collector.dump_dirs) if self._collector else []

    def _make_backend(self, model: Any, sample: Any = None) -> None:
        """Choose the backend from the model (or a value handed to ``save``), else the config."""
        probe = model
        if probe is None and sample is not None and not self.config.framework:
            probe = _first_leaf(sample)
        try:
            framework = framework_of(probe, self.config.framework)
        except TypeError:
            framework = framework_of(None, self.config.framework)
        backend_cls = load_backend(framework)
        self._collector = Collector(self.config, backend_cls.adapter_class(), backend_cls.skip_dirs)
        self._backend = backend_cls(self.config, self._collector, self._switch)

    def _close_step(self) -> None:
        if self._collector is not None and self._collector.dump is not None:
            self._backend.end_step()
            dump = self._collector.dump
            self._collector.close_step()
            if self._collector.dump_dirs and _is_main_rank(self._collector.rank):
                where = self._collector.dump_dirs[-1]
                done = (f": writing the dump to {where} failed (see the warning above); it is incomplete or "
                        f"missing") if getattr(dump, "incomplete", False) else f" dumped to {where}"
                print(f"[tsprobe] step {self.current_step}{done}", file=sys.stderr)

    def _set_switches(self, collecting: bool) -> None:
        """Normal collection on/off; during module_dump only that module's hooks record."""
        self._switch.active = collecting and not self._module_dumping
        self._module_dump_switch.active = self._module_dumping and self._in_window

    # -- dump_enable hot switch (hot_reload.py) ----------------------------------------------
    def _poll_config(self) -> None:
        """At a step boundary: take up an edited config file (one stat when it is unchanged)."""
        if self._watcher is None:
            return
        new = self._watcher.poll()
        if new is None:
            return
        if isinstance(new, ConfigError):
            warn_user(f"tsprobe: {self._watcher.path} changed but is not valid ({new}); dumping is off "
                      "until it is fixed", RuntimeWarning)
            new = replace(self.config, dump_enable=False)
        elif new.dump_enable is None:       # msprobe: deleting dump_enable keeps the current state
            new = replace(new, dump_enable=self.config.dump_enable)
        if replace(self.config, dump_enable=new.dump_enable) != new and self._backend is not None:
            # more than the switch changed: new hooks and collector at the next start()
            self._close_step()
            self._backend.close()
            self._collector.shutdown()
            self._backend = self._collector = None
            self._debug_counts.clear()
            self._token_range = None
        self.config = new

    def _remember(self, model: Any) -> None:
        models = model if isinstance(model, (list, tuple)) else [model]
        try:
            self._models = [weakref.ref(m) for m in models]
        except TypeError:
            self._models = []

    def _remembered(self) -> Any:
        models = [r() for r in self._models]
        if not models or any(m is None for m in models):
            return None
        return models if len(models) > 1 else models[0]

    def _iteration_begin(self) -> None:
        lo, hi = self._token_range
        self._set_switches(self._in_window and lo <= self._iteration <= hi)

    def _iteration_end(self) -> None:
        self._iteration += 1
        self._set_switches(False)

    def _check_token_range(self, model: Any, token_range: Sequence[int]) -> tuple:
        if model is None:
            raise ValueError("start(token_range=...) needs the model: start(model, token_range=[s, e])")
        if (not isinstance(token_range, (list, tuple)) or len(token_range) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in token_range)
                or token_range[0] > token_range[1]):
            raise ValueError(f"token_range must be [start, end] with 0 <= start <= end, got {token_range!r}")
        return tuple(token_range)

    def never_came(self) -> List[int]:
        """The requested steps (config ``step``) in which start() was never called: the run ended,
        or its step numbering jumped, before them."""
        return [s for s in self.config.step if s not in self._steps_begun]

    def _say_steps_never_came(self) -> None:
        """One line at close (or process end) naming the requested steps that never came, on the
        main rank: `step=[1, 3]` in a 2-step run otherwise ends with no word about step 3."""
        missing = self.never_came()
        rank = self._collector.rank if self._collector is not None else None
        if rank is None and os.environ.get("RANK", "0").isdigit():
            rank = int(os.environ.get("RANK", "0")) or None    # no step collected: the launcher's rank
        if not missing or not _is_main_rank(rank):
            return
        shown = ", ".join(map(str, missing[:10])) + (f" ... ({len(missing)} steps)" if len(missing) > 10 else "")
        seen = f"the last step begun was {max(self._steps_begun)}" if self._steps_begun else "start() was never called"
        print(f"[tsprobe] requested step{'s' if len(missing) > 1 else ''} {shown} never came ({seen}): nothing "
              f"was dumped for {'them' if len(missing) > 1 else 'it'}", file=sys.stderr)

    def _check_open(self) -> None:
        if self._closed:
            if self._replaced_by:
                raise RuntimeError(f"this PrecisionDebugger was closed when another one was created ({self._replaced_by}): "
                                   "tsprobe keeps one debugger per process, as msprobe; use the newer one "
                                   "(PrecisionDebugger.current())")
            raise RuntimeError("this PrecisionDebugger was closed; create a new one")

    def _warn_once(self, tag: str, message: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            warn_user(f"tsprobe: {message}")


_PARAMS = ("config_path", "task", "dump_path", "level", "step")


def _args_key(args: tuple, kwargs: dict) -> str:
    """The constructor's arguments as one comparable value (a second ``PrecisionDebugger(...)``
    with the same ones returns the open debugger)."""
    named = dict(zip(_PARAMS, args))
    named.update(kwargs)
    if named.get("config_path") is not None:
        named["config_path"] = os.path.abspath(os.fspath(named["config_path"]))
    return repr(sorted((k, v) for k, v in named.items() if v is not None))


def _caller() -> str:
    """file:line of the user's code that created a debugger (outside ts_core/ts_integrations)."""
    here = os.path.dirname(os.path.abspath(__file__))
    tools = (here + os.sep, os.path.join(os.path.dirname(here), "ts_integrations") + os.sep)
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(tools):
        f = f.f_back
    return f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else "unknown place"


def _never_came_at_exit(ref: "weakref.ref[PrecisionDebugger]") -> None:
    """At process end, a debugger never closed still says which requested steps never came."""
    dbg = ref()
    if dbg is not None and not dbg._closed:
        dbg._say_steps_never_came()


def _is_step_number(step: Any) -> bool:
    return isinstance(step, int) and not isinstance(step, bool) and step >= 0


def _first_leaf(value: Any) -> Any:
    while isinstance(value, (list, tuple, dict)) and value:
        value = next(iter(value.values())) if isinstance(value, dict) else value[0]
    return value


def _is_main_rank(rank: Optional[int]) -> bool:
    return rank in (None, 0) and os.environ.get("TSPROBE_QUIET") != "1"
