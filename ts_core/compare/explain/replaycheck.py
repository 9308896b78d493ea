"""Replay the target's call on golden's inputs (acc-check's replay machinery): does the
difference come with the inputs (inherited from upstream) or is it computed by the call
itself (born here)? Also gives the float64 result the precision hypothesis needs.

The target's recorded call is rebuilt with ``acccheck.plan`` and run by the framework's
replayer (``backends/<framework>/replay.py``), once on the target's own inputs and once with
every tensor argument swapped for golden's value of it. Needs the framework and a tensor dump.
A PyTorch call numpy computes as well (``acccheck/numpy_replay.py``: linear, embedding, a norm,
softmax, an activation, an elementwise op; no 16-bit tensor) is replayed in numpy while torch is
not loaded: importing it took several times the rest of a 2 GB compare.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np

from ..load.loader import INPUT, is_tensor_summary
from .values import Values


@dataclass
class Replays:
    """Outputs (flattened, float64) of the target's call: reference = float64, peer = recorded dtypes."""

    on_golden: Any          # acccheck.outcome.Outcome on golden's inputs
    on_target: Any          # ... on target's own inputs
    swapped: List[str]      # the tensor arguments that took golden's value


def _inputs_saved(call: Any) -> bool:
    """The call recorded its inputs (``torch.arange(0, 5)`` records only numbers), and every
    tensor among them has its tensor file named."""
    inputs = [e.leaf for e in call.entries if e.role == INPUT]
    return bool(inputs) and all(leaf.get("data_name") for leaf in inputs if is_tensor_summary(leaf))


def replay_on_golden(values: Values) -> Optional[Replays]:
    """None when the call cannot be replayed (a module, a group, a statistics dump, no framework)."""
    cp, td = values.cp, values.dumps["target"]
    call = cp.target
    if call is None or cp.golden is None or call.kind != "api" or call.members or "+" in call.key:
        return None
    rec = td.data.get(call.key)
    if not isinstance(rec, dict) or not _inputs_saved(call) or not _inputs_saved(cp.golden):
        return None         # checked before importing the framework (seconds) for a replay that cannot run
    try:
        from ...acccheck.check import _replayer
        from ...acccheck.plan import build_plans
        from ...acccheck.standards import STANDARDS_YAML, load_standards
    except ImportError:
        return None
    plans, _ = build_plans({call.key: rec}, load_standards(STANDARDS_YAML)["random_apis"])
    if not plans or plans[0].problem:
        return None
    plan = plans[0]
    from ...acccheck.numpy_replay import ADAPTER as NUMPY

    if (td.framework or "pytorch") == "pytorch" and "torch" not in sys.modules and NUMPY.covers(plan):
        got = _replay_both(NUMPY, plan, values, td)
        if got is not None:
            return got
    adapter, why = _replayer(td.framework)
    if adapter is None:
        return None
    return _replay_both(adapter, plan, values, td)


def _replay_both(adapter: Any, plan: Any, values: Values, td: Any) -> Optional[Replays]:
    """The call replayed through `adapter` on target's inputs and on golden's; None when it fails."""
    from ...acccheck.outcome import ReplayError
    from ...acccheck.replay import replay
    from ...backends._depth import internal

    swapped: List[str] = []

    def own(t: Any) -> np.ndarray:
        return td.load_tensor(t.data_name)

    def golden(t: Any) -> np.ndarray:
        g = values.array("golden", INPUT, t.name)
        if g is not None and list(g.shape) == list(t.shape):
            if t.name not in swapped:
                swapped.append(t.name)
            return g
        return own(t)

    try:
        with internal():
            resolved = adapter.resolve(plan, {})
            on_target = replay(adapter, plan, resolved, own, backward=False)
            on_golden = replay(adapter, plan, resolved, golden, backward=False)
    except (ReplayError, Exception):      # a call that cannot be replayed: no evidence either way
        return None
    return Replays(on_golden, on_target, swapped)
