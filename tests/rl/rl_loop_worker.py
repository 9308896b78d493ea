"""Run in its own process by test_rl_loop.py: the recipe's loop twice on one engine, without and
with the check every step; writes OUT_DIR/facts.json (whether the parameters and losses are
bit-identical, the verdicts)."""
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


def main(out: str, model_dir: str) -> int:
    import torch

    import rl_loop_recipe as recipe

    llm = recipe.build_engine(model_dir)
    off = recipe.train(llm, model_dir, steps=3, check_every=0)
    on = recipe.train(llm, model_dir, steps=3, check_every=1, out=out)
    start = recipe.train(llm, model_dir, steps=0)["params"]
    facts = {"losses_off": off["losses"], "losses_on": on["losses"], "verdicts": on["verdicts"],
             "params_equal": sorted(n for n in off["params"] if torch.equal(off["params"][n], on["params"][n])),
             "params_moved": sorted(n for n in off["params"] if not torch.equal(off["params"][n], start[n])),
             "num_params": len(off["params"])}
    with open(os.path.join(out, "facts.json"), "w", encoding="utf-8") as f:
        json.dump(facts, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
