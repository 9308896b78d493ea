"""Fixtures of the inference tests: one tiny Llama (no hub) per session, a subprocess runner."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import List, Optional

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = os.path.join(ROOT, "recipes")


def recipe_module(name: str):
    spec = importlib.util.spec_from_file_location(f"_recipe_{name}", os.path.join(RECIPES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> str:
    """A 2-layer Llama with a locally trained tokenizer, saved once per session."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    path = str(tmp_path_factory.mktemp("tiny-llama"))
    return recipe_module("hf_generate_recipe").build_tiny_llama(path)


def run_isolated(argv: List[str], timeout: float, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """Run `argv` with this interpreter in a fresh process (vLLM edits its caller's environment);
    fail with the output's tail when it does not exit 0."""
    full_env = dict(os.environ)
    full_env.update({"TSPROBE_QUIET": "1", "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                     "TOKENIZERS_PARALLELISM": "false",
                     "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)})
    full_env.update(env or {})
    try:
        proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=full_env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[-4000:] if isinstance(exc.stdout, bytes) else (exc.stdout or "")[-4000:]
        pytest.fail(f"{' '.join(argv)} did not finish in {timeout} s; output tail:\n{out}")
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {proc.returncode}; output tail:\n"
                    f"{(proc.stdout + proc.stderr)[-6000:]}")
    return proc


def rank_dir(step_dir: str) -> str:
    """The only rank folder of a step folder ("rank" or "rank0": vLLM initialises torch.distributed)."""
    ranks = [d for d in os.listdir(step_dir) if d.startswith("rank")]
    assert len(ranks) == 1, f"{step_dir}: {ranks}"
    return os.path.join(step_dir, ranks[0])


def token_map(rank: str) -> dict:
    with open(os.path.join(rank, "token_map.json"), encoding="utf-8") as f:
        return json.load(f)
