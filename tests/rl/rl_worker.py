"""Run in its own process by test_rl_check.py (vLLM edits its caller's environment):

    python tests/rl/rl_worker.py OUT_DIR MODEL_DIR float32|bfloat16|packed

One in-process engine (built inside ``live_weights()``), a trainer on the same checkpoint, and
the planted faults, each checked with ``ts_core.rl.check`` into ``OUT_DIR/<scenario>/``:

- float32 engine: ``clean``, ``tokenisation`` (the trainer's tokenizer is another BPE),
  ``rope_theta`` and ``rms_norm_eps`` (the trainer's config differs), ``unsynced`` (the trainer
  took an optimizer step, nothing pushed), ``stale_layer`` (pushed, all but layer 1),
  ``pushed`` (everything pushed);
- bfloat16 engine: ``bf16`` (a float32 trainer against it).

``packed``: a float32 engine built *without* ``live_weights()`` (vLLM's CPU default): what the
weight check says, and whether a pushed weight reaches the engine's compute.

The float32 process then runs recipes/rl_loop_recipe.py's loop on the same engine, without and
with the check every step (``OUT_DIR/loop/``: facts.json, step{N}/report.html).

Facts the reports cannot tell (independent computations) go to OUT_DIR/facts.json.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "recipes"))

PROMPTS = ["hello my name is", "the quick brown fox"]
MAX_TOKENS = 6


def other_tokenizer():
    """A BPE trained on other text: the same prompt encodes to other ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["hello there, my dear name", "quick quick brown brown"] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def trainer_with(model_dir: str, **config_changes):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if not config_changes:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = AutoConfig.from_pretrained(model_dir)
    for k, v in config_changes.items():
        if k == "rope_theta":
            cfg.rope_parameters = {**cfg.rope_parameters, "rope_theta": v}
        else:
            setattr(cfg, k, v)
    return AutoModelForCausalLM.from_pretrained(model_dir, config=cfg, dtype=torch.float32).eval()


def packed(out: str, model_dir: str) -> int:
    """vLLM's CPU default packs linear weights at load: the check says so; a push changes nothing."""
    import torch
    from vllm import LLM, SamplingParams

    from ts_core.rl import check
    from ts_integrations.vllm_rl import push_weights

    llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", max_model_len=128,
              kv_cache_memory_bytes=32 * 2**20, seed=0)
    trainer = trainer_with(model_dir)
    seq = list(range(3, 15))

    def prompt_logprobs():
        res = llm.generate([{"prompt_token_ids": seq}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                           use_tqdm=False)[0]
        return [res.prompt_logprobs[p][t].logprob for p, t in enumerate(seq) if p > 0]

    before = prompt_logprobs()
    rep = check(trainer, llm, PROMPTS, max_tokens=4, out=os.path.join(out, "packed"), localise=False)
    with torch.no_grad():
        for p in trainer.parameters():
            p.mul_(-1.0)                # a push that must change the engine's output
    try:
        push_weights(llm, trainer)
        push_error = None
    except Exception as exc:            # the packed layers' stand-in parameters have no weight_loader
        push_error = type(exc).__name__
    mid = prompt_logprobs()             # the failed push loaded what came before the first packed layer
    push_weights(llm, trainer, only=lambda name: name == "lm_head.weight")     # kept, but packed too
    facts = {"packed": rep["weights"]["packed"], "verdict": rep["verdict"], "kinds": [f["kind"] for f in rep["findings"]],
             "push_error": push_error, "changed_by_failed_push": mid != before, "unchanged_after_lm_head_push": prompt_logprobs() == mid}
    with open(os.path.join(out, "facts.json"), "w", encoding="utf-8") as f:
        json.dump(facts, f, indent=1)
    return 0


def loop(llm, model_dir: str, out: str) -> None:
    """The recipe's loop twice from the checkpoint (it pushes the checkpoint into the engine first):
    without the check, then with it every step; are the parameters and losses bit-identical?"""
    import torch

    import rl_loop_recipe as recipe

    off = recipe.train(llm, model_dir, steps=3, check_every=0)
    on = recipe.train(llm, model_dir, steps=3, check_every=1, out=out)
    start = recipe.train(llm, model_dir, steps=0)["params"]
    facts = {"losses_off": off["losses"], "losses_on": on["losses"], "verdicts": on["verdicts"],
             "params_equal": sorted(n for n in off["params"] if torch.equal(off["params"][n], on["params"][n])),
             "params_moved": sorted(n for n in off["params"] if not torch.equal(off["params"][n], start[n])),
             "num_params": len(off["params"])}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "facts.json"), "w", encoding="utf-8") as f:
        json.dump(facts, f, indent=1)


def main(out: str, model_dir: str, dtype: str) -> int:
    import numpy as np
    import torch
    from vllm import LLM, SamplingParams

    from ts_core.rl import check
    from ts_integrations.vllm_rl import live_weights, push_weights

    if dtype == "packed":
        return packed(out, model_dir)
    with live_weights():
        llm = LLM(model=model_dir, enforce_eager=True, dtype=dtype, max_model_len=128,
                  kv_cache_memory_bytes=32 * 2**20, seed=0)
    facts = {}

    def run(name, model, **kw):
        rep = check(model, llm, PROMPTS, max_tokens=MAX_TOKENS, out=os.path.join(out, name), **kw)
        facts.setdefault("verdicts", {})[name] = rep["verdict"]["status"]

    if dtype == "bfloat16":
        run("bf16", trainer_with(model_dir))
    else:
        trainer = trainer_with(model_dir)
        run("clean", trainer)
        # independent numbers: the engine's prompt log-probs of the clean rollout's sequence (another
        # vLLM path), the trainer's log-softmax in numpy float64, zlib CRC-32 of the trainer's weights
        with open(os.path.join(out, "clean", "report.json"), encoding="utf-8") as f:
            rep = json.load(f)
        req = rep["requests"][0]
        seq = req["prompt_ids"] + req["tokens"]
        res = llm.generate([{"prompt_token_ids": seq}], SamplingParams(max_tokens=1, prompt_logprobs=0),
                           use_tqdm=False)[0]
        facts["engine_prompt_logprobs"] = [res.prompt_logprobs[p][t].logprob
                                           for p, t in enumerate(seq) if p >= len(req["prompt_ids"])]
        with torch.no_grad():
            logits = trainer(input_ids=torch.tensor([seq])).logits[0].double().numpy()
        lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        n = len(req["prompt_ids"])
        facts["numpy_logp_train"] = [float(logits[p - 1, seq[p]] - lse[p - 1]) for p in range(n, len(seq))]
        import zlib
        facts["zlib_crc32"] = {k: f"{zlib.crc32(v.detach().contiguous().numpy().tobytes()) & 0xffffffff:08x}"
                               for k, v in trainer.named_parameters()}

        run("tokenisation", trainer, tokenizer=other_tokenizer())
        run("rope_theta", trainer_with(model_dir, rope_theta=500000.0))
        run("rms_norm_eps", trainer_with(model_dir, rms_norm_eps=1e-5))

        # one optimizer step on the trainer; which parameters it changed, by value
        before = {k: v.detach().clone() for k, v in trainer.named_parameters()}
        opt = torch.optim.SGD(trainer.parameters(), lr=0.05)
        ids = torch.tensor([seq])
        trainer.train()
        trainer(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        trainer.eval()
        facts["changed"] = sorted(k for k, v in trainer.named_parameters() if not torch.equal(v, before[k]))
        run("unsynced", trainer)
        push_weights(llm, trainer, only=lambda name: ".layers.1." not in name)
        run("stale_layer", trainer)
        push_weights(llm, trainer)
        run("pushed", trainer)
        loop(llm, model_dir, os.path.join(out, "loop"))
    with open(os.path.join(out, "facts.json"), "w", encoding="utf-8") as f:
        json.dump(facts, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3]))
