"""Spike detection on one scalar series (the loss, the global gradient norm), with the decision
rule of Lightning's ``SpikeDetection`` (``lightning.fabric.utilities.spike``), on host floats.

For each value, once ``warmup`` values have been offered:

- with ``finite_only``, a NaN/Inf value is a spike;
- a value no worse than the last accepted one (``mode`` min: not larger; max: not smaller) is
  not a spike;
- otherwise it is a spike when ``|value - mean| >= atol`` (if atol is set) and
  ``|value - mean| >= rtol * |mean|`` (if rtol is set), ``mean`` being the running mean of the
  last ``window`` accepted values (NaN before the first one, so no spike then unless both
  tolerances are null, as in Lightning); with ``sigma`` also ``|value - mean| >= sigma * std``.

A value that is not a spike is accepted into the window. Two differences from Lightning, which
raises at the first spike: training may go on here, so a spike is never accepted (a lasting
jump triggers again, until ``max_captures``), and a NaN/Inf value never enters the mean.
Values are counted from the first one offered (Lightning counts ``batch_idx``, per epoch).
"""
from __future__ import annotations

import math
from collections import deque
from typing import Optional

from .options import SpikeConfig


class SpikeDetector:
    def __init__(self, cfg: SpikeConfig):
        self.cfg = cfg
        self.values: deque = deque(maxlen=cfg.window)
        self.last = 0.0             # Lightning starts from last_val = 0.0
        self.offered = 0

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else math.nan

    def check(self, value: Optional[float]) -> bool:
        """Is `value` a spike? Accepts it into the window when it is not."""
        if value is None:
            return False
        index, self.offered = self.offered, self.offered + 1
        spike = index >= self.cfg.warmup and self._is_spike(value)
        if not spike and math.isfinite(value):
            self.values.append(value)
            self.last = value
        return spike

    def _is_spike(self, value: float) -> bool:
        cfg = self.cfg
        if cfg.finite_only and not math.isfinite(value):
            return True
        diff = value - self.last
        if (diff <= 0.0) if cfg.mode == "min" else (diff >= 0.0):
            return False
        mean = self.mean
        gap = abs(value - mean)
        if cfg.atol is not None and not gap >= cfg.atol:
            return False
        if cfg.rtol is not None and not gap >= abs(cfg.rtol * mean):
            return False
        if cfg.sigma is not None and not gap >= cfg.sigma * self._std(mean):
            return False
        return True

    def _std(self, mean: float) -> float:
        n = len(self.values)
        return math.sqrt(sum((v - mean) ** 2 for v in self.values) / n) if n else math.nan
