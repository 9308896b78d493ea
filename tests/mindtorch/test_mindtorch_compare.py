"""``tsprobe compare`` of a mindtorch dump against a real PyTorch dump of the same script and
weights: same vocabulary (no torch<->MindSpore mapping), calls paired name for name, a faithful
run passes, an injected framework bug is named at its op.

The toy runs the same code on both sides. GPT-2 and Llama run transformers 4.57.1 on mindtorch and
5.19 on torch: same modules and parameters (checked when the weights load), but a few calls and
arguments outside the layers differ between the two versions; the tests name those."""
from __future__ import annotations

import json
import os

import pytest

from ts_core.compare import compare
from ts_core.compare.align.matching import default_normalise

from .jobs import STEPS, TOY_RUNS, toy_id


def _compare(runs, golden_job: str, target_job: str, step: int = 0):
    return compare(runs.step_dir("torch", golden_job, step), runs.step_dir("mindtorch", target_job, step),
                   verbose=False)


def _keys(rank: str) -> list:
    with open(os.path.join(rank, "dump.json"), encoding="utf-8") as f:
        return list(json.load(f)["data"])


def _parents(rank: str) -> dict:
    with open(os.path.join(rank, "construct.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("level,task", TOY_RUNS)
def test_same_script_pairs_one_to_one_and_passes(runs, level, task):
    for step in range(STEPS):
        g_keys = _keys(runs.rank_dir("torch", toy_id(level, task), step))
        t_keys = _keys(runs.rank_dir("mindtorch", toy_id(level, task), step))
        # Forward records in call order on both sides; backward records are written as each
        # call's gradients complete, which follows each framework's own backward schedule (torch
        # finishes a Linear module's input gradient before its weight's AccumulateGrad, so the
        # module's record can precede its inner linear's): same records, order per framework.
        forward = lambda keys: [k for k in keys if k.endswith(".forward") or ".forward." in k]
        assert forward(t_keys) == forward(g_keys)
        assert sorted(t_keys) == sorted(g_keys)
        result = _compare(runs, toy_id(level, task), toy_id(level, task), step)
        pair = result.pairs[0]
        assert pair.counts["matched"] == len(g_keys)
        assert pair.counts["unmatched_golden"] == pair.counts["unmatched_target"] == 0
        assert not any("cross-framework" in w for w in pair.warnings)       # same vocabulary
        bad = [(r.golden_key, r.arg, r.reason) for r in result.rows if r.verdict != "pass"]
        assert not bad
        assert result.first_divergence is None
        assert {r.mode for r in result.rows} == {"tensor" if task == "tensor" else "statistics"}


def test_injected_bug_is_named_at_its_op_in_the_toy(runs):
    """mindtorch's gelu made approximate (tanh): the gelu call is the first divergence."""
    result = _compare(runs, toy_id("mix", "statistics"), "toy_bug")
    fd = result.first_divergence
    assert (fd.key, fd.target_key, fd.direction) == ("Functional.gelu.0.forward",) * 2 + ("forward",)
    order = {r.golden_key: r.order for r in result.rows}
    assert all(r.verdict == "pass" for r in result.rows
               if r.direction == "forward" and r.order < order["Functional.gelu.0.forward"])


def _check_hf_model(result, runs, job: str, version_calls: set, version_scopes: tuple) -> None:
    """The transformers model on mindtorch against torch: no divergence; every module record,
    every backward record and every parameter gradient pairs and its tensors pass; the forward
    API calls pair and pass too except `version_calls` (calls only one transformers version
    makes) and the calls inside `version_scopes` (modules whose code differs between versions)."""
    assert result.first_divergence is None
    parents = {"golden": _parents(runs.rank_dir("torch", job)), "target": _parents(runs.rank_dir("mindtorch", job))}

    def in_version_scope(key, side):
        while key is not None:
            if key in version_scopes:
                return True
            key = parents[side].get(key)
        return False

    for r in result.rows:
        key, side = (r.golden_key, "golden") if r.golden_key else (r.target_key, "target")
        api_forward = r.direction == "forward" and not key.startswith("Module.")
        if r.golden_key is None or r.target_key is None:      # a call made on one side only
            assert api_forward and (key in version_calls or in_version_scope(key, side)), (key, r.reason)
            continue
        if not (api_forward and in_version_scope(key, side)):   # there the versions' ops may differ and
            # the compare pairs them by the values they compute (rotary: `@` in one version, `*` in the other)
            assert default_normalise(r.golden_key) == default_normalise(r.target_key), (r.golden_key, r.target_key)
        both_tensors = r.golden_shape is not None and r.target_shape is not None
        if both_tensors and not (api_forward and in_version_scope(key, side)):
            assert r.verdict == "pass", (key, r.arg, r.reason)
        if r.verdict != "pass" and not both_tensors:            # an argument one version passes
            assert r.direction == "forward" and r.verdict == "warning", (key, r.arg, r.reason)
    backward = [r for r in result.rows if r.direction == "backward"]
    assert backward and all(r.golden_key and r.target_key and r.verdict == "pass" for r in backward)


def test_gpt2_through_mindtorch_matches_torch(runs):
    result = _compare(runs, "gpt2_mix", "gpt2_mix")
    pair = result.pairs[0]
    # transformers 5.19 adds the past length to arange() for cache_position, 4.57 does not
    assert pair.counts["unmatched_golden"] == 1 and pair.counts["unmatched_target"] == 0
    assert pair.counts["error"] == 0
    assert pair.counts["matched"] >= 250
    _check_hf_model(result, runs, "gpt2_mix", {"Tensor.__add__.0.forward"}, ())
    rows = {(r.golden_key, r.arg): r for r in result.rows}
    assert rows["Module.transformer.h.1.mlp.c_fc.Conv1D.parameters_grad.0", "weight"].verdict == "pass"
    assert rows["Functional.scaled_dot_product_attention.1.backward", "output.0"].verdict == "pass"


def test_llama_through_mindtorch_matches_torch(runs):
    result = _compare(runs, "llama_mix", "llama_mix")
    # the rotary embedding's code differs between the two transformers versions
    _check_hf_model(result, runs, "llama_mix", {"Tensor.__add__.0.forward"},
                    ("Module.model.rotary_emb.LlamaRotaryEmbedding.forward.0",))
    rows = {(r.golden_key, r.arg): r for r in result.rows}
    assert rows["Module.model.layers.1.mlp.down_proj.Linear.parameters_grad.0", "weight"].verdict == "pass"
    assert rows["Module.model.embed_tokens.Embedding.parameters_grad.0", "weight"].verdict == "pass"


@pytest.mark.parametrize("model,bug_job,first", [("gpt2", "gpt2_bug", "Torch.tanh.0.forward"),
                                                   ("llama", "llama_bug", "Torch.rsqrt.0.forward")])
def test_injected_bug_is_named_at_its_op_in_transformers_models(runs, model, bug_job, first):
    """mindtorch's tanh (GPT-2's gelu_new) / rsqrt (Llama's RMSNorm) off by 1%."""
    fd = _compare(runs, f"{model}_mix", bug_job).first_divergence
    assert (fd.key, fd.target_key, fd.direction) == (first, first, "forward")


def test_a_real_mindtorch_difference_is_found(runs):
    """Not injected: mindtorch 0.5.1 on CPU gives nn.Embedding's padding row a gradient, where
    torch gives it none. The compare names the embedding's backward, after a forward that passes."""
    result = _compare(runs, "embed_mix", "embed_mix")
    fd = result.first_divergence
    assert (fd.key, fd.target_key, fd.direction) == ("Functional.embedding.0.backward",) * 2 + ("backward",)
    assert all(r.verdict == "pass" for r in result.rows if r.direction == "forward")
    rows = {(r.golden_key, r.arg): r for r in result.rows}
    assert rows["Module.emb.Embedding.parameters_grad.0", "weight"].verdict == "error"
    assert rows["Module.head.Linear.parameters_grad.0", "weight"].verdict == "pass"


def test_cli_names_the_bug(runs, tmp_path, capsys):
    from ts_core.cli import main

    rc = main(["compare", runs.step_dir("torch", toy_id("mix", "statistics")),
               runs.step_dir("mindtorch", "toy_bug"), "-o", str(tmp_path / "out"), "--fail-on-divergence"])
    assert rc == 1
    assert "Functional.gelu.0.forward" in capsys.readouterr().out
    assert (tmp_path / "out" / "report.html").is_file()
