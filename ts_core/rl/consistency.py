"""``check(model, llm, prompts)``: the trainer's forward against the rollout engine's, end to end.

1. rollouts from the engine, with each sampled token's log-prob (:mod:`.logprobs`);
2. the same tokens through the trainer's forward; per-token |dlogp|, KL;
3. the weight-sync check, parameter by parameter (:mod:`.weights`);
4. the noise band of the trainer's dtype (:mod:`.noise`);
5. both forwards dumped on the worst request's sequence and paired stage by stage (:mod:`.localise`);
6. findings and a verdict (:mod:`.diagnose`), written as a report (:mod:`.report`).

Nothing here touches the trainer's parameters, gradients, optimizer or RNG streams: forwards run
under ``no_grad``, the float64 copy for the band is a deep copy, modules' train/eval flags and the
global RNG states are put back, and the engine is only asked to generate (seeded requests, under their own prefix-cache
salt) and to read its weights.
"""
from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from . import diagnose, logprobs, noise, weights
from .stages import llama_stages, num_layers_of

Prompt = Union[str, Sequence[int]]


class _RngState:
    """torch (CPU and CUDA), numpy and Python RNG states, put back after the check: a training loop
    that samples with the global generators (HF generate, dropout) draws the same numbers with the
    check on as with it off (tests/rl/test_trl.py)."""

    def __init__(self) -> None:
        import random

        import torch

        self.py, self.np, self.cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() \
            else None

    def restore(self) -> None:
        import random

        import torch

        random.setstate(self.py)
        np.random.set_state(self.np)
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def _engine_config(llm: Any) -> Any:
    return getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "hf_config", None)


def _prompt_ids(prompts: Sequence[Prompt], engine_tok: Any) -> List[List[int]]:
    if not prompts:
        raise ValueError("rl-check needs at least one prompt (text, or a list of token ids)")
    out = []
    for p in prompts:
        if isinstance(p, str):
            if engine_tok is None:
                raise ValueError("text prompts need the engine's tokenizer: this LLM has none "
                                 "(skip_tokenizer_init?); pass token ids instead")
            out.append(list(engine_tok(p)["input_ids"]))
        else:
            out.append([int(t) for t in p])
    return out


def check(model: Any, llm: Any, prompts: Sequence[Prompt], *, tokenizer: Any = None, max_tokens: int = 8,
          temperature: float = 1.0, seed: int = 0, out: Optional[str] = None, localise: bool = True,
          worst: int = 8) -> Dict[str, Any]:
    """Compare the trainer `model` (a Hugging Face causal LM) with the vLLM engine `llm` on rollouts
    of `prompts`; returns the report (a JSON-able dict) and, with `out`, writes report.json,
    tokens.csv and report.html there. `tokenizer`: the trainer's, when it is not the engine's
    (text prompts are then encoded by both and compared)."""
    from ts_core.rl.localise import localise as run_localise

    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    modes = [(m, m.training) for m in model.modules()]      # restored as they were, module by module
    rng = _RngState()                 # an in-process engine may draw from the global generators
    model.eval()
    try:
        etok = logprobs.engine_tokenizer(llm)
        ids = _prompt_ids(prompts, etok)
        tok_diff = []
        if tokenizer is not None and etok is not None:
            texts = [p if isinstance(p, str) else None for p in prompts]
            tok_diff = [d for d in logprobs.tokenisation_diff([t or "" for t in texts], etok, tokenizer)
                        if texts[d["request"]] is not None]
        mode = logprobs.logprobs_mode(llm)
        rolls = logprobs.rollout(llm, ids, max_tokens=max_tokens, temperature=temperature, seed=seed,
                                 cache_salt=f"tsprobe-rl-check-{uuid.uuid4().hex}")
        logprobs.trainer_logprobs(model, rolls, temperature=temperature, processed=mode == "processed_logprobs")
        rows = logprobs.token_rows(rolls, etok or tokenizer)     # the engine's ids: its tokenizer's text
        mm = logprobs.mismatch(rows, worst=worst)
        wsync = weights.check_weights(model, llm)
        cfg = diagnose.config_diff(getattr(model, "config", None), _engine_config(llm))
        stages = llama_stages(num_layers_of(model))
        band = noise.measure(model, [r.sequence for r in rolls], stages, [r.logp_train for r in rolls],
                             [r.tokens for r in rolls])
        loc = None
        if localise:
            req = mm["worst"][0]["request"] if mm["worst"] else 0
            scratch = None if out else tempfile.TemporaryDirectory(prefix="tsprobe_rl_")     # no out: no dumps kept
            try:
                loc = run_localise(model, llm, rolls[req].sequence, stages, band["stages"],
                                   os.path.join(out, "dumps") if out else scratch.name)
                loc["request"] = req
            except RuntimeError as exc:        # a multiprocess engine: its model is not in this process
                loc = {"skipped": str(exc), "stages": [], "first": None}
            finally:
                if scratch is not None:
                    scratch.cleanup()
                    if loc is not None:
                        loc["generic"] = {k: v for k, v in (loc.get("generic") or {}).items() if k != "report"}
                        loc["trainer_dump"] = loc["engine_dump"] = None
        found = diagnose.findings(tok_diff, wsync, cfg, mm, band["logp"], loc)
        report = {"verdict": diagnose.verdict(found), "findings": found,
                  "logprobs": {"semantics": logprobs.SEMANTICS[mode], "mode": mode, "temperature": temperature,
                               "band": band["logp"], **mm},
                  "tokens": rows, "weights": wsync, "config_diff": cfg, "tokenisation": tok_diff,
                  "band": band, "localisation": loc,
                  "requests": [{"prompt_ids": r.prompt_ids, "tokens": r.tokens} for r in rolls]}
    finally:
        for m, training in modes:
            m.training = training
        rng.restore()
    if out:
        from .report import write_report

        write_report(report, out)
    return report
