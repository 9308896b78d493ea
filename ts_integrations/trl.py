"""TRL: run ``ts_core.rl.check`` every N steps of a ``GRPOTrainer`` and write its report.

::

    trainer = GRPOTrainer(model=..., args=GRPOConfig(use_vllm=True, vllm_mode="colocate", ...), ...)
    RLCheckCallback(prompts=["..."], every=50, out="rl_check").attach(trainer)
    trainer.train()          # rl_check/step50/report.html, rl_check/step100/...

With TRL's colocated engine (``use_vllm=True, vllm_mode="colocate"``), TRL pushes the policy's
weights into its ``LLM`` lazily, at the start of the next generation (``VLLMGeneration.
sync_weights``). A check at ``on_step_end`` would find the engine one update behind and report
"not synced" for a correct run, so ``attach`` wraps ``sync_weights``: the check runs right after
the push of every N-th step, on the engine TRL generates with, at TRL's temperature (TRL asks
for ``processed_logprobs``). With another engine of your own (``llm=``), the check runs at
``on_step_end``; ``push=True`` first loads the policy's weights into that engine (a side engine
that only the check uses). Neither changes the training's numbers: the check runs forwards under
``no_grad`` and sampling requests of its own (seeded, under their own prefix-cache salt).

On vLLM's CPU build, create the trainer inside ``ts_integrations.vllm_rl.live_weights()`` (TRL
builds its colocated ``LLM`` in ``GRPOTrainer.__init__``), or TRL's own weight sync fails on the
packed layers. Nothing here imports trl or vllm at module import time.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Optional, Sequence

try:                                       # the callback base when transformers is there
    from transformers import TrainerCallback as _Base
except ImportError:                        # pragma: no cover - transformers is TRL's dependency
    _Base = object

__all__ = ["RLCheckCallback"]


class RLCheckCallback(_Base):
    """Check trainer/engine consistency every `every` optimizer steps (see the module doc)."""

    def __init__(self, prompts: Sequence[Any], every: int = 50, out: str = "rl_check", *, llm: Any = None,
                 push: bool = False, max_tokens: int = 8, localise: bool = True):
        if every < 1:
            raise ValueError(f"RLCheckCallback(every=...) must be >= 1, got {every}")
        if not prompts:
            raise ValueError("RLCheckCallback needs prompts (a few texts, or token-id lists) to roll out")
        self.prompts, self.every, self.out = list(prompts), int(every), out
        self.llm, self.push, self.max_tokens, self.localise = llm, push, max_tokens, localise
        self.trainer: Any = None
        self.verdicts: List[Dict[str, Any]] = []
        self._wrapped = False

    # -- wiring -------------------------------------------------------------------------------
    def attach(self, trainer: Any) -> "RLCheckCallback":
        """Add this callback to `trainer` and, with TRL's colocated engine, hook its weight sync."""
        self.trainer = trainer
        trainer.add_callback(self)
        gen = getattr(trainer, "vllm_generation", None)
        if self.llm is None and gen is not None:
            if getattr(gen, "mode", "colocate") != "colocate":
                raise ValueError("RLCheckCallback checks an engine in this process: TRL's vllm_mode='server' runs "
                                 "it elsewhere; pass llm= an engine of your own (push=True) instead")
            sync = gen.sync_weights

            def sync_then_check(*a: Any, **kw: Any) -> Any:
                res = sync(*a, **kw)
                step = int(trainer.state.global_step)
                if step and step % self.every == 0:
                    self._check(trainer.model, gen.llm, step, temperature=float(getattr(trainer, "temperature", 1.0)))
                return res

            gen.sync_weights = sync_then_check
            self._wrapped = True
        elif self.llm is None:
            warnings.warn("RLCheckCallback: this trainer has no vLLM engine (use_vllm=False) and no llm= was "
                          "given: nothing to check", RuntimeWarning)
        return self

    # -- the trainer's events ----------------------------------------------------------------
    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        if self._wrapped or self.llm is None:
            return control
        step = int(state.global_step)
        if step % self.every == 0:
            if self.push:
                from .vllm_rl import push_weights

                push_weights(self.llm, _unwrap(self.trainer, model))
            self._check(model, self.llm, step)
        return control

    # -- the check -------------------------------------------------------------------------------
    def _check(self, model: Any, llm: Any, step: int, temperature: float = 1.0) -> None:
        from ts_core.rl import check

        policy = _unwrap(self.trainer, model)
        out = os.path.join(self.out, f"step{step}")
        try:
            rep = check(policy, llm, self.prompts, max_tokens=self.max_tokens, temperature=temperature, out=out,
                        localise=self.localise)
        except Exception as exc:         # a failed check must not stop the training
            warnings.warn(f"RLCheckCallback: the check at step {step} failed ({type(exc).__name__}: {exc})",
                          RuntimeWarning)
            self.verdicts.append({"step": step, "status": "ERROR", "cause": repr(exc)})
            return
        v = rep["verdict"]
        self.verdicts.append({"step": step, "status": v["status"], "cause": v["cause"], "report": out})
        if v["status"] != "PASS":
            warnings.warn(f"rl-check at step {step}: {v['status']} ({v['cause']}): {v['message']} "
                          f"-> {os.path.join(out, 'report.html')}", RuntimeWarning)


def _unwrap(trainer: Optional[Any], model: Any) -> Any:
    acc = getattr(trainer, "accelerator", None)
    m = model if model is not None else getattr(trainer, "model", None)
    return acc.unwrap_model(m) if acc is not None and m is not None else m
