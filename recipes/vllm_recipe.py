"""Dump generated tokens 1..3 of every request of a vLLM run and check them against HF ``generate``.

    .venv/bin/python recipes/vllm_recipe.py [--out DIR] [--model DIR]

Builds a tiny Llama (no hub) unless ``--model`` is given, starts vLLM's CPU engine in this
process with chunked prefill (at most 32 tokens per iteration) and prefix caching, then:

1. ``generate`` of two prompts of different lengths in one call: the long prompt is cut into
   two chunks, so the two requests reach token k in different engine iterations;
2. ``generate`` of a third prompt that shares the long prompt's first 32 tokens (one cached
   block: only its suffix is computed);

each inside ``TokenRangeDump(llm, debugger, token_range=(1, 3))``. The same prompts then go
through Hugging Face ``generate`` (``generate_with_dump``), both dumps are split per request and
token, and the final hidden state and the logits of every request/token are compared.

Output (DIR, default ``vllm_recipe_output``): ``vllm/`` and ``hf/`` dumps (step0 = run 1,
step1 = run 2, each with token_map.json), ``vllm_by_request/`` and ``hf_by_request/``
(``step{run}/req{i}/step{k}/rank``), ``summary.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

# vLLM reads these when the engine is created; the in-process engine keeps the model reachable.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHORT = "hello my name is tsprobe"
LONG = ("the quick brown fox jumps over the lazy dog and then it runs away from the model that "
        "generates different text while we debug precision")
SUFFIX = " and the first token that diverged"
TOKEN_RANGE = (1, 3)
MAX_TOKENS = 5
CHUNK = 32                 # max tokens per engine iteration; also the KV block size (prefix-cache unit)

# which record holds what, on each side
PAIRS = {
    "embedding": ("Module.model.embed_tokens.VocabParallelEmbedding.forward.0",
                  "Module.model.embed_tokens.Embedding.forward.0"),
    "final_hidden": ("Module.model.norm.RMSNorm.forward.0", "Module.model.norm.LlamaRMSNorm.forward.0"),
    "logits": ("Module.logits_processor.LogitsProcessor.forward.0", "Module.lm_head.Linear.forward.0"),
}


def first_output(step_dir: str, key: str):
    """The first output tensor of record `key` in the only rank folder of `step_dir`."""
    import numpy as np
    (rank,) = [d for d in os.listdir(step_dir) if d.startswith("rank")]
    rank_dir = os.path.join(step_dir, rank)
    with open(os.path.join(rank_dir, "dump.json"), encoding="utf-8") as f:
        rec = json.load(f)["data"][key]
    return np.load(os.path.join(rank_dir, "dump_tensor_data", rec["output"][0]["data_name"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="vllm_recipe_output")
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)

    from hf_generate_recipe import build_tiny_llama
    model_dir = args.model or build_tiny_llama(os.path.join(out, "tiny-llama"))

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    from ts_core import PrecisionDebugger
    from ts_integrations.hf_generate import generate_with_dump, split_by_request
    from ts_integrations.vllm import TokenRangeDump

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in (SHORT, LONG, LONG + SUFFIX)]
    runs = [[ids[0], ids[1]], [ids[2]]]

    # -- vLLM -------------------------------------------------------------------------------
    llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", max_model_len=128,
              kv_cache_memory_bytes=32 * 2**20, max_num_batched_tokens=CHUNK, enable_chunked_prefill=True,
              enable_prefix_caching=True, block_size=CHUNK, seed=0)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    debugger = PrecisionDebugger(task="tensor", level="L0", dump_path=os.path.join(out, "vllm"))
    vllm_tokens, cached = [], []
    for prompts in runs:                    # one step folder per generate call
        with TokenRangeDump(llm, debugger, token_range=TOKEN_RANGE) as capture:
            results = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        vllm_tokens.append([list(r.outputs[0].token_ids) for r in results])
        cached.append([r.num_cached_tokens for r in results])
        print(f"vLLM run: token map {capture.token_map_path}")
    debugger.close()

    # -- Hugging Face generate on the same weights ----------------------------------------------
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    debugger = PrecisionDebugger(task="tensor", level="L0", dump_path=os.path.join(out, "hf"))
    hf_tokens = []
    for prompts in runs:
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        gen = generate_with_dump(model, debugger, TOKEN_RANGE, input_ids=input_ids, attention_mask=mask,
                                 max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id)
        hf_tokens.append(gen[:, width:].tolist())
    debugger.close()

    # -- pair request i / token k of both runs -------------------------------------------------------
    split_by_request(os.path.join(out, "vllm"), os.path.join(out, "vllm_by_request"))
    split_by_request(os.path.join(out, "hf"), os.path.join(out, "hf_by_request"))
    worst = {name: 0.0 for name in PAIRS}
    rows = []
    for run, prompts in enumerate(runs):
        for i in range(len(prompts)):
            for k in range(TOKEN_RANGE[0], TOKEN_RANGE[1] + 1):
                v_dir = os.path.join(out, "vllm_by_request", f"step{run}", f"req{i}", f"step{k}")
                h_dir = os.path.join(out, "hf_by_request", f"step{run}", f"req{i}", f"step{k}")
                diffs = {}
                for name, (v_key, h_key) in PAIRS.items():
                    a, b = first_output(v_dir, v_key), first_output(h_dir, h_key)
                    diffs[name] = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                    worst[name] = max(worst[name], diffs[name])
                rows.append({"run": run, "request": i, "token": k, **diffs})
                print(f"run {run} request {i} token {k}: " +
                      "  ".join(f"{n} max|diff| {d:.2e}" for n, d in diffs.items()))
    same_tokens = vllm_tokens == hf_tokens
    summary = {"model": model_dir, "prompt_ids": runs, "prompt_lens": [[len(p) for p in r] for r in runs],
               "vllm_tokens": vllm_tokens, "hf_tokens": hf_tokens, "num_cached_tokens": cached,
               "same_tokens": same_tokens, "max_abs_diff": worst, "pairs": rows}
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print(f"generated tokens equal: {same_tokens}; prefix-cached tokens of run 2: {cached[1]}")
    print("worst max|diff| over requests and tokens: " + ", ".join(f"{n} {d:.2e}" for n, d in worst.items()))
    print(f"summary: {os.path.join(out, 'summary.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
