"""``mindspore.jit`` regions (capture_mode ``ast``) in PyNative: compiled without seeing tsprobe,
recorded at their boundary as ``Jit.{name}.{n}.forward`` / ``.backward`` (seed 003).

What MindSpore's graph compiler meets of tsprobe, and why each is hidden from it:

- Tensor hooks on the region's inputs (the output hooks of recorded calls, parameter-gradient
  hooks): the compiler inlines an input tensor's ``register_hook`` functions into the graph
  (``parser.hook_wrapper``) and parses their source; ours hold ``with internal():``, on which
  the parser fails (``check_is_base_ctx``: ``issubclass() arg 1 must be a class``). Such an
  input enters an ast region as a fresh identity view (made outside recording): the graph sees
  no hook, the hook stays on the caller's tensor and runs in PyNative when the gradient
  reaches it through the view (an identity: the same bits). Where a hook of ours still reaches
  a compiler (a Parameter input, which must stay itself; PIJit, whose inputs cannot be
  replaced), ``hook_wrapper`` gives it ``pass_gradient``; the hook runs in PyNative.
- Forward hooks of the Cells compiled inside an ast region (a jit Cell's sub-Cells, Cells the
  function names or receives): the compiler compiles them (``Cell._jit_forward_pre_hook``,
  JIT fallback) into a cyclic graph with ours. While the region compiles, tsprobe's hooks are
  taken out of those Cells' hook dicts and put back, in order, right after (a compiled graph
  runs no Python hook anyway).
- API wrappers and Primitive subclasses need nothing: the parser unwraps ``__wrapped__``
  (``functools.wraps``) and treats a Primitive subclass instance as the Primitive.

Recording: every call of a region goes through ``_JitExecutor.__call__`` (function, decorated
method, decorated Cell ``construct``), patched at class level while tsprobe is installed. At the
API levels (L1, mix) the call is recorded like an API call: inputs (a Cell's ``self`` left out)
before it runs, outputs after, and its backward through the same taps as an API call (outside
the graph, so MindSpore exposes it). ``name`` is the function's ``__name__``, or the Cell's
class name for a decorated ``construct`` (msprobe's ``Jit.AlexNet.0.forward``). Nothing inside
an ast region runs in PyNative, so nothing inside is recorded. ``capture_mode="bytecode"`` does
not go through ``_JitExecutor``: what PIJit leaves to PyNative is recorded per API by the usual
wrappers, what it compiles is not. ``capture_mode="trace"`` builds its graph from the PyNative
ops run while the function runs the first time: everything tsprobe would run there (records,
taps, statistics ops) would be traced into the graph, so a trace region runs as tsprobe's own
work (nothing inside recorded or tapped) and gets no record of its own.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from mindspore import Parameter, Tensor, nn

from ...dumpfmt.keys import jit_base
from .._depth import DEPTH, internal
from ..structure import map_leaves

try:
    from mindspore.graph.api import _JitExecutor
    from mindspore.graph import _parse as _parse_pkg
    from mindspore.graph import jit_trace as _trace_mod
    from mindspore.graph._parse import parser as _parser
except ImportError:      # pragma: no cover - MindSpore < 2.9
    from mindspore.common.api import _JitExecutor      # type: ignore
    from mindspore._extends import parse as _parse_pkg      # type: ignore
    from mindspore._extends.parse import parser as _parser      # type: ignore
    try:
        from mindspore.common import jit_trace as _trace_mod      # type: ignore
    except ImportError:
        _trace_mod = None

_OWN_MODULES = ("ts_core", "ts_integrations")
# Cell attributes holding forward hooks the graph compiler reads (MindSpore 2.10's lazy dicts).
_CELL_HOOK_DICTS = ("_lazy_forward_pre_hook", "_lazy_forward_hook")


def is_ours(fn: Any) -> bool:
    """Is the hook function `fn` tsprobe's (a closure, function or partial of one made by
    ts_core / ts_integrations)?"""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = getattr(fn, "__func__", fn)
    return str(getattr(fn, "__module__", "") or "").startswith(_OWN_MODULES)


def pass_gradient(dout: Any) -> Any:
    """What the graph compiler gets in place of a tsprobe tensor hook: the gradient unchanged
    (the hook itself runs in PyNative, where the tensor's gradient arrives)."""
    return dout


def _hooks_of(t: Tensor) -> list:
    try:
        return list(t.hooks())
    except Exception:      # pragma: no cover - no hook API on this tensor type
        return []


def hide_tensor_hooks(obj: Any) -> Any:
    """`obj` with every tensor that carries a tsprobe hook replaced by an identity view of it
    (no hook of its own); other values unchanged. A Parameter stays itself (a region may
    assign to it): its hooks reach the compiler as ``pass_gradient``."""
    def alias(v: Any) -> Any:
        if isinstance(v, Tensor) and not isinstance(v, Parameter) and any(is_ours(h) for h in _hooks_of(v)):
            with internal():
                return v.view(v.shape)
        return v
    return map_leaves(obj, alias)


def _cells(objs: Any) -> Iterator[nn.Cell]:
    seen = set()
    for obj in objs:
        if isinstance(obj, nn.Cell):
            for _, cell in obj.cells_and_names():
                if id(cell) not in seen:
                    seen.add(id(cell))
                    yield cell


def referenced_cells(fn: Any) -> List[Any]:
    """The Cells a region's function names (globals it reads, its closure): compiled with it."""
    fn = getattr(fn, "__func__", fn)
    code, out = getattr(fn, "__code__", None), []
    if code is None:
        return out
    glb = getattr(fn, "__globals__", {}) or {}
    out += [glb[n] for n in code.co_names if isinstance(glb.get(n), nn.Cell)]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:       # an empty closure cell
            continue
        if isinstance(value, nn.Cell):
            out.append(value)
    return out


def hide_cell_hooks(objs: Any) -> List[Tuple[dict, dict]]:
    """Take tsprobe's forward hooks out of the Cells under `objs`; returns what ``put_back``
    needs to restore each dict (all its entries, in their order)."""
    saved: List[Tuple[dict, dict]] = []
    for cell in _cells(objs):
        for attr in _CELL_HOOK_DICTS:
            hooks = cell.__dict__.get(attr)
            if not hooks or not any(is_ours(fn) for fn in hooks.values()):
                continue
            saved.append((hooks, dict(hooks)))
            for hid in [k for k, fn in hooks.items() if is_ours(fn)]:
                del hooks[hid]
    return saved


def put_back(saved: List[Tuple[dict, dict]]) -> None:
    for hooks, entries in saved:
        hooks.clear()
        hooks.update(entries)


def region_name(executor: Any) -> str:
    """``Jit`` record name: the Cell's class for a decorated ``construct``, else the function's."""
    obj = getattr(executor, "obj", None)
    if isinstance(obj, nn.Cell):
        return type(obj).__name__
    fn = getattr(executor, "fn", None)
    return getattr(fn, "__name__", None) or "jit"


class JitPatcher:
    """Patches ``_JitExecutor.__call__`` and ``.compile`` (class attributes) while installed.

    `runner(orig, base, name, args, kwargs, inplace)` runs a region call as an API call: the
    backend's API runner (at L0 it records nothing and only taps the uses of running Cells'
    inputs, so a Cell that feeds its input to a region still gets that use's gradient)."""

    def __init__(self, runner: Callable, switch: Any):
        self.runner = runner
        self.switch = switch
        self._saved: Optional[Dict[str, Any]] = None
        self._hook_wrapper: Optional[Callable] = None
        self._trace: Optional[Tuple[Callable, Callable]] = None
        self.tracing = 0          # trace regions open now (each holds one level of DEPTH)

    @property
    def installed(self) -> bool:
        return self._saved is not None

    def install(self) -> None:
        if self._saved is not None:
            return
        orig_call = _JitExecutor.__dict__["__call__"]
        orig_compile = _JitExecutor.__dict__["compile"]
        self._saved = {"__call__": orig_call, "compile": orig_compile}
        runner, switch = self.runner, self.switch

        def __call__(executor, *args, **kwargs):
            head = args[:1] if getattr(executor, "obj", None) is not None else ()
            args = args[len(head):]

            def run(*a, **k):
                return orig_call(executor, *head, *hide_tensor_hooks(a), **hide_tensor_hooks(k))
            if DEPTH.value or not switch.active:
                return run(*args, **kwargs)
            name = region_name(executor)
            return runner(run, jit_base(name), name, args, kwargs, False)

        def compile(executor, *args, **kwargs):
            objs = [getattr(executor, "obj", None), *referenced_cells(getattr(executor, "fn", None)), *args,
                    *kwargs.values()]
            saved = hide_cell_hooks(objs)
            try:
                return orig_compile(executor, *args, **kwargs)
            finally:
                put_back(saved)

        functools.update_wrapper(__call__, orig_call)
        functools.update_wrapper(compile, orig_compile)
        _JitExecutor.__call__ = __call__
        _JitExecutor.compile = compile
        self._patch_hook_wrapper()
        self._patch_trace()

    def _patch_trace(self) -> None:
        """A trace region (between MindSpore's ``_jit_trace_begin`` and ``_jit_trace_end``,
        module globals looked up at each call) runs at DEPTH + 1: tsprobe's wrappers and hooks
        pass straight through while its graph is traced."""
        if _trace_mod is None or not hasattr(_trace_mod, "_jit_trace_begin"):     # pragma: no cover
            return
        orig_begin, orig_end = _trace_mod._jit_trace_begin, _trace_mod._jit_trace_end
        self._trace = (orig_begin, orig_end)

        def _jit_trace_begin(*args, **kwargs):
            new_compile = orig_begin(*args, **kwargs)
            DEPTH.value += 1
            self.tracing += 1
            return new_compile

        def _jit_trace_end(*args, **kwargs):
            if self.tracing:
                self.tracing -= 1
                DEPTH.value -= 1
            return orig_end(*args, **kwargs)
        _trace_mod._jit_trace_begin, _trace_mod._jit_trace_end = _jit_trace_begin, _jit_trace_end

    def end_traces(self) -> None:
        """Give back the DEPTH of trace regions whose end never came (the traced function
        raised): called when a step's collection pauses and at close."""
        while self.tracing:
            self.tracing -= 1
            DEPTH.value -= 1

    def _patch_hook_wrapper(self) -> None:
        """Where a tensor hook of ours still reaches a compiler (a Parameter input of an ast
        region; capture_mode="bytecode": PIJit compiles the hooks of the tensors it meets, and
        its region's inputs cannot be replaced), the compiler gets ``pass_gradient``: MindSpore
        looks ``hook_wrapper`` up on the ``_parse`` package at each use."""
        orig = _parse_pkg.__dict__.get("hook_wrapper")
        if orig is None:       # pragma: no cover - another MindSpore layout
            return
        self._hook_wrapper = orig

        def hook_wrapper(hook_fn):
            return pass_gradient if is_ours(hook_fn) else orig(hook_fn)
        functools.update_wrapper(hook_wrapper, orig)
        _parse_pkg.hook_wrapper = hook_wrapper
        _parser.hook_wrapper = hook_wrapper

    def restore(self) -> None:
        if self._saved is None:
            return
        for attr, value in self._saved.items():
            setattr(_JitExecutor, attr, value)
        self._saved = None
        if self._hook_wrapper is not None:
            _parse_pkg.hook_wrapper = _parser.hook_wrapper = self._hook_wrapper
            self._hook_wrapper = None
        if self._trace is not None:
            _trace_mod._jit_trace_begin, _trace_mod._jit_trace_end = self._trace
            self._trace = None
        self.end_traces()
