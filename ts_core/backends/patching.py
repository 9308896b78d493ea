"""Patching module attributes with recording wrappers, and undoing every patch.

Shared by the framework backends; each subclass only says which owners (modules, the Tensor
class) its API-list sections name (``_owners``). The wrapper's fast path is two attribute
reads: not collecting, or already inside a wrapped call.

A model may hold an API function it took before the patch (transformers' ``GELUActivation``
sets ``self.act = nn.functional.gelu`` at construction): calling it never reaches the patched
name. ``wrap_held`` finds such attributes on the model's modules (the function itself, or a
``functools.partial`` of it) and points them at the same wrapper, so the call is recorded under
the function's own key; ``restore`` puts the originals back.

Inside a region a graph compiler traces (torch.compile), a wrapper is transparent
(``compiling``): the API becomes a graph op as without tsprobe, and is not recorded.
"""
from __future__ import annotations

import functools
import os
import weakref
from typing import Any, Callable, Collection, Dict, FrozenSet, Iterable, Iterator, List, Optional, Tuple

from ..dumpfmt import api_base
from ._depth import DEPTH
from .hook_set import WeakIdSet

_LIST_CACHE: Dict[Tuple[str, float], Dict[str, List[str]]] = {}


def read_api_list(path: str, sections: Collection[str]) -> Dict[str, List[str]]:
    """The sections of an API-list YAML file (section -> names), checked against the sections
    a backend knows; parsed once per file version (~1,000 names)."""
    import yaml

    key = (path, os.path.getmtime(path))
    cached = _LIST_CACHE.get(key)
    if cached is None:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of sections to lists of names")
        unknown = set(data) - set(sections)
        if unknown:
            raise ValueError(f"{path}: unknown sections {sorted(unknown)}; allowed: {sorted(sections)}")
        cached = _LIST_CACHE[key] = {k: [str(n) for n in (v or [])] for k, v in data.items()}
    return {k: list(v) for k, v in cached.items()}


_MISSING = object()


def resolve(owner: Any, dotted: str) -> Tuple[Any, str, Any]:
    """``(parent, attribute name, value)`` of a dotted name under `owner` (``linalg.norm``)."""
    parts = dotted.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p)
    return owner, parts[-1], getattr(owner, parts[-1])


class ApiPatcher:
    """Installs wrappers that report to `runner(orig, base, name, args, kwargs)`.

    A framework's subclass names the owners of its API list (``_owners``) and two facts the
    recording body needs: the APIs whose result may alias an input (``aliasing``) and the key
    prefixes of collectives (``collective_prefixes``); their inputs are never routed through a
    gradient tap, so they stay the caller's own tensors."""

    aliasing: FrozenSet[str] = frozenset()
    collective_prefixes: Tuple[str, ...] = ()
    # True while a graph compiler traces the caller (torch.compiler.is_compiling) or its own
    # machinery calls the API: a recording body must not run on symbolic tensors. Checked after
    # the not-collecting fast path, which stays two attribute reads (under a dynamo trace those
    # reads become guards: a compiled region is compiled once per collecting state).
    compiling: Callable[[], bool] = staticmethod(lambda: False)

    def __init__(self, runner: Callable, switch: Any):
        self.runner = runner
        self.switch = switch
        self._saved: List[Tuple[Any, str, Any]] = []
        self._wrappers: Dict[int, Tuple[Any, Callable]] = {}     # id(original) -> (original, wrapper)
        self._held: List[Tuple[weakref.ref, str, Any, Any]] = []  # (object, attribute, original, set)
        self._walked = WeakIdSet()                               # models already searched

    def _owners(self, api_list: Dict[str, List[str]]) -> Iterator[Tuple[Any, str, List[str]]]:
        """(owner object, key prefix, names) per section; sections whose module is missing are skipped."""
        raise NotImplementedError

    def _default_list(self) -> Dict[str, List[str]]:
        raise NotImplementedError

    def install(self, api_list: Optional[Dict[str, List[str]]] = None) -> int:
        api_list = api_list if api_list is not None else self._default_list()
        for owner, prefix, names in self._owners(api_list):
            for name in names:
                self.patch(owner, name, api_base(prefix, name))
        return len(self._saved)

    def patch(self, owner: Any, dotted: str, base: str) -> bool:
        try:
            parent, attr, orig = resolve(owner, dotted)
        except AttributeError:
            return False
        if not callable(orig) or isinstance(orig, type) or getattr(orig, "__tsprobe_orig__", None):
            return False
        self._saved.append((parent, attr, parent.__dict__.get(attr, _MISSING)))
        wrapper = self._wrap(orig, base, attr)
        setattr(parent, attr, wrapper)
        self._wrappers.setdefault(id(orig), (orig, wrapper))    # one function, several names: the first
        return True

    def wrap_held(self, model: Any, objects: Callable[[Any], Iterable[Any]]) -> int:
        """Point attributes of ``objects(model)`` that hold an original API function (or a
        ``functools.partial`` of one) at its wrapper. Once per model; returns how many."""
        if not self._wrappers or not self._walked.add(model):
            return 0
        n = 0
        for obj in objects(model):
            attrs = getattr(obj, "__dict__", None)
            if not isinstance(attrs, dict):
                continue
            for attr, value in list(attrs.items()):
                new = self._wrapped_value(value)
                if new is not None:
                    attrs[attr] = new
                    self._held.append((weakref.ref(obj), attr, value, new))
                    n += 1
        return n

    def _wrapped_value(self, value: Any) -> Any:
        """The wrapped twin of `value` when it is (a partial of) a wrapped original, else None."""
        if isinstance(value, functools.partial):
            inner = self._wrapped_value(value.func)
            return None if inner is None else functools.partial(inner, *value.args, **value.keywords)
        hit = self._wrappers.get(id(value))
        return hit[1] if hit is not None and hit[0] is value else None

    def restore_one(self, owner: Any, dotted: str) -> bool:
        parent, attr, _ = resolve(owner, dotted)
        for i, (p, a, orig) in enumerate(self._saved):
            if p is parent and a == attr:
                current = getattr(p, a)
                key = id(getattr(current, "__tsprobe_orig__", None))
                if self._wrappers.get(key, (None, None))[1] is current:
                    del self._wrappers[key]
                self._put_back(p, a, orig)
                del self._saved[i]
                return True
        return False

    def register(self, module: Any, api_name: str, api_prefix: Optional[str] = None) -> None:
        """A user's own API (``register_custom_api``): key prefix defaults to the module's name."""
        prefix = api_prefix if api_prefix is not None else getattr(module, "__name__", str(module))
        if not self.patch(module, api_name, api_base(prefix, api_name)):
            raise AttributeError(f"register_custom_api: {module!r} has no callable '{api_name}' "
                                 "(or it is already registered)")

    def unregister(self, module: Any, api_name: str) -> None:
        if not self.restore_one(module, api_name):
            raise ValueError(f"restore_custom_api: '{api_name}' of {module!r} was not registered")

    def restore(self) -> None:
        while self._saved:
            self._put_back(*self._saved.pop())
        while self._held:
            ref, attr, orig, new = self._held.pop()
            obj = ref()
            attrs = getattr(obj, "__dict__", None) if obj is not None else None
            if isinstance(attrs, dict) and attrs.get(attr) is new:     # unless the user replaced it
                attrs[attr] = orig
        self._wrappers.clear()
        self._walked.clear()

    @staticmethod
    def _put_back(parent: Any, attr: str, orig: Any) -> None:
        if orig is _MISSING:
            delattr(parent, attr)
        else:
            setattr(parent, attr, orig)

    def _wrap(self, orig: Callable, base: str, name: str) -> Callable:
        runner, switch, compiling = self.runner, self.switch, self.compiling

        @functools.wraps(orig)
        def wrapper(*args, **kwargs):
            if DEPTH.value or not switch.active or compiling():
                return orig(*args, **kwargs)
            return runner(orig, base, name, args, kwargs)

        wrapper.__tsprobe_orig__ = orig
        return wrapper
