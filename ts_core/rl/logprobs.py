"""Rollout log-probs against the trainer's: the per-token mismatch that skews importance ratios.

The engine samples each prompt's completion and returns, for each sampled token, its log-prob
(``SamplingParams(logprobs=0)``: the sampled token only). Which log-prob that is depends on the
engine's ``logprobs_mode`` (vLLM 0.32, ``ModelConfig.logprobs_mode``):

- ``raw_logprobs`` (the default): ``log_softmax`` of the model's logits, before temperature,
  penalties and top-k/top-p -- what the trainer's forward gives;
- ``processed_logprobs``: after those processors; the trainer side then divides its logits by
  the temperature (the only processor a rollout here uses; top-k/top-p are left off).

The trainer recomputes the same tokens with one forward over prompt + completion: the log-prob of
token t is ``log_softmax(logits[t - 1])`` in float32 (as RL trainers do, whatever the model
dtype). The KL estimate is Schulman's k3 on the rollout's samples,
``mean(exp(r) - 1 - r)`` with ``r = logp_train - logp_rollout`` (>= 0, low variance).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

SEMANTICS = {"raw_logprobs": "raw_logprobs: log_softmax of the model's logits before temperature, penalties "
                             "and top-k/top-p (the trainer's log_softmax(logits))",
             "processed_logprobs": "processed_logprobs: log_softmax after temperature (the trainer divides "
                                   "its logits by the same temperature)"}


@dataclass
class Rollout:
    """One request: the prompt ids the engine used, its sampled ids and their log-probs."""
    prompt_ids: List[int]
    tokens: List[int]
    logp_rollout: List[float]
    logp_train: List[float] = field(default_factory=list)

    @property
    def sequence(self) -> List[int]:
        return list(self.prompt_ids) + list(self.tokens)


def logprobs_mode(llm: Any) -> str:
    cfg = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    return str(getattr(cfg, "logprobs_mode", "raw_logprobs"))


def rollout(llm: Any, prompt_ids: Sequence[Sequence[int]], *, max_tokens: int = 8, temperature: float = 1.0,
            seed: int = 0, cache_salt: Optional[str] = None) -> List[Rollout]:
    """Sample one completion per prompt and keep the engine's log-prob of each sampled token.

    `cache_salt` keeps these requests' prefix-cache blocks apart from the training loop's (a
    check neither reuses the loop's cached KV nor leaves blocks the loop would hit)."""
    from vllm import SamplingParams

    mode = logprobs_mode(llm)
    if mode not in SEMANTICS:
        raise ValueError(f"rl-check compares log-probs; this engine returns {mode!r} (logprobs_mode): create "
                         f"the LLM with logprobs_mode='raw_logprobs' (the default) or 'processed_logprobs'")
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, logprobs=0,
                            ignore_eos=True, top_p=1.0, top_k=-1)
    salt = {"cache_salt": cache_salt} if cache_salt else {}
    outs = llm.generate([{"prompt_token_ids": list(p), **salt} for p in prompt_ids], params, use_tqdm=False)
    res = []
    for out in outs:
        comp = out.outputs[0]
        toks = list(comp.token_ids)
        lps = [float(step[t].logprob) for t, step in zip(toks, comp.logprobs)]
        res.append(Rollout(list(out.prompt_token_ids), toks, lps))
    return res


def trainer_logprobs(model: Any, rollouts: List[Rollout], *, temperature: float = 1.0,
                     processed: bool = False) -> None:
    """Fill ``logp_train`` of each rollout with the trainer forward's log-prob of its tokens."""
    import torch

    dev = next(model.parameters()).device
    with torch.no_grad():
        for r in rollouts:
            ids = torch.tensor([r.sequence], device=dev)
            logits = model(input_ids=ids).logits[0].float()
            if processed and temperature not in (0.0, 1.0):
                logits = logits / temperature
            lp = torch.log_softmax(logits, dim=-1)
            n = len(r.prompt_ids)
            idx = torch.tensor(r.tokens, device=dev)
            r.logp_train = lp[n - 1:n - 1 + len(r.tokens)].gather(1, idx[:, None])[:, 0].cpu().tolist()


def token_rows(rollouts: List[Rollout], tokenizer: Any = None) -> List[Dict[str, Any]]:
    """One row per sampled token: request, position, token id and text, both log-probs, the difference."""
    rows = []
    for i, r in enumerate(rollouts):
        for j, (t, lr, lt) in enumerate(zip(r.tokens, r.logp_rollout, r.logp_train)):
            text = tokenizer.decode([t]) if tokenizer is not None else str(t)
            rows.append({"request": i, "position": len(r.prompt_ids) + j, "index": j, "token": int(t),
                         "text": text, "logp_rollout": lr, "logp_train": lt, "diff": lt - lr})
    return rows


def mismatch(rows: List[Dict[str, Any]], worst: int = 8) -> Dict[str, Any]:
    """max and mean |dlogp|, the k1/k3 KL estimates, the importance ratio's range, the worst tokens."""
    if not rows:
        return {"tokens": 0, "max_abs": 0.0, "mean_abs": 0.0, "kl_k1": 0.0, "kl_k3": 0.0, "worst": []}
    d = np.array([r["diff"] for r in rows], dtype=np.float64)
    k3 = np.exp(d) - 1.0 - d
    order = np.argsort(-np.abs(d), kind="stable")[:worst]
    return {"tokens": len(rows), "max_abs": float(np.max(np.abs(d))), "mean_abs": float(np.mean(np.abs(d))),
            "kl_k1": float(np.mean(-d)), "kl_k3": float(np.mean(k3)),
            "ratio_min": float(math.exp(d.min())), "ratio_max": float(math.exp(d.max())),
            "worst": [rows[int(i)] for i in order]}


def tokenisation_diff(prompts: Sequence[str], engine_tok: Any, trainer_tok: Any,
                      add_special_tokens: bool = True) -> List[Dict[str, Any]]:
    """The prompts the two tokenizers encode differently, with the first differing token."""
    out = []
    for i, text in enumerate(prompts):
        a = list(engine_tok(text, add_special_tokens=add_special_tokens)["input_ids"])
        b = list(trainer_tok(text, add_special_tokens=add_special_tokens)["input_ids"])
        if a == b:
            continue
        k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        out.append({"request": i, "text": text, "engine_ids": a, "trainer_ids": b, "first_diff": k,
                    "engine_piece": engine_tok.decode(a[k:k + 1]) if k < len(a) else "",
                    "trainer_piece": trainer_tok.decode(b[k:k + 1]) if k < len(b) else ""})
    return out


def engine_tokenizer(llm: Any) -> Optional[Any]:
    try:
        return llm.get_tokenizer()
    except Exception:
        return None
