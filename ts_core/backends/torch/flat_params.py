"""FSDP1's flat parameters (``FullyShardedDataParallel(use_orig_params=False)``), seen as the
user's parameters.

FSDP1 flattens the parameters of each wrapped module into one ``FlatParameter`` (registered as
``_flat_param`` on the wrapped module) and leaves plain tensor views in their modules' attributes
while they are unsharded: the modules own no parameter any more, and the one gradient is of the
concatenation. Recorded as it is, a Linear's forward record has no ``parameters`` and the
``parameters_grad`` records are one ``_flat_param`` per wrapped block: nothing pairs with the
plain model's records. Here each original parameter becomes a slice of its flat parameter (its
offset, numel and shape, read from FSDP's own ``_param_infos``/``_numels_with_padding``), with
its values and its gradient read through that slice, under its own module and name.

A slice is read only where the flat tensor is whole (its unpadded numel at least the slice's
end): with world size 1 (FSDP uses NO_SHARD) and during a forward (parameters all-gathered). A
sharded gradient (FULL_SHARD, several ranks) has no whole parameter on a rank: it is not
recorded (``use_orig_params=True`` records it per parameter, as FSDP2 does).
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable, Dict, Optional

import torch

from .._depth import internal

FLAT_PARAM = "_flat_param"


class FlatSlice:
    """One original parameter inside a ``FlatParameter``: what a hook or a record reads of it."""

    __slots__ = ("flat", "start", "numel", "shape", "__weakref__")
    requires_grad = True

    def __init__(self, flat: torch.Tensor, start: int, numel: int, shape: torch.Size):
        self.flat = weakref.ref(flat)
        self.start, self.numel, self.shape = start, numel, shape

    def of(self, t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """This parameter's part of `t` (the flat parameter's data or gradient), or None when `t`
        is absent or a shard that does not hold all of it."""
        if t is None or t.dim() != 1 or t.numel() < self.start + self.numel:
            return None
        with internal():          # from a gradient hook too: not the user's calls
            return t[self.start:self.start + self.numel].view(self.shape)

    def value(self, module: torch.nn.Module, name: str) -> Optional[torch.Tensor]:
        """The parameter as `module`'s forward uses it: the view FSDP set as its attribute
        while unsharded, else this slice of the flat parameter's data."""
        view = module.__dict__.get(name)
        if isinstance(view, torch.Tensor):
            return view
        flat = self.flat()
        return None if flat is None else self.of(flat.detach())

    def grad(self) -> Optional[torch.Tensor]:
        flat = self.flat()
        return None if flat is None else self.of(flat.grad)

    def hook(self, fn: Callable[[Any], None]) -> Any:
        """``fn(this parameter's gradient)`` after each accumulation into the flat parameter (a
        shard of it that does not hold this parameter: a warning, once, and nothing recorded)."""
        flat = self.flat()
        if flat is None:
            return None

        def on_grad(p: torch.Tensor) -> None:
            grad = self.of(p.grad)
            if grad is None and p.grad is not None:
                _warn_sharded()
            fn(grad)
        return flat.register_post_accumulate_grad_hook(on_grad)


_WARNED = [False]


def _warn_sharded() -> None:
    if not _WARNED[0]:
        _WARNED[0] = True
        warnings.warn("tsprobe: FSDP1 flat parameters are sharded across ranks (use_orig_params=False): a rank holds "
                      "no whole parameter gradient, so parameters_grad is not recorded for them. Wrap with "
                      "use_orig_params=True to record them per parameter.", RuntimeWarning, stacklevel=2)


def _is_flat(p: Any) -> bool:
    return getattr(p, "_is_flat_param", False) is True and hasattr(p, "_param_infos")


def slices_of(model: torch.nn.Module) -> Dict[int, Dict[str, FlatSlice]]:
    """id(module) -> {parameter name: its slice}, for every parameter FSDP1 flattened in
    `model` (tied parameters under each of their modules); {} when FSDP1 flattened nothing."""
    out: Dict[int, Dict[str, FlatSlice]] = {}
    for m in model.modules():
        flat = m._parameters.get(FLAT_PARAM)
        if flat is None or not _is_flat(flat):
            continue
        out.setdefault(id(m), {})          # the flat parameter's holder: it is no parameter of its own
        starts, pos = [], 0
        for numel, pad in zip(flat._numels_with_padding, flat._is_padding_mask):
            if not pad:
                starts.append(pos)
            pos += numel
        for info, start, numel, shape in zip(flat._param_infos, starts, flat._numels, flat._shapes):
            out.setdefault(id(info.module), {})[info.param_name] = FlatSlice(flat, start, numel, shape)
        for info in getattr(flat, "_shared_param_infos", ()):
            prim = out.get(id(info.prim_module), {}).get(info.prim_param_name)
            if prim is not None:
                out.setdefault(id(info.module), {})[info.param_name] = prim
    return out
