"""The backend contract: everything a framework backend does the same way lives here.

The base owns the decisions and the flow: which levels wrap APIs and which hook modules, the
model-type check, installing and closing, custom API registration, the body of every API
wrapper and of every module pre/post hook, debug-level gradient saves and parameter-gradient
capture. A framework backend (``torch/``, ``mindspore/``) sets a few class attributes and
implements the ``*_impl`` methods: its gradient captures and taps, how outputs are watched, its
own patches and per-step state. What a model of the framework is and how a hook goes on it is the framework's
``ModelAccess`` (``access_class``); every module hook goes on through the model's hook owner
(``ts_core/model_hooks.py``), the dump's module records, ``module_dump`` and the token-range
iteration hooks being three of its clients. The debugger talks to a backend only through the
public methods declared here; the ``*_impl`` methods are called by this class alone.
"""
from __future__ import annotations

import abc
import functools
from typing import Any, Callable, ClassVar, Dict, Iterator, Optional, Tuple, Type

from ..dumpfmt import module_base
from ..model_hooks import ModelHook, hooks_of
from ._depth import DEPTH, internal
from .access import ModelAccess
from .callers import CallerFilter
from .hook_set import HookSet
from .patching import ApiPatcher
from .structure import leaves

API_LEVELS = ("L1", "mix")        # levels that wrap framework APIs
MODULE_LEVELS = ("L0", "mix")     # levels that hook the model's modules / Cells


def is_inplace(name: str, kwargs: dict) -> bool:
    """Does the API `name` write into its first argument (``add_``, ``__iadd__``, ``out=``)?"""
    if name.startswith("__i") or name == "__setitem__":
        return True
    if name.endswith("_") and not name.endswith("__"):
        return True
    return bool(kwargs.get("inplace")) or kwargs.get("out") is not None


def _depth_above(stack: list, call: Any) -> Optional[int]:
    """The module-stack depth just above `call` (by identity); None when it is not on the stack."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is call:
            return i + 1
    return None


class Backend(abc.ABC):
    """One debugger's hooks into one framework; a subclass per framework (see the module doc)."""

    adapter_class: ClassVar[type]               # the collector's TensorAdapter (its .framework names us)
    access_class: ClassVar[Type[ModelAccess]]   # the framework's models and hooks
    skip_dirs: ClassVar[Tuple[str, ...]]        # framework folders left out of stack.json
    api_patcher_class: ClassVar[Type[ApiPatcher]]     # which APIs exist and how they are wrapped
    module_prefix: ClassVar[str]                # record keys of modules: "Module" / "Cell"
    # A module's input gradients are observed through per-use taps that the API wrappers place
    # inside it (MindSpore: a tap at the module's own inputs would pre-sum their uses). Then
    # the module levels wrap APIs too; at L0 those wrappers record nothing, they only tap.
    module_grads_from_uses: ClassVar[bool] = False
    # Framework code whose own API calls are machinery, not the user's program (callers.py): run,
    # not recorded. Frames under ``transparent_dirs`` (wrappers between the user and an API) are
    # looked through to find the caller.
    internal_dirs: ClassVar[Tuple[str, ...]] = ()
    transparent_dirs: ClassVar[Tuple[str, ...]] = ()
    # True while activation checkpointing re-runs a forward during backward to rebuild what it
    # did not keep: those calls repeat recorded ones (whose backward records come from the
    # first run's graph) and are not recorded again. None: the framework has no such re-run.
    recomputing: ClassVar[Optional[Callable[[], bool]]] = None

    def __init__(self, cfg: Any, collector: Any, switch: Any):
        self.cfg = cfg
        self.collector = collector
        self.switch = switch
        self.access = self.access_class()
        self._grad_recording = self.access.grad_recording      # hot: bound once
        self.want_backward = bool(collector.want["backward", "input"] or collector.want["backward", "output"])
        self.hooks = HookSet(collector)
        self.module_dumps = HookSet(collector)       # msprobe's module_dump: one module as a whole
        self._module_dump_names: Dict[int, str] = {}
        self.apis = self.api_patcher_class(self.api_runner, switch)
        self._aliasing = self.apis.aliasing
        self._collective_prefixes = self.apis.collective_prefixes
        self._apis_installed = False
        self._callers = CallerFilter(self.internal_dirs, self.transparent_dirs) if self.internal_dirs else None

    @property
    def framework(self) -> str:
        """The framework as dump.json names it: ``pytorch`` / ``mindspore``."""
        return self.adapter_class.framework

    # -- what the level asks for ------------------------------------------------------------
    @property
    def wraps_apis(self) -> bool:
        return self.cfg.level in API_LEVELS

    @property
    def hooks_modules(self) -> bool:
        return self.cfg.level in MODULE_LEVELS

    @property
    def patches_apis(self) -> bool:
        """APIs are wrapped: to record them (L1, mix), or only to tap the uses of module inputs
        (L0 of a backend with ``module_grads_from_uses``)."""
        return self.wraps_apis or (self.hooks_modules and self.module_grads_from_uses)

    @property
    def api_runner(self) -> Callable:
        """What the API wrappers call: the recording body, or the tap-only body at L0."""
        return self.run_api if self.wraps_apis else self.run_api_taps_only

    @property
    def model_type_name(self) -> str:
        """For errors: ``torch.nn.Module``."""
        return self.access.model_type_name

    def class_name(self, module: Any) -> str:
        """The class a module's records are named after: the user's class, also when a
        parallelism wrapper replaced it by a subclass of its own (FSDP2's ``FSDPBlock``)."""
        return self.access.class_name(module)

    def needs_model(self, model: Any) -> bool:
        """True when the level records modules but none is hooked and `model` is None."""
        return self.hooks_modules and model is None and not self.hooks.hooked

    def is_hooked(self, model: Any = None) -> bool:
        """Whether `model` (with None: any model) carries this backend's module hooks."""
        return bool(self.hooks.hooked) if model is None else model in self.hooks.hooked

    # -- lifecycle ----------------------------------------------------------------------------
    def install(self, model: Any = None) -> None:
        """Wrap the APIs the level asks for (once) and hook `model` (a model or a list of them)."""
        self._check_runtime_impl()
        if model is None:
            if self.wraps_apis:
                self._install_apis()
            return
        models = model if isinstance(model, (list, tuple)) else [model]
        for m in models:
            if not self.access.is_model(m):
                raise TypeError(f"start(model=...) expects {self.model_type_name}, got {type(m).__name__}")
        if self.patches_apis:
            self._install_apis()
        for i, m in enumerate(models):
            if self.hooks_modules:
                self._hook_model(m, index=i if len(models) > 1 else None)
            if self.patches_apis:
                self._wrap_model_calls_impl(m)
                self.apis.wrap_held(m, self._model_objects)

    def _install_apis(self) -> None:
        if not self._apis_installed:
            self.apis.install()
            self._apis_installed = True

    def _model_objects(self, model: Any) -> Iterator[Any]:
        """`model` and every submodule: where attributes holding API functions are looked for."""
        yield model
        for _, m in self.access.submodules(model):
            yield m

    def watch_iterations(self, model: Any, on_begin: Callable[[], None], on_end: Callable[[], None]) -> None:
        """Call on_begin/on_end around every forward of the root model (token ranges)."""
        client = _Iterations(on_begin, on_end, self.cfg.compile_mode)
        self.hooks.handles.append(hooks_of(model, self.access).add(client))

    def new_step(self) -> None:
        self.hooks.reset()
        self._new_step_impl()

    def end_step(self) -> None:
        """The step's collection pauses: complete what backward left open, record parameter gradients."""
        with internal():
            self._end_step_impl()
            self.hooks.emit_param_grads()

    def capture_param_grads(self) -> None:
        """Take ``parameters_grad`` from the hooked parameters' current accumulated gradients
        (the latest value wins). A framework whose parameters carry no accumulated gradient
        (MindSpore: gradients are returned, not stored) keeps what its hooks saw."""
        with internal():
            # re-read for real: an all-reduce since backward wrote in place without a version bump
            self.collector.forget_seen_values()
            self.hooks.forget_grads_seen()
            for base, pname, param in self.hooks.watched_params():
                self._on_param_grad(base, pname, self.access.accumulated_grad(param))

    def step_notes(self) -> list:
        """What a reader of this step's dump must know about what it cannot hold (a model that
        ran where hooks cannot see), in words with the option that changes it; [] when nothing."""
        return self._step_notes_impl()

    def rank(self) -> Optional[int]:
        """This process's rank in the framework's distributed group; None when not distributed."""
        return self.access.rank()

    def register_custom_api(self, module: Any, api_name: str, api_prefix: Optional[str] = None) -> None:
        self.apis.register(module, api_name, api_prefix)

    def restore_custom_api(self, module: Any, api_name: str) -> None:
        self.apis.unregister(module, api_name)

    def module_dump(self, module: Any, dump_name: str, gate: Any) -> None:
        """Hook `module` itself as ``{prefix}.{dump_name}.{Class}``, recording while
        ``gate.active`` (the debugger turns every other hook off meanwhile). Idempotent per
        module and name; a new name replaces the module's old module_dump hooks."""
        self._check_runtime_impl()
        if not self.access.is_model(module):
            raise TypeError(f"module_dump(module, ...) expects {self.model_type_name}, got {type(module).__name__}")
        if self._module_dump_names.get(id(module)) == dump_name and module in self.module_dumps.hooked:
            return
        if module in self.module_dumps.hooked:
            self.module_dumps.remove()          # only module_dump hooks live here: re-hook the others
            self._module_dump_names.clear()
        self.module_dumps.hooked.add(module)
        self._module_dump_names[id(module)] = dump_name
        client = _ModuleRecords(self, gate, self.module_dumps, submodules=False,
                                name=lambda path, m: dump_name, param_grads=False)
        self.module_dumps.handles.append(hooks_of(module, self.access).add(client))

    def close(self) -> None:
        """Restore every patched function and remove every hook."""
        self.apis.restore()
        self._close_impl()
        self.hooks.remove()
        self.module_dumps.remove()
        self._module_dump_names.clear()
        self._apis_installed = False

    # -- debug level --------------------------------------------------------------------------
    def save_backward(self, key: str, variable: Any) -> None:
        """Debug-level save: record the gradients of `variable`'s tensors (the first complete
        set) under `key` when backward delivers them."""
        is_tensor = self.collector.adapter.is_tensor
        tensors = [t for t in leaves(variable, is_tensor, []) if self.access.may_get_grad(t)]
        if not tensors or not self._grad_recording():
            return
        grads: Dict[int, Any] = {}
        col = self.collector

        def make_hook(i: int) -> Callable[[Any], None]:
            def hook(grad: Any) -> None:
                with internal():
                    if i in grads:
                        return None
                    grads[i] = grad
                    if len(grads) == len(tensors):
                        ordered = [grads[j] for j in range(len(tensors))]
                        col.save_value(key, ordered[0] if is_tensor(variable) else ordered)
                return None
            return hook

        for i, t in enumerate(tensors):
            self.access.grad_hook(t, make_hook(i))

    # -- the API wrapper's body (L1) ----------------------------------------------------------
    def run_api(self, orig: Callable, base: str, name: str, args: tuple, kwargs: dict,
                inplace: Optional[bool] = None) -> Any:
        """Record one API call: inputs before it runs, outputs after, gradients when they come.
        `inplace` None: decided from the name and arguments."""
        DEPTH.value += 1
        try:
            if self._callers is not None and self._callers.internal_call():
                return orig(*args, **kwargs)
            if self.recomputing is not None and self.recomputing():
                return orig(*args, **kwargs)
            col = self.collector
            call = col.begin(base, is_module=False)
            if not call.selected:
                try:
                    return orig(*args, **kwargs)
                finally:
                    col.end(call)
            capture = self._new_capture(call)
            run_args, run_kwargs = args, kwargs
            if capture is not None:
                if inplace is None:
                    inplace = is_inplace(name, kwargs)
                if not inplace and not base.startswith(self._collective_prefixes):
                    # Before summarising, so a tap never waits for the statistics ops.
                    if name not in self._aliasing:
                        run_args, run_kwargs = capture.before_call(args, kwargs)
                    else:
                        run_args, run_kwargs = self._before_aliasing_call_impl(capture, args, kwargs)
            col.forward_inputs(call, args, kwargs)
            try:
                out = orig(*run_args, **run_kwargs)      # still at depth > 0: nested APIs are not recorded
            finally:
                col.end(call)
            if capture is not None:
                out = self._returned_impl(capture, out)
                self._watch_api_outputs_impl(capture, out, run_args, run_kwargs, bool(inplace))
            col.forward_outputs(call, out)
            return out
        finally:
            DEPTH.value -= 1
            if base.startswith(self._collective_prefixes):
                # a collective wrote into its tensors without moving their version counters
                self.collector.forget_seen_values()

    def run_api_taps_only(self, orig: Callable, base: str, name: str, args: tuple, kwargs: dict,
                          inplace: Optional[bool] = None) -> Any:
        """The API wrapper's body at L0 of a backend with ``module_grads_from_uses``: the call is
        not recorded; its uses of the inputs of modules running now are tapped."""
        DEPTH.value += 1
        try:
            if inplace is None:
                inplace = is_inplace(name, kwargs)
            if inplace or base.startswith(self._collective_prefixes) or not self._grad_recording():
                return orig(*args, **kwargs)
            return self._call_with_use_taps_impl(orig, args, kwargs)
        finally:
            DEPTH.value -= 1

    # -- module hooks (L0) --------------------------------------------------------------------
    def _hook_model(self, model: Any, index: Optional[int]) -> None:
        """Hook every submodule of `model` (not `model` itself). Idempotent per model."""
        if not self.hooks.hooked.add(model):
            return
        name = (lambda path, m: path) if index is None else (lambda path, m: f"{index}.{path}")
        client = _ModuleRecords(self, self.switch, self.hooks, submodules=True, name=name,
                                param_grads=self.want_backward)
        self.hooks.handles.append(hooks_of(model, self.access).add(client))

    def _gated_pre(self, gate: Any, hooks: HookSet, base: str, module: Any, args: tuple, kwargs: dict):
        """A module's forward starts: recorded while `gate` is on (the level's module hooks: the
        debugger's switch; module_dump: its own), calls in flight kept in `hooks`."""
        if not gate.active:
            return None
        stack = hooks.calls_in_flight(module)
        if DEPTH.value or (self.recomputing is not None and self.recomputing()):
            stack.append(None)
            return None
        col = self.collector
        capture = None
        run_args, run_kwargs = args, kwargs
        DEPTH.value += 1            # ``with internal()``, inline: two calls fewer per module call
        try:
            call = col.begin(base, is_module=True)
            inplace = False
            if call.selected:
                # module_dump's module is tapped as an API call: no per-use taps run meanwhile.
                capture = self._new_capture(call, module if hooks is self.hooks else None)
                if capture is not None:
                    inplace = self.access.module_is_inplace(module)
                    if not inplace:     # before the statistics ops, as for APIs
                        run_args, run_kwargs = capture.before_call(args, kwargs)
                col.forward_inputs(call, args, kwargs)
            stack.append((call, capture, inplace))
        finally:
            DEPTH.value -= 1
        return (run_args, run_kwargs) if capture is not None and capture.replaces_inputs else None

    def _post(self, hooks: HookSet, base: str, module: Any, args: tuple, kwargs: dict, output: Any):
        entry = hooks.finished_call(module)
        if entry is None:
            return None
        call, capture, inplace = entry
        col = self.collector
        DEPTH.value += 1            # ``with internal()``, inline
        try:
            stack = col.module_stack
            if stack and stack[-1] is not call:      # calls above it whose end never came
                self._end_stale(_depth_above(stack, call))
            try:
                if call.selected:
                    if capture is not None:
                        self._watch_module_outputs_impl(capture, output, args, inplace)
                    params = self.access.forward_parameters(module)
                    col.forward_outputs(call, output, params or None)
            finally:
                col.end(call)
        finally:
            DEPTH.value -= 1
        return None

    def _end_stale(self, depth: Optional[int]) -> None:
        """End the module calls above `depth` on the module stack: calls whose forward hook never
        ran (a module that bypasses it) must not stay the parent of everything recorded after
        them. Run when an enclosing module's call ends; their forward records are written with
        a null output. (No hook on the root model: its hooks would stay on it between steps.)"""
        col = self.collector
        stack = col.module_stack
        if depth is None:
            return
        while len(stack) > depth:
            stale = stack[-1]
            try:
                if stale.selected:
                    col.forward_outputs(stale, None)
            finally:
                col.end(stale)
                if stack and stack[-1] is stale:      # the collector did not pop it: drop it anyway
                    stack.pop()
            capture = self.hooks.abandon(stale)
            if capture is not None:
                self._abandon_capture_impl(capture)

    def _on_param_grad(self, base: str, pname: str, grad: Any) -> None:
        """A parameter's gradient, from a hook or re-read: summarised while a step folder is open.
        Returns None (a MindSpore hook's return value would replace the gradient)."""
        if self.collector.dump is None or grad is None:
            return None
        with internal():
            self.hooks.store_param_grad(base, pname, grad)
        return None

    def _new_capture(self, call: Any, module: Any = None) -> Any:
        """A gradient capture for `call` (of `module`, for a module call hooked by the level),
        or None when backward is not recorded right now."""
        if not self.want_backward or not self._grad_recording():
            return None
        col = self.collector
        emit = functools.partial(col.backward, call)         # a partial: no frame of its own when called
        capture = self._grad_capture_impl(emit) if module is None else self._module_capture_impl(emit, module)
        if call.is_module:      # calls recorded during this module's backward get it as parent
            capture.on_start = functools.partial(col.backward_begins, call)
        return capture

    # -- what each framework fills in ---------------------------------------------------------
    @abc.abstractmethod
    def _grad_capture_impl(self, emit: Callable[[list, list], None]) -> Any:
        """A new gradient capture reporting to `emit`: ``before_call(args, kwargs)`` returns the
        arguments the call runs with (a tap may substitute aliases; then ``replaces_inputs``)."""

    def _module_capture_impl(self, emit: Callable[[list, list], None], module: Any) -> Any:
        """The gradient capture of a call of `module` (default: as for an API call)."""
        return self._grad_capture_impl(emit)

    def _before_aliasing_call_impl(self, capture: Any, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
        """Before an API call whose result may alias an input: the arguments it runs with
        (default: the caller's own, untouched)."""
        return args, kwargs

    def _returned_impl(self, capture: Any, out: Any) -> Any:
        """What the caller gets back from a recorded API call (default: `out` as is)."""
        return out

    def _call_with_use_taps_impl(self, orig: Callable, args: tuple, kwargs: dict) -> Any:
        """``module_grads_from_uses`` at L0: run `orig`, tapping its uses of running modules' inputs."""
        return orig(*args, **kwargs)

    def _abandon_capture_impl(self, capture: Any) -> None:
        """A module call whose end never came (see ``_end_stale``): release what its capture holds."""

    @abc.abstractmethod
    def _watch_module_outputs_impl(self, capture: Any, output: Any, args: tuple, inplace: bool) -> None:
        """After a module ran: have `capture` see the gradients of its outputs."""

    @abc.abstractmethod
    def _watch_api_outputs_impl(self, capture: Any, out: Any, args: tuple, kwargs: dict, inplace: bool) -> None:
        """After an API ran (with `args`/`kwargs` as it received them): watch its output gradients."""

    def _check_runtime_impl(self) -> None:
        """Before installing: warn about a framework mode in which hooks cannot run."""

    def _wrap_model_calls_impl(self, model: Any) -> None:
        """At API levels: wrap calls that only the model reaches (MindSpore Primitives)."""

    def _new_step_impl(self) -> None:
        """A new step folder opened: forget per-step state."""

    def _end_step_impl(self) -> None:
        """Collection pauses: complete backward records that will get nothing more."""

    def _close_impl(self) -> None:
        """Undo the framework's own patches beyond APIs and hooks."""

    def _step_notes_impl(self) -> list:
        """See ``step_notes`` (default: nothing to say)."""
        return []


class _ModuleRecords(ModelHook):
    """The dump's hooks on one model's modules (the level's, or module_dump's on one module):
    the bodies are the backend's ``_gated_pre``/``_post``/``_on_param_grad``, bound here so
    that each registered hook is one call."""

    def __init__(self, backend: Backend, gate: Any, hookset: HookSet, *, submodules: bool,
                 name: Callable[[str, Any], str], param_grads: bool):
        self.submodules = submodules
        self.compile_mode = backend.cfg.compile_mode or ""
        self.pre_forward = functools.partial(backend._gated_pre, gate, hookset)
        self.post_forward = functools.partial(backend._post, hookset)
        self.param_grad = backend._on_param_grad if param_grads else None
        self._backend = backend
        self._hookset = hookset
        self._name = name

    def module_context(self, path: str, module: Any) -> str:
        be = self._backend
        base = module_base(self._name(path, module), be.class_name(module), be.module_prefix)
        if self.submodules and be.access.keeps_grads:     # gradients re-read by capture_param_grads
            for pname, param in be.access.own_parameters(module).items():
                if getattr(param, "requires_grad", False):
                    self._hookset.watch_param(base, pname, param)
        return base


class _Iterations(ModelHook):
    """``on_begin``/``on_end`` around every forward of the root model (token ranges)."""

    def __init__(self, on_begin: Callable[[], None], on_end: Callable[[], None], compile_mode: str):
        self.compile_mode = compile_mode or ""
        self.pre_forward = lambda ctx, m, args, kwargs: on_begin()
        self.post_forward = lambda ctx, m, args, kwargs, out: on_end()
