"""The noise band: how far two correct forwards of the same weights and dtype may drift apart.

Two implementations of the same model in the same dtype (the trainer's eager forward, the
engine's fused kernels) round differently, so their outputs differ by a few units of the
dtype's precision -- numerics, not a bug. The band measures that on the user's own model and
tokens: the trainer's forward in its dtype against the same forward in float64, stage by stage
(:mod:`ts_core.rl.stages`) and per sampled token's log-prob. A finding must stand
``FACTOR`` times above what rounding alone gives (at least ``FLOOR_ULPS`` units of the dtype's
epsilon), so "consistent within the band" is a PASS.

Why FACTOR 16: on the tiny Llama of the tests (float32), the clean engine/trainer pair stays
within 1.5x the trainer's float32-vs-float64 error, at every stage and per token (stages: at most
5.8e-07 relative against 2.9e-07..7.2e-07; log-probs: 1.4e-06 against 9.5e-07); the faults the
tests plant stand 10^2..10^4 times above the band (bfloat16 engine: 220x at the embedding).
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Sequence

import numpy as np

from ts_core.model_hooks import ModelHook, hooks_of

from .stages import Stage, rel_err, rows

FACTOR = 16.0
FLOOR_ULPS = 64.0
_EPS = {"float32": 2.0 ** -23, "float64": 2.0 ** -52, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}


class _Capture(ModelHook):
    """Keep the first output of the named modules of one forward (as float64 rows)."""

    submodules = True

    def __init__(self, paths: Sequence[str]):
        self.paths = set(paths)
        self.out: Dict[str, List[np.ndarray]] = {}

    def module_context(self, path: str, module: Any) -> Any:
        return path if path in self.paths else None

    def post_forward(self, path: str, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        first = output[0] if isinstance(output, (tuple, list)) else output
        self.out.setdefault(path, []).append(rows(first))


def stage_outputs(model: Any, sequence: Sequence[int], stages: List[Stage]) -> Dict[str, np.ndarray]:
    """The trainer's output at every stage for one token sequence (one forward, no grad)."""
    import torch

    cap = _Capture([s.name for s in stages])
    handle = hooks_of(model).add(cap)
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([list(sequence)], device=next(model.parameters()).device))
    finally:
        handle.remove()
    return {k: v[0] for k, v in cap.out.items()}


def dtype_of(model: Any) -> str:
    return str(next(model.parameters()).dtype).replace("torch.", "")


def floor(dtype: str) -> float:
    return FLOOR_ULPS * _EPS.get(dtype, _EPS["float32"])


def measure(model: Any, sequences: Sequence[Sequence[int]], stages: List[Stage],
            trainer_logp: Sequence[Sequence[float]], completions: Sequence[Sequence[int]]) -> Dict[str, Any]:
    """The band of each stage and of a token's log-prob, from the trainer in its dtype against a
    float64 copy of it on the same sequences.

    Returns ``{"dtype", "stages": {name: band}, "logp": band, "noise": {name: measured}}``."""
    import torch

    from .logprobs import Rollout, trainer_logprobs

    dtype = dtype_of(model)
    ref = copy.deepcopy(model).to(torch.float64).eval()
    try:
        noise: Dict[str, float] = {s.name: 0.0 for s in stages}
        lp_noise = 0.0
        for seq, comp, lp in zip(sequences, completions, trainer_logp):
            a, b = stage_outputs(model, seq, stages), stage_outputs(ref, seq, stages)
            for name in noise:
                if name in a and name in b:
                    noise[name] = max(noise[name], rel_err(a[name], b[name]))
            r = Rollout(list(seq[:len(seq) - len(comp)]), list(comp), [])
            trainer_logprobs(ref, [r])
            if lp:
                lp_noise = max(lp_noise, float(np.max(np.abs(np.array(lp) - np.array(r.logp_train)))))
    finally:
        del ref
    fl = floor(dtype)
    return {"dtype": dtype, "factor": FACTOR, "noise": noise, "logp_noise": lp_noise,
            "stages": {k: max(FACTOR * v, fl) for k, v in noise.items()}, "logp": max(FACTOR * lp_noise, fl)}
