"""``ts_core.rl.check`` on a real vLLM engine (CPU build, in-process) and a real HF trainer built from
the same checkpoint: the clean pair passes within the noise band; each planted fault is named,
at its layer or parameter, with its cause. Two engines (float32, bfloat16), each built once in
its own process by rl_worker.py (conftest.rl_runs); the assertions read the reports it wrote."""
from __future__ import annotations

import csv
import os

import numpy as np
import pytest

from ..conftest import require
from .conftest import read_json

pytestmark = [require("vllm"), require("transformers"), require("tokenizers")]


@pytest.fixture(scope="module")
def fp32(rl_runs):
    return rl_runs["float32"], read_json(rl_runs["float32"], "facts.json")


@pytest.fixture(scope="module")
def bf16(rl_runs):
    return rl_runs["bfloat16"]


def report(out: str, scenario: str) -> dict:
    return read_json(out, scenario, "report.json")


def kinds(rep: dict) -> set:
    return {f["kind"] for f in rep["findings"]}


def first_stage(rep: dict) -> str:
    return rep["localisation"]["first"]["stage"]


def test_clean_pair_passes_within_the_noise_band(fp32):
    rep = report(fp32[0], "clean")
    assert rep["verdict"]["status"] == "PASS", rep["verdict"]
    assert rep["findings"] == []
    lp = rep["logprobs"]
    assert lp["tokens"] == 12 and 0 < lp["band"] < 1e-3
    assert lp["max_abs"] <= lp["band"]
    stages = rep["localisation"]["stages"]
    assert len(stages) == 13 and all(s["rel"] is not None and s["rel"] <= s["band"] for s in stages)
    assert rep["weights"]["synced"] and rep["weights"]["checked"] == 21


def test_trainer_logprobs_match_a_numpy_log_softmax(fp32):
    out, facts = fp32
    rows = [r for r in report(out, "clean")["tokens"] if r["request"] == 0]
    np.testing.assert_allclose([r["logp_train"] for r in rows], facts["numpy_logp_train"], atol=2e-6)


def test_rollout_logprobs_match_the_engines_prompt_logprobs_of_the_same_sequence(fp32):
    out, facts = fp32
    rows = [r for r in report(out, "clean")["tokens"] if r["request"] == 0]
    np.testing.assert_allclose([r["logp_rollout"] for r in rows], facts["engine_prompt_logprobs"], atol=2e-6)
    assert report(out, "clean")["logprobs"]["mode"] == "raw_logprobs"


def test_unsynced_engine_names_every_parameter_the_optimizer_step_changed(fp32):
    out, facts = fp32
    rep = report(out, "unsynced")
    assert rep["verdict"]["cause"] == "weights"
    differ = {d["name"]: d for d in rep["weights"]["differ"]}
    assert sorted(differ) == facts["changed"] and len(differ) == 21
    # the engine still holds the checkpoint: its CRC of each (unfused) piece is zlib's of the old weights
    for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.up_proj.weight"):
        assert differ[name]["engine"]["crc32"] == facts["zlib_crc32"][name]
        assert differ[name]["trainer"]["crc32"] != facts["zlib_crc32"][name]


def test_one_stale_layer_is_named_by_its_parameters_and_where_the_forwards_part(fp32):
    out, facts = fp32
    rep = report(out, "stale_layer")
    assert rep["verdict"]["cause"] == "weights"
    names = {d["name"] for d in rep["weights"]["differ"]}
    assert names == {n for n in facts["changed"] if n.startswith("model.layers.1.")} and len(names) == 9
    assert first_stage(rep).startswith("model.layers.1.")
    before = [s for s in rep["localisation"]["stages"] if s["stage"] == "model.embed_tokens" or s["layer"] == 0]
    assert len(before) == 6 and not any(s["above"] for s in before)


def test_pushing_every_weight_makes_the_pair_consistent_again(fp32):
    rep = report(fp32[0], "pushed")
    assert rep["verdict"]["status"] == "PASS", rep["verdict"]
    assert rep["weights"]["synced"]


def test_bf16_rollout_against_a_float32_trainer_is_precision_from_the_first_op(bf16):
    rep = report(bf16, "bf16")
    assert rep["verdict"]["cause"] == "precision"
    assert rep["weights"]["synced"], rep["weights"]["differ"][:2]       # compared in the engine's dtype
    assert rep["weights"]["engine_dtype"] == "bfloat16" and rep["weights"]["trainer_dtype"] == "float32"
    assert first_stage(rep) == "model.embed_tokens"
    assert rep["logprobs"]["max_abs"] > 10 * rep["logprobs"]["band"]


def test_rope_theta_differing_is_named_at_the_first_layers_attention(fp32):
    rep = report(fp32[0], "rope_theta")
    assert rep["verdict"]["cause"] == "config: rotary"
    assert first_stage(rep) == "model.layers.0.self_attn"
    assert [c["key"] for c in rep["config_diff"]] == ["rope_parameters.rope_theta"]
    assert rep["weights"]["synced"]


def test_rms_norm_eps_differing_is_named_at_the_first_layers_norm(fp32):
    rep = report(fp32[0], "rms_norm_eps")
    assert rep["verdict"]["cause"] == "config: norm"
    assert first_stage(rep) == "model.layers.0.input_layernorm"
    assert [c["key"] for c in rep["config_diff"]] == ["rms_norm_eps"]


def test_another_tokenisation_is_said_plainly_not_as_a_numeric_divergence(fp32):
    rep = report(fp32[0], "tokenisation")
    assert rep["verdict"]["cause"] == "tokenisation"
    assert kinds(rep) == {"tokenisation"}
    assert "Not a numeric divergence" in rep["verdict"]["message"]
    assert rep["tokenisation"][0]["engine_ids"] != rep["tokenisation"][0]["trainer_ids"]


def test_report_files_hold_the_table_and_the_charts(fp32):
    d = os.path.join(fp32[0], "stale_layer")
    with open(os.path.join(d, "tokens.csv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    rep = report(fp32[0], "stale_layer")
    assert len(rows) == rep["logprobs"]["tokens"]
    assert max(abs(float(r["diff"])) for r in rows) == pytest.approx(rep["logprobs"]["max_abs"])
    with open(os.path.join(d, "report.html"), encoding="utf-8") as f:
        page = f.read()
    assert page.count("<svg") == 2 and "model.layers.1." in page and "FAIL" in page


def test_vllm_cpu_packed_weights_are_reported_unreadable_and_refuse_or_ignore_pushes(rl_runs):
    facts = read_json(rl_runs["packed"], "facts.json")
    want = {f"model.layers.{i}.{m}.weight" for i in (0, 1)
            for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")}
    assert set(facts["packed"]) == want
    assert facts["verdict"]["cause"] == "weights" and "cannot be read back" in facts["verdict"]["message"]
    # what live_weights() exists for: a full push fails half-way (what came before the first packed layer
    # is loaded), and lm_head, which keeps its parameter but computes from a packed copy, ignores a push
    assert facts["push_error"] == "AttributeError" and facts["changed_by_failed_push"] is True
    assert facts["unchanged_after_lm_head_push"] is True
