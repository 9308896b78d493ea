"""torch.compile: what tsprobe's hooks and API wrappers do inside a region dynamo traces.

Dynamo traces ``nn.Module.__call__``, so it meets every module hook (and every patched API
function) while it runs the model on FakeTensors: a hook body that summarises a tensor (a data
pointer, a host copy, a Python-side cache) cannot be traced, and must not become part of the
graph either (that would change what inductor compiles). So:

- while dynamo traces, a module hook returns None at once and leaves no trace in the graph
  (mode ``boundaries``, the default: the compiled program is the one the user gets without
  tsprobe, bit for bit). A compiled submodule is still recorded at its boundary (``submodules``:
  its hooks sit on the compiled wrapper, outside dynamo), and so is a model handed over as
  ``torch.compile(model)``, as its root module (``TorchBackend._record_region``);
- mode ``modules`` (``TSPROBE_COMPILE=modules``): the hook body is ``torch.compiler.disable``-d
  and dynamo breaks the graph at each hooked module; the body runs eagerly on the real tensors
  (module records as in eager mode, backward through the compiled pieces' autograd nodes).
  Where graph breaks are forbidden (``fullgraph=True``) the hook stays invisible. The breaks
  change what inductor fuses: bf16 numbers move (measured), hence opt-in;
- mode ``shadow`` (shadow.py): as ``boundaries``, plus an eager re-run of the compiled root on
  its real inputs, which the module hooks record (and its backward, with the compiled outputs'
  gradients);
- an API wrapper is transparent while dynamo traces (``in_compiler``): the API becomes a graph
  op, as without tsprobe; API calls inside a compiled region are not Python calls at run time
  and are not recorded. Nor are the Tensor methods torch's compiler calls on FakeTensors while
  it compiles (a backward is compiled lazily, during the first ``loss.backward()``), nor those
  its runtime calls between compiled pieces; and a wrapper is never compiled as a frame of its
  own (``skip_as_frame``).

Measured and tested in tests/core/test_compile.py; the user's view is
docs/distributed-and-compiled.md.
"""
from __future__ import annotations

import getpass
import os
import re
import sys
import tempfile
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch

compiling: Callable[[], bool] = torch.compiler.is_compiling


class _Compiler:
    """Is torch.compile's own machinery running right now (dynamo tracing, AOTAutograd, inductor
    compiling a backward lazily during ``loss.backward()``)? Set by dynamo's compile start/end
    callbacks: inductor calls Tensor methods (``stride``, ``is_contiguous``) on FakeTensors,
    which an API wrapper must not record."""

    active = False

    @classmethod
    def start(cls, _args: Any = None) -> None:
        cls.active = True

    @classmethod
    def end(cls, _args: Any = None) -> None:
        cls.active = False


# torch.compile's runtime calls Tensor methods of its own between compiled pieces (AOTAutograd's
# backward prologue calls ``stride()`` on each incoming gradient), and inductor's generated code
# (in its cache folder) calls ``extern_kernels.addmm`` & co., which are tsprobe's wrappers when
# inductor was imported while they were installed: not the user's calls.
_COMPILER_DIRS = tuple(os.path.join(os.path.dirname(torch.__file__), d) + os.sep
                       for d in ("_dynamo", "_functorch", "_inductor"))
_RUNTIME_DIRS = _COMPILER_DIRS
_WATCHING = False          # watch_compiler ran with dynamo loaded


def dynamo_loaded() -> bool:
    """Has anything imported torch._dynamo (``torch.compile`` does)? Importing it costs seconds,
    so tsprobe never does it first: until then nothing can be compiled, and nothing here is
    needed."""
    return "torch._dynamo" in sys.modules


def watch_compiler() -> None:
    """Once dynamo is loaded (checked at every ``start``): follow torch.compile's compile
    start/end (again after ``torch._dynamo.reset()``, which clears its callbacks) and mark the
    code of hooks and wrappers to run as plain Python frames; idempotent."""
    if not dynamo_loaded():
        return
    from torch._dynamo.callback import callback_handler

    if _Compiler.start not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_Compiler.start)
    if _Compiler.end not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_Compiler.end)
    _mark_frames()
    global _RUNTIME_DIRS, _WATCHING
    _RUNTIME_DIRS = _COMPILER_DIRS + (os.path.join(_generated_code_dir(), ""),)
    _WATCHING = True


def _generated_code_dir() -> str:
    """Where inductor writes the code it generates (its cache_dir_utils, without its side effects)."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return os.path.abspath(configured)
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def in_compiler() -> bool:
    """An API wrapper's test (called by the wrapper): dynamo traces the caller, torch.compile's
    machinery runs, or the caller is torch.compile's own runtime code. ``is_compiling()``
    first: dynamo folds it to True, so nothing else is read (and guarded on) while it traces."""
    if compiling() or _Compiler.active:
        return True
    if not _WATCHING and dynamo_loaded():     # torch.compile first used after start()
        watch_compiler()
    return sys._getframe(2).f_code.co_filename.startswith(_RUNTIME_DIRS)


def graph_breaks_forbidden() -> bool:
    """While dynamo traces: does this trace forbid graph breaks (``fullgraph=True``)? Evaluated
    once per trace (a constant to dynamo); True when torch's internals cannot tell, so a hook
    can never turn a fullgraph compile into an error."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        return bool(getattr(tx, "one_graph", True) or getattr(tx, "error_on_graph_break", False))
    except Exception:        # a torch without these internals: stay invisible
        return True


# torch.compiler.assume_constant_result, without importing dynamo (which is all it does)
graph_breaks_forbidden._dynamo_marked_constant = True      # type: ignore[attr-defined]


COMPILE_ENV = "TSPROBE_COMPILE"
_MODES = {"boundaries": False, "modules": True, "shadow": False}   # mode -> graph breaks at hooked modules


def mode(configured: str = "") -> str:
    """The config's ``compile_mode`` if set, else ``TSPROBE_COMPILE`` checked: boundaries
    (default), modules or shadow."""
    value = configured or os.environ.get(COMPILE_ENV, "") or "boundaries"
    if value not in _MODES:
        raise ValueError(f"{COMPILE_ENV}={value!r}: allowed: {', '.join(_MODES)}")
    return value


def breaks_at_modules(configured: str = "") -> bool:
    """``TSPROBE_COMPILE``: ``boundaries`` (the default: the compiled program is the user's own,
    bit for bit), ``shadow`` (the same, plus an eager re-run for module records) or ``modules``
    (graph breaks at every hooked module, which records each module inside a compiled region but
    changes where inductor may fuse: measured, bf16 autocast moves the loss and gradients by up
    to 2e-3, while float32 stayed bit-identical)."""
    return _MODES[mode(configured)]


def outside_graph(fn: Callable[..., Any], graph_breaks: Optional[bool] = None) -> Callable[..., Any]:
    """A module hook that never runs on FakeTensors. Eager calls go straight to `fn`. While
    dynamo traces, the hook returns None and leaves no trace in the graph; with `graph_breaks`
    (None: ``breaks_at_modules()``) and graph breaks allowed, `fn` runs instead at a graph break,
    on the real tensors."""
    breaks = breaks_at_modules() if graph_breaks is None else graph_breaks
    if not breaks:
        def hook(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return None
            return fn(*args, **kwargs)
    else:
        # The graph-break version of `fn`. torch.compiler.disable imports dynamo (seconds), so an
        # explicit root hook made before anything was compiled gets it at its first eager call
        # after dynamo was loaded; never while dynamo traces (made there, it is traced through).
        # Until then a traced call leaves no trace, as without graph breaks.
        eager: list = [torch.compiler.disable(fn, recursive=True)] if graph_breaks is None or dynamo_loaded() \
            else []

        def hook(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                if not eager or graph_breaks_forbidden():
                    return None
                return eager[0](*args, **kwargs)
            if not eager and dynamo_loaded():
                eager.append(torch.compiler.disable(fn, recursive=True))
            return fn(*args, **kwargs)

    hook.__wrapped__ = fn         # type: ignore[attr-defined]
    _FRAMES[hook.__code__] = (_SKIP, _SKIP)
    watch_compiler()
    return hook


def skip_as_frame(code: Any) -> None:
    """Dynamo compiles the first frame it may under a compiled call: inside
    ``module.compile()`` of a torch module (whose own frames dynamo leaves alone), that would be
    an API wrapper, and the API would run as an inductor kernel instead of the eager one the
    program runs without tsprobe (measured: a different float32 LayerNorm). The wrapper's code
    is never compiled as a frame of its own (it is still inlined where dynamo traces its caller;
    what it calls is treated as without tsprobe)."""
    _FRAMES.setdefault(code, (_SKIP, _DEFAULT))
    watch_compiler()


# Code objects -> (this frame, the frames it calls): how dynamo runs them as frames of their own.
# A hook: at run time compiled code calls it (at the graph break) under dynamo's frame callback,
# which would compile the hook's frame (one compile per argument count, up to the recompile
# limit) and every frame the hook body calls: hook code runs as plain Python, with all it calls
# (dynamo still inlines hooks where it traces ``nn.Module.__call__``).
_SKIP, _DEFAULT = "SKIP", "DEFAULT"
_FRAMES: Dict[Any, Tuple[str, str]] = {}
_MARKED: set = set()


def _mark_frames() -> None:
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:      # a torch without per-code strategies
        return
    for code, (own, called) in list(_FRAMES.items()):
        if code not in _MARKED:
            _MARKED.add(code)
            set_code_exec_strategy(code, FrameExecStrategy(getattr(FrameAction, own), getattr(FrameAction, called)))


def _compiled_class() -> Any:
    """``OptimizedModule`` (what ``torch.compile(module)`` returns), or a class nothing is an
    instance of while dynamo is not loaded (then nothing was compiled)."""
    if not dynamo_loaded():
        return _NotLoaded
    from torch._dynamo.eval_frame import OptimizedModule

    return OptimizedModule


class _NotLoaded:
    pass


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module behind ``torch.compile(model)`` (the model itself otherwise)."""
    compiled = _compiled_class()
    while isinstance(model, compiled):
        model = model._orig_mod
    return model


def compiled_whole(model: torch.nn.Module) -> bool:
    """Does `model` run as one compiled region (``torch.compile(model)`` or ``model.compile()``)?"""
    return unwrap(model) is not model or getattr(model, "_compiled_call_impl", None) is not None


def submodules(model: torch.nn.Module) -> Iterator[Tuple[str, torch.nn.Module]]:
    """(path, module) for every submodule, named as in the uncompiled model: a submodule the user
    replaced by ``torch.compile(sub)`` is hooked as the compiled wrapper (whose hooks run
    outside dynamo, so it is recorded even under ``fullgraph=True``) under the path and class of
    the module it wraps; the ``_orig_mod`` level disappears from every path."""
    for path, m in unwrap(model).named_modules():
        if not path:
            continue
        parts = path.split(".")
        if parts[-1] == "_orig_mod":
            continue                       # the compiled wrapper above it stands for it
        yield ".".join(p for p in parts if p != "_orig_mod"), m


