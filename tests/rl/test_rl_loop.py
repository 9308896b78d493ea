"""recipes/rl_loop_recipe.py: a GRPO-style loop with a colocated vLLM engine and weight pushes; the
check every step passes (the pushes reach the engine) and changes none of the training's numbers."""
from __future__ import annotations

import os

import pytest

from ..conftest import require
from .conftest import read_json

pytestmark = [require("vllm"), require("transformers"), require("tokenizers")]


@pytest.fixture(scope="module")
def loop(rl_runs):
    out = os.path.join(rl_runs["float32"], "loop")          # run by rl_worker.py on its float32 engine
    return out, read_json(out, "facts.json")


def test_the_check_changes_none_of_the_trainings_numbers(loop):
    _, facts = loop
    assert facts["losses_on"] == facts["losses_off"] and len(facts["losses_off"]) == 3
    assert len(facts["params_equal"]) == facts["num_params"] == 21
    assert len(facts["params_moved"]) == 21          # the loop trained: equality is not of untouched weights


def test_every_check_after_a_push_passes_and_writes_its_report(loop):
    out, facts = loop
    assert [v["step"] for v in facts["verdicts"]] == [1, 2, 3]
    assert all(v["status"] == "PASS" for v in facts["verdicts"]), facts["verdicts"]
    assert os.path.isfile(os.path.join(out, "step3", "report.html"))
