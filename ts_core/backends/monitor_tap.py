"""Monitor mode's hooks on a model: every step, each submodule call's inputs, outputs and
gradients, and each parameter's gradient, summarised into the step's ``StepLog``.

Leaner than the L0 dump path on purpose (it runs on every training step): no scope, no journal,
no JSON until a capture; statistics are requested from the backend's adapter (device-side or
one native pass, never a per-tensor sync) and resolved once per step by the monitor; a call's
stack is walked only the first time its key is seen. Gradients come from hooks that return None
(nothing changes a gradient bit): each parameter's accumulated gradient and, with
``monitor.backward``, the gradient of each output and input tensor of every call (an input's
total gradient: for an input that several calls share, the sum over them). The hooks are a
client of each model's hook owner (``ts_core/model_hooks.py``); framework specifics come from
the framework's ``ModelAccess``, so torch and MindSpore share this file.

Any exception in a hook goes to ``on_error`` (the monitor warns once and switches itself off):
a monitoring failure never reaches the training loop.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional

from ..dumpfmt import module_base
from ..model_hooks import ModelHook, hooks_of
from ..record.steplog import CallLog, StepLog
from ._depth import DEPTH
from .access import ModelAccess
from .hook_set import HookSet
from .structure import leaves


class MonitorTap:
    def __init__(self, access: ModelAccess, collector: Any, module_prefix: str,
                 on_error: Callable[[BaseException], None], backward: bool):
        self.access = access
        self.module_prefix = module_prefix         # record keys of modules: "Module" / "Cell"
        self.compile_mode = collector.cfg.compile_mode or ""
        self.on_error = on_error
        self.backward = backward                   # module gradient records (hooks on every call)
        col = collector
        self._summarize = col.summ.summarize
        self._summarize_tensor = col.summ.tensor
        self._content_key = col.adapter.content_key      # None: no reuse (MindSpore)
        self._seen: Dict[Any, tuple] = {}          # content key -> (weak ref, summary), this micro-batch
        self._stacks = col.stacks                  # None when the config says stack: false
        self._is_tensor = col.adapter.is_tensor
        self.hooks = HookSet(col)
        self.log: Optional[StepLog] = None         # the step being recorded; None: hooks idle
        self._parent: Dict[str, Optional[str]] = {}     # module base -> its parent module's base
        self._inplace: set = set()                      # bases of modules that overwrite their input
        self._frames: Dict[str, List[List[str]]] = {}   # module base -> frames of its n-th call
        self._param_ids: Dict[tuple, int] = {}          # (module base, name) -> id of the parameter

    # -- lifecycle ----------------------------------------------------------------------------
    def install(self, model: Any) -> None:
        """Hook every submodule of `model` (a model or a list of them); idempotent per model.

        One forward hook per module, run when the call returns: it records inputs, outputs and
        the call's place. The module hierarchy of construct.json is the model's own (a call's
        parent is the module that contains it, whose call is still running), so no pre-hook is
        needed, except on modules that overwrite their input (``ReLU(inplace=True)``), whose
        inputs are summarised before they run."""
        models = model if isinstance(model, (list, tuple)) else [model]
        access = self.access
        for i, m in enumerate(models):
            if not access.is_model(m):
                raise TypeError(f"monitor: expected {access.model_type_name}, got {type(m).__name__}")
            if not self.hooks.hooked.add(m):
                continue
            client = _MonitorHooks(self, None if len(models) == 1 else i)
            self.hooks.handles.append(hooks_of(m, access).add(client))

    def _module_context(self, path: str, name: str, module: Any, bases: Dict[str, str]) -> str:
        """A submodule being hooked: its base, parent, in-place flag and watched parameters."""
        access = self.access
        base = bases[path] = module_base(name, access.class_name(module), self.module_prefix)
        self._parent[base] = _parent_base(path, bases)
        if access.module_is_inplace(module):
            self._inplace.add(base)
        for pname, param in access.own_parameters(module).items():
            if getattr(param, "requires_grad", False):
                self.hooks.watch_param(base, pname, param)
                self._param_ids[(base, pname)] = id(param)
        return base

    def begin(self, log: StepLog) -> None:
        """Record into `log` from now on."""
        if log is not self.log:
            self.hooks.reset()
            self._seen.clear()
        self.log = log

    def pause(self) -> None:
        self.log = None

    def remove(self) -> None:
        self.log = None
        self.hooks.remove()

    def reread_param_grads(self, log: StepLog) -> None:
        """Take each parameter's gradient from where the framework accumulates it (after a
        data-parallel all-reduce or AMP unscaling); MindSpore keeps none: hook values stay."""
        accumulated = self.access.accumulated_grad
        DEPTH.value += 1
        try:
            for base, pname, param in self.hooks.watched_params():
                grad = accumulated(param)
                if grad is not None:
                    log.param_grad(base, pname, id(param), self._summarize(grad, ""))
        finally:
            DEPTH.value -= 1

    # -- hooks --------------------------------------------------------------------------------
    def _pre(self, base: str, module: Any, args: tuple, kwargs: dict) -> None:
        """In-place modules only: their inputs as they were before the call."""
        if self.log is None:
            return None
        DEPTH.value += 1              # our statistics ops are never recorded by API wrappers
        try:
            s = self._value
            inputs = ([s(a) for a in args], {k: s(v) for k, v in kwargs.items()} if kwargs else {})
        except Exception as exc:      # never into the training loop
            self.on_error(exc)
            inputs = None
        finally:
            DEPTH.value -= 1
        self.hooks.calls_in_flight(module).append(inputs)
        return None

    def _post(self, base: str, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        log = self.log
        if log is None:
            return None
        DEPTH.value += 1
        try:
            before = self.hooks.finished_call(module) if base in self._inplace else None
            call = log.begin(base, self._parent[base])
            if call is None:
                return None
            s = self._value
            if before is not None:
                call.inputs, call.kwargs = before
            else:
                call.inputs = [s(a) for a in args]
                if kwargs:
                    call.kwargs = {k: s(v) for k, v in kwargs.items()}
            outs = output if isinstance(output, (list, tuple)) else [output]
            log.forward_done(call, [s(o) for o in outs])
            if self._stacks is not None:
                seen = self._frames.get(base)
                if seen is None:
                    seen = self._frames[base] = []
                if call.index >= len(seen):
                    seen.append(self._capture_stack())
                call.frames = seen[call.index]
            if self.backward and self.access.grad_recording():
                call.in_grads = self._watch_grads(call, (args, kwargs))
                call.out_grads = self._watch_grads(call, output)
        except Exception as exc:
            self.on_error(exc)
        finally:
            DEPTH.value -= 1
        return None

    def _value(self, v: Any) -> Any:
        """The summary of an argument or output. A tensor met earlier in this micro-batch and
        unchanged since (a module's output is the next module's input; same object, same
        version) gets that same summary object: no second pass, no second dict."""
        key_of = self._content_key
        if key_of is not None and self._is_tensor(v):
            key = key_of(v)
            if key is not None:
                hit = self._seen.get(key)
                if hit is not None and hit[0]() is v:
                    return hit[1]
                summary = self._summarize_tensor(v, "")
                self._seen[key] = (weakref.ref(v), summary)
                return summary
        return self._summarize(v, "")

    def _watch_grads(self, call: CallLog, value: Any) -> Optional[List[Any]]:
        """Hook the gradient of each distinct tensor in `value` that can get one; the returned
        slots (one per tensor) are filled as gradients arrive."""
        access = self.access
        tensors = [t for t in leaves(value, self._is_tensor, []) if access.may_get_grad(t)]
        if not tensors:
            return None
        if len(tensors) > 1:
            tensors = list({id(t): t for t in tensors}.values())
        slots: List[Any] = [None] * len(tensors)
        hook = access.grad_hook
        for i, t in enumerate(tensors):
            hook(t, _GradSlot(self, call, slots, i))
        return slots

    def _on_param_grad(self, base: str, pname: str, grad: Any) -> None:
        log = self.log
        if log is None or grad is None:
            return None
        DEPTH.value += 1
        try:
            log.param_grad(base, pname, self._param_ids[(base, pname)], self._summarize(grad, ""))
        except Exception as exc:
            self.on_error(exc)
        finally:
            DEPTH.value -= 1
        return None

    def _capture_stack(self) -> List[str]:
        """The frames of the call being hooked (walked once per module call index: a training
        step makes the same calls from the same lines every time)."""
        sid, _ = self._stacks.capture()
        return self._stacks.frames_of(sid)



class _MonitorHooks(ModelHook):
    """The monitor's hooks on one model (a client of its hook owner): one forward hook per
    submodule, a pre-hook on in-place ones only, a hook per parameter gradient."""

    submodules = True

    def __init__(self, tap: MonitorTap, index: Optional[int]):
        self.compile_mode = tap.compile_mode
        self.pre_forward = tap._pre
        self.post_forward = tap._post
        self.param_grad = tap._on_param_grad
        self._tap = tap
        self._index = index
        self._bases: Dict[str, str] = {}

    def module_context(self, path: str, module: Any) -> str:
        name = path if self._index is None else f"{self._index}.{path}"
        return self._tap._module_context(path, name, module, self._bases)

    def pre_forward_on(self, ctx: str, module: Any) -> bool:
        return ctx in self._tap._inplace


class _GradSlot:
    """The gradient hook of one tensor of one call: fills slot `i` (one small object per hook)."""

    __slots__ = ("tap", "call", "slots", "i")

    def __init__(self, tap: MonitorTap, call: CallLog, slots: List[Any], i: int):
        self.tap, self.call, self.slots, self.i = tap, call, slots, i

    def __call__(self, grad: Any) -> None:
        call = self.call
        if call.log.closed or grad is None:
            return None
        DEPTH.value += 1
        try:
            call.grad(self.slots, self.i, self.tap._summarize(grad, ""))
        except Exception as exc:
            self.tap.on_error(exc)
        finally:
            DEPTH.value -= 1
        return None                   # a hook's return value would replace the gradient


def _parent_base(path: str, bases: Dict[str, str]) -> Optional[str]:
    """The base of the closest hooked module containing `path` (None: a child of the root)."""
    while "." in path:
        path = path.rsplit(".", 1)[0]
        if path in bases:
            return bases[path]
    return None
