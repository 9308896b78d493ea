"""Fixtures of the RL consistency tests: the inference tests' tiny Llama, workers in their own process."""
from __future__ import annotations

import json
import os

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
