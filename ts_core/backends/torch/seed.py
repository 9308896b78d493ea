"""seed_all for torch (msprobe seed 003 §6.4): fixed seeds, optional deterministic kernels,
optional dropout removal."""
from __future__ import annotations

import functools
import os
import random

import numpy as np
import torch

_DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"seed_all: seed must be an int in [0, 2**32), got {seed!r}")
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if mode:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    if rm_dropout:
        remove_dropout()


def restore_dropout() -> None:
    """Undo ``remove_dropout``."""
    F = torch.nn.functional
    for name in _DROPOUTS:
        fn = getattr(F, name, None)
        if getattr(fn, "__tsprobe_no_dropout__", False):
            setattr(F, name, fn.__wrapped__)


def remove_dropout() -> None:
    """Make every torch dropout function (and so nn.Dropout*) a no-op: p is forced to 0."""
    F = torch.nn.functional
    for name in _DROPOUTS:
        orig = getattr(F, name, None)
        if orig is None or getattr(orig, "__tsprobe_no_dropout__", False):
            continue

        def make(orig):
            @functools.wraps(orig)
            def no_dropout(input, p=0.5, *args, **kwargs):
                return orig(input, 0.0, *args, **kwargs)
            no_dropout.__tsprobe_no_dropout__ = True
            return no_dropout

        setattr(F, name, make(orig))
