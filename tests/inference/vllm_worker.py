"""Run in its own process by test_vllm.py (vLLM edits its caller's environment):

    python tests/inference/vllm_worker.py OUT_DIR MODEL_DIR

One in-process engine (chunked prefill of at most 32 tokens per iteration, prefix caching),
three scenarios, each into its own dump root under OUT_DIR; facts the dumps cannot tell
(generated tokens, cached prompt tokens) go to OUT_DIR/facts.json.

- ``stats_mix``: task statistics, level mix (modules and torch APIs), token range [1, 3],
  a short and a long (chunked) prompt in one generate call;
- ``prefill``: task tensor, token range [0, 0]: only the prompt rows, which for the long
  prompt span several engine iterations;
- ``direct``: ``debugger.start(get_model(llm), token_range=[1, 3])`` (msprobe's forward count)
  for one short prompt, where counting forwards is right.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(out: str, model_dir: str) -> int:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from ts_core import PrecisionDebugger
    from ts_integrations.vllm import TokenRangeDump, get_model

    tok = AutoTokenizer.from_pretrained(model_dir)
    short = tok("hello my name is tsprobe", add_special_tokens=False)["input_ids"]
    long = tok("the quick brown fox jumps over the lazy dog and then it runs away from the model that "
               "generates different text while we debug precision", add_special_tokens=False)["input_ids"]
    llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", max_model_len=128,
              kv_cache_memory_bytes=32 * 2**20, max_num_batched_tokens=32, enable_chunked_prefill=True,
              enable_prefix_caching=True, block_size=32, seed=0)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    facts = {"prompt_lens": [len(short), len(long)]}

    def gen(prompts):
        res = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(r.outputs[0].token_ids) for r in res], [r.num_cached_tokens for r in res]

    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=os.path.join(out, "stats_mix"))
    with TokenRangeDump(llm, dbg, token_range=(1, 3)) as tr:
        facts["stats_mix_tokens"], facts["stats_mix_cached"] = gen([short, long])
    facts["stats_mix_map"] = tr.token_map_path
    dbg.close()

    # a new long prompt (no cached prefix) so that its prefill is chunked again
    long2 = list(reversed(long))
    dbg = PrecisionDebugger(task="tensor", level="L0", dump_path=os.path.join(out, "prefill"))
    with TokenRangeDump(llm, dbg, token_range=[0, 0]) as tr:
        facts["prefill_tokens"], facts["prefill_cached"] = gen([short, long2])
    facts["prefill_map"] = tr.token_map_path
    facts["prefill_prompt_lens"] = [len(short), len(long2)]
    dbg.close()

    dbg = PrecisionDebugger(task="statistics", level="L0", dump_path=os.path.join(out, "direct"))
    model = get_model(llm)
    facts["direct_model"] = type(model).__name__
    dbg.start(model=model, token_range=[1, 3])
    facts["direct_tokens"], _ = gen([[t + 1 for t in short]])
    dbg.stop()
    dbg.step()
    dbg.close()

    with open(os.path.join(out, "facts.json"), "w", encoding="utf-8") as f:
        json.dump(facts, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
