"""Run in its own process by test_trl.py: TRL's GRPOTrainer on CPU (HF generate: TRL's vLLM mode
needs vllm<=0.31 and a GPU-style launcher), a side vLLM engine checked by RLCheckCallback(push=True)
every step; the same training without the callback; OUT_DIR/facts.json says what happened.

    python tests/rl/trl_worker.py OUT_DIR MODEL_DIR [colocate]

``colocate``: TRL's own vLLM engine instead (``use_vllm=True, vllm_mode="colocate"``, the trainer
created inside ``live_weights()``), the callback wrapping TRL's weight sync.
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
PROMPTS = ["hello my name is", "the quick brown fox"]


def reward(completions, **kwargs):
    return [float(len(c)) / 10.0 for c in completions]


def run(model_dir: str, out: str, callback=None, **vllm_args):
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
                     max_steps=2, learning_rate=1e-3, use_cpu=True, report_to=[], logging_steps=1,
                     save_strategy="no", seed=0, bf16=False, dataloader_num_workers=0, **vllm_args)
    import pyarrow as pa
    from datasets import Dataset

    # a fingerprint given: datasets 5.2's own hashing of the table fails to pickle a pyarrow type with this dill
    ds = Dataset(pa.table({"prompt": PROMPTS * 4}), fingerprint="tsprobe-rl-prompts")
    from ts_integrations.vllm_rl import live_weights

    with live_weights():            # TRL builds its colocated LLM here (CPU: keep its weights live)
        trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok)
    if callback is not None:
        callback.attach(trainer)
    trainer.train()
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, torch


def colocate(out: str, model_dir: str) -> int:
    from ts_integrations.trl import RLCheckCallback

    cb = RLCheckCallback(PROMPTS, every=1, out=os.path.join(out, "checks"), max_tokens=4)
    run(model_dir, os.path.join(out, "on"), cb, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=128,
        vllm_gpu_memory_utilization=0.1)
    with open(os.path.join(out, "facts.json"), "w", encoding="utf-8") as f:
        json.dump({"verdicts": cb.verdicts}, f, indent=1)
    return 0


def main(out: str, model_dir: str) -> int:
    from vllm import LLM

    from ts_integrations.trl import RLCheckCallback
    from ts_integrations.vllm_rl import live_weights

    with live_weights():
        llm = LLM(model=model_dir, enforce_eager=True, dtype="float32", max_model_len=128,
                  kv_cache_memory_bytes=32 * 2**20, seed=0)
    cb = RLCheckCallback(PROMPTS, every=1, out=os.path.join(out, "checks"), llm=llm, push=True, max_tokens=4)
    on, torch = run(model_dir, os.path.join(out, "on"), cb)
    off, _ = run(model_dir, os.path.join(out, "off"))
    facts = {"verdicts": cb.verdicts, "num_params": len(on),
             "params_equal": sorted(n for n in on if torch.equal(on[n], off[n]))}
    with open(os.path.join(out, "facts.json"), "w", encoding="utf-8") as f:
        json.dump(facts, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(colocate(sys.argv[1], sys.argv[2]) if sys.argv[3:] == ["colocate"] else main(sys.argv[1], sys.argv[2]))
