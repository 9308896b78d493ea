"""A verl/OpenRLHF-style RL loop with a colocated vLLM engine, checked by ``ts_core.rl.check`` every N steps.

    .venv/bin/python recipes/rl_loop_recipe.py [--out DIR] [--model DIR] [--steps 4] [--check-every 2]

The policy is a Hugging Face causal LM; the rollout engine is an in-process vLLM ``LLM`` on the
same checkpoint (built inside ``live_weights()``: vLLM's CPU build would otherwise pack its linear
weights once and never see a push). Each step: sample a group of completions per prompt with their
log-probs, a toy reward (the share of completion tokens with an even id), group-normalised
advantages (GRPO), a clipped importance-ratio loss against the *rollout's* log-probs, one AdamW
step, then the new weights pushed into the engine (``load_weights`` inside the worker). Every
``check_every`` steps the check runs and writes ``OUT/step{N}/report.html``; it never changes the
training's numbers (tests/rl/test_rl_loop.py: parameters with the check == without, bit for bit).
Without ``--model`` a tiny Llama (random weights, tokenizer trained here) is built.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

PROMPTS = ["hello my name is", "the quick brown fox"]


def build_engine(model_dir: str, dtype: str = "float32") -> Any:
    """The colocated rollout engine, in this process, with live weights."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    from ts_integrations.vllm_rl import live_weights

    with live_weights():
        return LLM(model=model_dir, enforce_eager=True, dtype=dtype, max_model_len=128,
                   kv_cache_memory_bytes=32 * 2**20, seed=0)


def grpo_loss(policy: Any, prompt: List[int], completions: List[List[int]], old_logp: List[List[float]],
              rewards: List[float], clip: float = 0.2) -> Any:
    """The clipped surrogate of one prompt's group, token-mean, against the rollout's log-probs."""
    import torch

    r = torch.tensor(rewards, dtype=torch.float32)
    adv = (r - r.mean()) / (r.std() + 1e-4)
    total, count = 0.0, 0
    for comp, old, a in zip(completions, old_logp, adv):
        ids = torch.tensor([prompt + comp])
        logp = torch.log_softmax(policy(input_ids=ids).logits[0].float(), dim=-1)
        n = len(prompt)
        new = logp[n - 1:n - 1 + len(comp)].gather(1, torch.tensor(comp)[:, None])[:, 0]
        ratio = torch.exp(new - torch.tensor(old))
        surr = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip, 1 + clip) * a)
        total = total - surr.sum()
        count += len(comp)
    return total / max(count, 1)


def train(llm: Any, model_dir: str, *, steps: int = 4, check_every: int = 0, out: Optional[str] = None,
          group: int = 4, max_tokens: int = 6, seed: int = 0, lr: float = 1e-3) -> Dict[str, Any]:
    """Run the loop from the checkpoint (the engine is first given the checkpoint's weights).
    Returns the final parameters, the losses and the check reports' verdicts."""
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams

    from ts_core.rl import check
    from ts_integrations.vllm_rl import push_weights

    torch.manual_seed(seed)
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    push_weights(llm, policy)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr)
    tok = llm.get_tokenizer()
    prompts = [list(tok(p)["input_ids"]) for p in PROMPTS]
    losses, verdicts = [], []
    for step in range(1, steps + 1):
        params = SamplingParams(n=group, max_tokens=max_tokens, temperature=1.0, seed=seed * 1000 + step,
                                logprobs=0, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        policy.train()
        loss = 0.0
        for prompt, res in zip(prompts, outs):
            comps = [list(c.token_ids) for c in res.outputs]
            old = [[float(lp[t].logprob) for t, lp in zip(c.token_ids, c.logprobs)] for c in res.outputs]
            rewards = [sum(t % 2 == 0 for t in c) / len(c) for c in comps]
            loss = loss + grpo_loss(policy, prompt, comps, old, rewards) / len(prompts)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        push_weights(llm, policy)
        if check_every and step % check_every == 0:
            rep = check(policy, llm, PROMPTS, max_tokens=4, out=os.path.join(out, f"step{step}") if out else None)
            verdicts.append({"step": step, "status": rep["verdict"]["status"], "cause": rep["verdict"]["cause"]})
    return {"params": {n: p.detach().clone() for n, p in policy.named_parameters()}, "losses": losses,
            "verdicts": verdicts}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="rl_loop_output")
    ap.add_argument("--model", default=None, help="a Llama-like checkpoint folder (default: build a tiny one)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--check-every", type=int, default=2, help="0: never check")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.model is None:
        from hf_generate_recipe import build_tiny_llama

        args.model = build_tiny_llama(os.path.join(args.out, "tiny-llama"))
    llm = build_engine(args.model)
    res = train(llm, args.model, steps=args.steps, check_every=args.check_every, out=args.out)
    for n, loss in enumerate(res["losses"], 1):
        print(f"step {n}: loss {loss:.6f}")
    for v in res["verdicts"]:
        print(f"step {v['step']}: rl-check {v['status']}" + (f" ({v['cause']})" if v["cause"] else "")
              + f" -> {os.path.join(args.out, 'step%d' % v['step'], 'report.html')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
