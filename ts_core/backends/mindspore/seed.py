"""seed_all for MindSpore (msprobe seed 003 §6.4): fixed seeds, optional deterministic kernels,
optional dropout removal.

``rm_dropout=True`` turns these into exact identities, for instances created before *and*
after the call (msprobe's version only affects Dropout objects created afterwards):

- ``ops.Dropout`` (and so ``nn.Dropout``, which holds one): runs with keep_prob 1.0 and
  returns its input unchanged, with the kernel's all-ones mask;
- ``ops.Dropout2D`` / ``ops.Dropout3D``: return the input and an all-True mask;
- ``mint.nn.Dropout`` / ``mint.nn.Dropout2d`` (Cells): ``construct`` returns the input;
- ``mint.nn.functional.dropout`` / ``dropout2d`` and ``ops.dropout`` / ``dropout1d`` /
  ``dropout2d`` / ``dropout3d``: return the input.

``restore_dropout()`` undoes it. Call ``seed_all`` before ``debugger.start()``: an L1 patch
installed earlier would keep (and later restore) the function it wrapped.
"""
from __future__ import annotations

import functools
import os
import random
from typing import Any, List, Tuple

import numpy as np
import mindspore as ms
from mindspore import mint, ops
from mindspore.ops.primitive import Primitive

from ._runtime import warm_up

_FUNCTIONAL = ((ops, ("dropout", "dropout1d", "dropout2d", "dropout3d")),
               (mint.nn.functional, ("dropout", "dropout2d")))
_CELLS = ("Dropout", "Dropout2d")       # mint.nn
_MISSING = object()
_saved: List[Tuple[Any, str, Any]] = []


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed_all: seed must be an int in [0, 2**32), got {seed!r}")
    if not isinstance(mode, bool):
        raise ValueError(f"seed_all: mode must be True or False, got {mode!r}")
    if not isinstance(rm_dropout, bool):
        raise ValueError(f"seed_all: rm_dropout must be True or False, got {rm_dropout!r}")
    warm_up()
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    _set_deterministic(mode)
    if rm_dropout:
        remove_dropout()


def _set_deterministic(mode: bool) -> None:
    try:
        current = ms.get_context("deterministic")
    except Exception:      # pragma: no cover
        current = None
    if mode:
        ms.set_context(deterministic="ON")
        os.environ["HCCL_DETERMINISTIC"] = "true"
    elif current == "ON":
        ms.set_context(deterministic="OFF")
        os.environ["HCCL_DETERMINISTIC"] = "false"


def _patch(owner: Any, attr: str, value: Any) -> None:
    _saved.append((owner, attr, owner.__dict__.get(attr, _MISSING)))
    setattr(owner, attr, value)


def remove_dropout() -> None:
    """Make every MindSpore dropout listed in the module docstring an exact no-op. Idempotent."""
    if _saved:
        return
    drop = ops.Dropout

    def dropout_call(self, x):
        _, mask = Primitive.__call__(self, x, 1.0, self.Seed0, self.Seed1)
        return x, mask
    dropout_call.__tsprobe_no_dropout__ = True
    _patch(drop, "__call__", dropout_call)

    def nd_call(self, x):
        return x, ops.ones(x.shape, ms.bool_)
    nd_call.__tsprobe_no_dropout__ = True
    for cls in (ops.Dropout2D, ops.Dropout3D):
        _patch(cls, "__call__", nd_call)

    def identity_construct(self, input, *args, **kwargs):    # noqa: A002 - MindSpore's name
        return input
    for name in _CELLS:
        cls = getattr(mint.nn, name, None)
        if cls is not None:
            _patch(cls, "construct", identity_construct)

    for owner, names in _FUNCTIONAL:
        for name in names:
            orig = getattr(owner, name, None)
            if orig is None:
                continue

            def make(orig):
                @functools.wraps(orig)
                def no_dropout(input, *args, **kwargs):     # noqa: A002
                    return input
                no_dropout.__tsprobe_no_dropout__ = True
                return no_dropout
            _patch(owner, name, make(orig))


def restore_dropout() -> None:
    """Undo ``remove_dropout`` (``seed_all(rm_dropout=True)``)."""
    while _saved:
        owner, attr, orig = _saved.pop()
        if orig is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, orig)
