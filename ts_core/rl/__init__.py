"""RL train <-> rollout consistency: where a trainer's forward and its rollout engine (vLLM) disagree.

``ts_core.rl.check(model, llm, prompts, out=DIR)`` answers three questions: are the engine's
weights the trainer's (:mod:`.weights`), how big is the per-token log-prob mismatch
(:mod:`.logprobs`, against the noise band of :mod:`.noise`), and where do the two forwards part
(:mod:`.localise`, by the mapping table of :mod:`.stages`); :mod:`.diagnose` names the cause,
:mod:`.report` writes it. ``tsprobe rl-check`` is the command (:mod:`.cli`). See docs/rl.md.

Importing this package imports neither torch nor vLLM.
"""
from __future__ import annotations

from typing import Any

__all__ = ["check", "check_weights"]


def check(*args: Any, **kwargs: Any) -> Any:
    from .consistency import check as _check

    return _check(*args, **kwargs)


def check_weights(model: Any, llm: Any) -> Any:
    """Only the weight-sync check (cheap: one checksum per parameter on each side)."""
    from .weights import check_weights as _cw

    return _cw(model, llm)
