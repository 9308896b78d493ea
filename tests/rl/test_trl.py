"""ts_integrations/trl.py with a real TRL GRPOTrainer on CPU (HF generate; TRL's own vLLM colocate mode
is not run on CPU: TRL 1.16 declares vllm<=0.31 and launches its engine with external_launcher) and
a side vLLM engine that RLCheckCallback(push=True) loads the policy into and checks every step."""
from __future__ import annotations

import os

import pytest

from ..conftest import require
from .conftest import ROOT, read_json, run_isolated

pytestmark = [require("trl"), require("vllm"), require("datasets")]


@pytest.fixture(scope="module")
def trl_run(tiny_llama, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("rl_trl"))
    run_isolated([os.path.join(ROOT, "tests", "rl", "trl_worker.py"), out, tiny_llama], timeout=500)
    return out, read_json(out, "facts.json")


def test_the_callback_checks_every_step_and_passes_after_each_push(trl_run):
    out, facts = trl_run
    assert [(v["step"], v["status"]) for v in facts["verdicts"]] == [(1, "PASS"), (2, "PASS")], facts["verdicts"]
    assert os.path.isfile(os.path.join(out, "checks", "step2", "report.html"))


def test_the_callback_changes_none_of_the_trainings_numbers(trl_run):
    _, facts = trl_run
    assert len(facts["params_equal"]) == facts["num_params"] == 21
