"""The one owner of the hooks tsprobe puts on a user's model (accelerate's ``ModelHook``
chained by ``SequentialHook``): every client -- the dump's module records, ``module_dump``,
monitor mode, config-check's first-batch fingerprint, token windows, integrations' step
windows -- is a :class:`ModelHook` added to the model's :class:`ModelHooks`, and is removed
as a unit (``remove(client)``; ``remove_all()`` for every client of the model).

Clients compose: each client's hooks are registered on the module through the framework's
own hook list (in the order the clients were added; ``prepend`` puts a pre-hook first), so
several clients on one model run one after the other without a dispatcher between them, and
the hot path costs what a raw hook costs. What a framework's hooks look like (torch: bodies
that never run on FakeTensors, see ``backends/torch/compiled.py``; MindSpore: ``bprop``
Cells) is ``backends/<fw>/access.py``'s business, decided here once for every client.

The end of a backward is an event of the owner too (``backward_end``): one implementation
(torch: autograd's queued callbacks), used by the Hugging Face callback and open to others.
"""
from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Dict, List, Optional

__all__ = ["ClientHandle", "ModelHook", "ModelHooks", "hooks_of"]


class ModelHook:
    """One client of a model's hooks. Set (or define) the events it needs; an event left None
    is not registered and costs nothing:

    - ``pre_forward(ctx, module, args, kwargs)``: before a forward; a returned ``(args,
      kwargs)`` replaces the arguments;
    - ``post_forward(ctx, module, args, kwargs, output)``: after it, also when it raised;
    - ``param_grad(ctx, name, grad)``: each gradient of a module's own parameter that requires
      grad (torch: after accumulation).

    ``ctx`` is what ``module_context(path, module)`` returned for the module (called once when
    the client is added; None leaves the module out). ``submodules`` True hooks every
    submodule of the model (not the model itself); False hooks the model itself (path "").
    ``compile_mode`` (torch.compile): None for a hook at the model's edge, whose body runs at a
    graph break there; a config's ``compile_mode`` for hooks on every module (compiled.py).
    """

    pre_forward: Optional[Callable[..., Any]] = None
    post_forward: Optional[Callable[..., Any]] = None
    param_grad: Optional[Callable[..., Any]] = None
    submodules: bool = False
    prepend: bool = False
    compile_mode: Optional[str] = None

    def module_context(self, path: str, module: Any) -> Any:
        """What this client's hooks on `module` receive first (default: its path)."""
        return path

    def pre_forward_on(self, ctx: Any, module: Any) -> bool:
        """Does `module` get this client's pre-forward hook (default: every module)?"""
        return True


class ModelHooks:
    """The hooks of one model: its clients and their handles (see the module doc)."""

    def __init__(self, model: Any, access: Any):
        self._model = weakref.ref(model)
        self.access = access
        self._handles: Dict[int, List[Any]] = {}       # id(client) -> its handles
        # Held weakly: a client lives as long as its hooks on the model (a client may hold the
        # model, and owners are found through a global table, which must never keep a model alive).
        self._clients: "weakref.WeakValueDictionary[int, ModelHook]" = weakref.WeakValueDictionary()

    def add(self, client: ModelHook) -> "ClientHandle":
        """Register `client`'s hooks on the model; idempotent per client. Returns the handle
        that removes them as a unit."""
        if id(client) in self._clients:
            return ClientHandle(self, client)
        model = self._model()
        if model is None:
            raise RuntimeError("tsprobe: the model these hooks belong to was freed")
        access = self.access
        handles: List[Any] = []
        modules = access.submodules(model) if client.submodules else [("", model)]
        pre, post, grad = client.pre_forward, client.post_forward, client.param_grad
        mode = client.compile_mode
        try:
            for path, module in modules:
                ctx = client.module_context(path, module)
                if ctx is None:
                    continue
                if pre is not None and client.pre_forward_on(ctx, module):
                    handles.append(access.forward_pre_hook(module, _bind(pre, ctx), prepend=client.prepend,
                                                           compile_mode=mode))
                if post is not None:
                    handles.append(access.forward_hook(module, _bind(post, ctx), compile_mode=mode))
                if grad is not None:
                    for pname, param in access.own_parameters(module).items():
                        if getattr(param, "requires_grad", False):
                            handle = access.param_grad_hook(param, _bind(grad, ctx, pname))
                            if handle is not None:
                                handles.append(handle)
        except BaseException:
            _remove(handles)
            raise
        self._clients[id(client)] = client
        self._handles[id(client)] = handles
        return ClientHandle(self, client)

    def __contains__(self, client: ModelHook) -> bool:
        return id(client) in self._clients

    def remove(self, client: ModelHook) -> None:
        """Remove every hook of `client` (nothing when it has none here)."""
        self._clients.pop(id(client), None)
        _remove(self._handles.pop(id(client), []))

    def remove_all(self) -> None:
        for client in list(self._clients.values()):
            self.remove(client)

    def backward_end(self, callback: Callable[[], None]) -> Any:
        """An object whose ``watch(output)`` has ``callback()`` run once when the backward
        through `output` has finished (after the framework's own end-of-backward work, such as
        DDP's gradient copies); None where the framework cannot tell."""
        return self.access.backward_end(callback)


class ClientHandle:
    """Removes one client's hooks from one model (torch's ``RemovableHandle`` for a client)."""

    __slots__ = ("owner", "client")

    def __init__(self, owner: ModelHooks, client: ModelHook):
        self.owner, self.client = owner, client

    def remove(self) -> None:
        self.owner.remove(self.client)

    def __enter__(self) -> "ClientHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def _bind(fn: Callable[..., Any], *bound: Any) -> Callable[..., Any]:
    return functools.partial(fn, *bound)     # a partial of a partial is flattened: one call


def _remove(handles: List[Any]) -> None:
    for h in handles:
        h.remove()
    handles.clear()


_OWNERS: Dict[int, "tuple[weakref.ref, ModelHooks]"] = {}


def hooks_of(model: Any, access: Any = None) -> ModelHooks:
    """The hook owner of `model` (made at the first call; held weakly: it goes with the model).
    `access`: the framework's ``ModelAccess`` (default: found from the model's class)."""
    key = id(model)
    entry = _OWNERS.get(key)
    if entry is not None and entry[0]() is model:
        return entry[1]
    if access is None:
        from .backends.frameworks import framework_of, load_access

        access = load_access(framework_of(model))
    owner = ModelHooks(model, access)

    def forget(ref: weakref.ref) -> None:
        if _OWNERS.get(key, (None,))[0] is ref:
            del _OWNERS[key]

    _OWNERS[key] = (weakref.ref(model, forget), owner)
    return owner
