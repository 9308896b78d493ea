"""Primitive calls made through Cells (``nn.Dense`` -> ``self.matmul = ops.MatMul()``), recorded
as ``Primitive.{attribute}.{PrimitiveClass}.{n}.forward`` (msprobe's key), at L1/mix when
``start(model)`` names the model.

A Primitive's ``__call__`` is looked up on its class, so each Primitive instance found as an
attribute of a Cell of the model gets its own subclass (same name) whose ``__call__`` reports
to the runner and then calls the original class's ``__call__`` (looked up at call time, so a
later ``seed_all(rm_dropout=True)`` still applies). ``restore`` puts every original class back.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from mindspore.ops.primitive import Primitive

from ...dumpfmt import primitive_base
from .._depth import DEPTH
from ..hook_set import WeakIdSet


def _side_effect(prim: Any) -> bool:
    attrs = getattr(prim, "attrs", None) or {}
    return bool(attrs.get("side_effect_mem") or attrs.get("side_effect_io"))


class PrimitivePatcher:
    def __init__(self, runner: Callable, switch: Any):
        self.runner = runner      # runner(orig, base, name, args, kwargs, inplace)
        self.switch = switch
        self._patched: Dict[int, Tuple[Any, type]] = {}
        self.models = WeakIdSet()          # models already walked (held weakly)

    def install(self, model: Any) -> None:
        if not self.models.add(model):
            return
        for _, cell in model.cells_and_names():
            for attr, value in list(vars(cell).items()):
                if isinstance(value, Primitive) and id(value) not in self._patched:
                    self._patch(value, attr)

    def _patch(self, prim: Any, attr: str) -> None:
        orig_cls = type(prim)
        base = primitive_base(attr, orig_cls.__name__)
        runner, switch = self.runner, self.switch
        inplace = _side_effect(prim)

        def __call__(self, *args, **kwargs):
            call = orig_cls.__call__
            if DEPTH.value or not switch.active:
                return call(self, *args, **kwargs)
            return runner(lambda *a, **k: call(self, *a, **k), base, attr, args, kwargs, inplace)

        sub = type(orig_cls.__name__, (orig_cls,), {"__call__": __call__, "__module__": orig_cls.__module__,
                                                   "__qualname__": orig_cls.__qualname__,
                                                   "__tsprobe_primitive__": True})
        prim.__class__ = sub
        self._patched[id(prim)] = (prim, orig_cls)

    def restore(self) -> None:
        for prim, orig_cls in self._patched.values():
            try:
                prim.__class__ = orig_cls
            except TypeError:      # pragma: no cover
                pass
        self._patched.clear()
        self.models.clear()
