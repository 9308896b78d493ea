"""``tsprobe rl-check``: a Hugging Face checkpoint as the trainer, the same (or another) checkpoint
served by an in-process vLLM engine, a few prompts; prints the verdict and writes the report.

    tsprobe rl-check --model CKPT [--engine-model CKPT2] --prompt "hello" --prompt "the quick" \\
        [--engine-dtype bfloat16] [--max-tokens 8] [--out rl_check_report]

Exit status: 0 PASS, 1 a finding, 2 bad input. vLLM runs in this process (localisation hooks its
model; on the CPU build its weights are kept live by ``ts_integrations.vllm_rl.live_weights``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List

DTYPES = ("float32", "bfloat16", "float16")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rl-check", help="RL train<->rollout consistency: weights synced? log-prob mismatch? "
                                        "where do the trainer's and vLLM's forwards part?",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the trainer's Hugging Face checkpoint folder")
    p.add_argument("--engine-model", default=None, help="the checkpoint vLLM serves (default: --model)")
    p.add_argument("--tokenizer", default=None, help="the trainer's tokenizer folder, when not the engine's")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for several)")
    p.add_argument("--prompts", default=None, help="a text file, one prompt a line")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens sampled per prompt (default 8)")
    p.add_argument("--trainer-dtype", default="float32", choices=DTYPES)
    p.add_argument("--engine-dtype", default=None, choices=DTYPES, help="default: the trainer's")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="vLLM's max_model_len (default: the model's max_position_embeddings, at most 2048)")
    p.add_argument("--kv-cache-mb", type=int, default=64, help="vLLM's KV cache size (CPU: keep it small)")
    p.add_argument("--no-localise", action="store_true", help="skip the two dumps and the stage pairing")
    p.add_argument("--out", default="rl_check_report", help="report folder (report.html, report.json, *.csv)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def _prompts(args: argparse.Namespace) -> List[str]:
    prompts = list(args.prompt)
    if args.prompts:
        with open(args.prompts, encoding="utf-8") as f:
            prompts += [line.rstrip("\n") for line in f if line.strip()]
    return prompts


def run(args: argparse.Namespace) -> int:
    for flag, path in (("--model", args.model), ("--engine-model", args.engine_model), ("--tokenizer", args.tokenizer)):
        if path is not None and not os.path.isdir(path):
            print(f"tsprobe rl-check: error: {flag} {path}: not a checkpoint folder", file=sys.stderr)
            return 2
    prompts = _prompts(args)
    if not prompts:
        print("tsprobe rl-check: error: no prompt: give --prompt TEXT (repeatable) or --prompts FILE", file=sys.stderr)
        return 2
    if args.max_tokens < 1:
        print(f"tsprobe rl-check: error: --max-tokens must be >= 1, got {args.max_tokens}", file=sys.stderr)
        return 2
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")     # before vLLM is imported
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")            # the verdict, not the engine's log
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM

    from ts_integrations.vllm_rl import live_weights

    from .consistency import check
    from .report import text

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.trainer_dtype)).eval()
    max_len = args.max_model_len or min(2048, int(getattr(model.config, "max_position_embeddings", 2048) or 2048))
    try:
        with live_weights():
            llm = LLM(model=args.engine_model or args.model, enforce_eager=True,
                      dtype=args.engine_dtype or args.trainer_dtype, max_model_len=max_len,
                      kv_cache_memory_bytes=args.kv_cache_mb * 2**20, seed=args.seed)
    except Exception as exc:         # vLLM's own validation: say it in one line
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        msg = next((ln for ln in lines if "error" in ln.lower() and "validation error" not in ln.lower()),
                   lines[0] if lines else type(exc).__name__)
        print(f"tsprobe rl-check: error: vLLM could not start on {args.engine_model or args.model}: {msg}",
              file=sys.stderr)
        return 2
    tok = AutoTokenizer.from_pretrained(args.tokenizer) if args.tokenizer else None
    report = check(model, llm, prompts, tokenizer=tok, max_tokens=args.max_tokens, temperature=args.temperature,
                   seed=args.seed, out=args.out, localise=not args.no_localise)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(text(report))
        print(f"report: {os.path.join(args.out, 'report.html')}")
    return 0 if report["verdict"]["status"] == "PASS" else 1
