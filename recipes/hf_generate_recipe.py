"""Dump decoding iterations 1..3 of Hugging Face ``generate`` for two prompts of different lengths.

    .venv/bin/python recipes/hf_generate_recipe.py [--out DIR] [--model DIR]

Without ``--model`` a tiny Llama (random weights, tokenizer trained here, no hub access) is
built into ``DIR/tiny-llama``. Prints the token map (which request/token each dumped forward
holds) and splits the dump into one dump per request, one step per token position.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

PROMPTS = ["hello my name is", "the quick brown fox jumps over the lazy dog and then it"]
_CORPUS = ["the quick brown fox jumps over the lazy dog", "hello my name is tsprobe and I debug precision",
           "vllm batches requests and chunks long prompts", "a model that generates different text",
           "the first token that diverged is what we want to find"]


def build_tiny_llama(path: str, seed: int = 0) -> str:
    """A 2-layer Llama (hidden 64, 2 heads of 32) and a byte-level BPE tokenizer, both saved in
    `path` (nothing downloaded). Deterministic for a given seed. Returns `path`."""
    if os.path.isfile(os.path.join(path, "model.safetensors")) and os.path.isfile(os.path.join(path, "tokenizer.json")):
        return path
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 10, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<unk>", padding_side="left")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.1, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="hf_generate_output")
    ap.add_argument("--model", default=None, help="a Llama-like model folder (default: build a tiny one)")
    ap.add_argument("--task", default="tensor", choices=["tensor", "statistics"])
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ts_core import PrecisionDebugger
    from ts_integrations.hf_generate import generate_with_dump, split_by_request

    model_dir = args.model or build_tiny_llama(os.path.join(args.out, "tiny-llama"))
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    enc = tok(PROMPTS, return_tensors="pt", padding=True)

    dump = os.path.join(args.out, "dump")
    debugger = PrecisionDebugger(task=args.task, level="L0", dump_path=dump)
    out = generate_with_dump(model, debugger, (1, 3), **enc, max_new_tokens=5, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    debugger.close()

    rank_dir = os.path.join(dump, "step0", "rank")
    with open(os.path.join(rank_dir, "token_map.json"), encoding="utf-8") as f:
        tmap = json.load(f)
    print(f"generated: {out[:, enc['input_ids'].shape[1]:].tolist()}")
    for rid, req in tmap["requests"].items():
        print(f"request {rid}: prompt {req['prompt_len']} tokens, dumped token positions {req['tokens']}")
    for it in tmap["iterations"]:
        segs = ", ".join(f"req {s['request']} token {s['token']} rows {s['rows']}" for s in it["segments"])
        print(f"forward {it['iteration']}: {len(it['records'])} records; {segs}")
    if args.task == "tensor":
        split = split_by_request(dump, os.path.join(args.out, "by_request"))
        print(f"split into {len(split)} request/token folders, e.g. {split[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
