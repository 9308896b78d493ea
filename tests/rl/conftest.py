"""Fixtures of the RL consistency tests: the inference tests' tiny Llama, workers in their own process."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from ..inference.conftest import ROOT, recipe_module, run_isolated

__all__ = ["ROOT", "run_isolated", "read_json"]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    """A 2-layer Llama with a locally trained tokenizer (recipes/hf_generate_recipe.py), saved once."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    return recipe_module("hf_generate_recipe").build_tiny_llama(str(tmp_path_factory.mktemp("rl-tiny-llama")))


def read_json(*parts: str) -> dict:
    with open(os.path.join(*parts), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def rl_runs(tiny_llama, tmp_path_factory) -> dict:
    """rl_worker.py's three engines (float32 with the planted faults and the recipe's loop; bfloat16;
    float32 with vLLM's packed CPU weights), each in its own process, all at once (an engine start
    is mostly one core's work)."""
    outs = {d: str(tmp_path_factory.mktemp(f"rl_{d}")) for d in ("float32", "bfloat16", "packed")}
    worker = os.path.join(ROOT, "tests", "rl", "rl_worker.py")
    with ThreadPoolExecutor(len(outs)) as pool:
        futures = [pool.submit(run_isolated, [worker, out, tiny_llama, d], 600) for d, out in outs.items()]
        for f in futures:
            f.result()           # re-raises a worker's failure (pytest.fail) here
    return outs
