"""Parts 2, 4 and 6 with real vLLM (CPU build, in-process engine), each engine in its own process.

``recipes/vllm_recipe.py`` runs two prompts of different lengths in one ``generate`` call with
chunked prefill (32 tokens per iteration: the long prompt is cut, so the two requests reach a
token position in different engine iterations), then a prompt whose first blocks are in the
prefix cache, each in ``TokenRangeDump(token_range=(1, 3))``, and the same prompts through HF
``generate_with_dump``. ``vllm_worker.py`` covers statistics/mix, a prefill-only range and
direct ``debugger.start(get_model(llm), token_range=...)``. The assertions read their dumps.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ..conftest import load_dump, require
from .conftest import ROOT, rank_dir, run_isolated, token_map

pytestmark = [require("vllm"), require("transformers"), require("tokenizers")]

NORM_V, NORM_H = "Module.model.norm.RMSNorm.forward.0", "Module.model.norm.LlamaRMSNorm.forward.0"
LOGITS_V, LOGITS_H = "Module.logits_processor.LogitsProcessor.forward.0", "Module.lm_head.Linear.forward.0"


@pytest.fixture(scope="module")
def recipe(tiny_llama, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("vllm_recipe"))
    run_isolated([os.path.join(ROOT, "recipes", "vllm_recipe.py"), "--out", out, "--model", tiny_llama],
                 timeout=400)
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        return out, json.load(f)


@pytest.fixture(scope="module")
def worker(tiny_llama, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("vllm_worker"))
    run_isolated([os.path.join(os.path.dirname(__file__), "vllm_worker.py"), out, tiny_llama], timeout=400)
    with open(os.path.join(out, "facts.json"), encoding="utf-8") as f:
        return out, json.load(f)


def output0(rank: str, key: str) -> np.ndarray:
    rec = load_dump(rank)["data"][key]
    return np.load(os.path.join(rank, "dump_tensor_data", rec["output"][0]["data_name"]))


def in_range(tmap: dict, rid: str):
    return [(it, s) for it in tmap["iterations"] for s in it["segments"] if s["request"] == rid and s["in_range"]]


def test_recipe_runs(recipe):
    out, summary = recipe
    assert summary["same_tokens"] is True
    assert summary["prompt_lens"][0][0] != summary["prompt_lens"][0][1]


def test_three_decode_iterations_per_request_under_chunked_prefill(recipe):
    out, summary = recipe
    tmap = token_map(rank_dir(os.path.join(out, "vllm", "step0")))
    lens = summary["prompt_lens"][0]
    assert tmap["source"] == "vllm" and tmap["token_range"] == [1, 3]
    assert [r["prompt_len"] for r in tmap["requests"].values()] == lens
    for rid, req in tmap["requests"].items():
        assert req["tokens"] == [1, 2, 3]
        segs = in_range(tmap, rid)
        assert [s["token"] for _, s in segs] == [1, 2, 3]
        for k, (it, s) in enumerate(segs, start=1):     # one decode row each, at position P + k - 1
            assert s["rows"][1] - s["rows"][0] == 1
            assert s["positions"] == [req["prompt_len"] + k - 1, req["prompt_len"] + k]
            assert s["sampled"] is True and s["logits_row"] is not None
    # the long prompt was chunked: request 1 is one iteration behind request 0, so counting
    # forward calls (msprobe) would have dumped prompt rows of request 1 as "token 1"
    first_decode = {rid: in_range(tmap, rid)[0][0]["iteration"] for rid in tmap["requests"]}
    assert first_decode["1"] > first_decode["0"]
    prompt_iterations = {it["iteration"] for it in tmap["iterations"] for s in it["segments"]
                         if s["request"] == "1" and s["token"] == 0}
    assert prompt_iterations                      # prompt rows share a dumped forward, marked out of range
    assert all(not s["in_range"] for it in tmap["iterations"] for s in it["segments"] if s["token"] == 0)


def test_split_has_exactly_tokens_1_to_3_per_request(recipe):
    out, summary = recipe
    per_forward = len(token_map(rank_dir(os.path.join(out, "vllm", "step0")))["iterations"][0]["records"])
    root = os.path.join(out, "vllm_by_request", "step0")
    assert sorted(os.listdir(root)) == ["req0", "req1"]
    key_sets = []
    for req in ("req0", "req1"):
        assert sorted(os.listdir(os.path.join(root, req))) == ["step1", "step2", "step3"]
        for k in (1, 2, 3):
            rank = rank_dir(os.path.join(root, req, f"step{k}"))
            data = load_dump(rank)["data"]
            assert len(data) == per_forward                    # the records of one forward
            assert NORM_V in data and NORM_V.replace("forward.0", "forward.1") not in data
            assert data[NORM_V]["output"][0]["shape"] == [1, 64]
            assert data[LOGITS_V]["output"][0]["shape"][0] == 1
            key_sets.append(sorted(data))
    assert all(keys == key_sets[0] for keys in key_sets)     # numbered alike: token k pairs with token k


def test_every_record_belongs_to_a_mapped_forward(recipe):
    out, _ = recipe
    for step in ("step0", "step1"):
        rank = rank_dir(os.path.join(out, "vllm", step))
        tmap, data = token_map(rank), load_dump(rank)["data"]
        mapped = [k for it in tmap["iterations"] for k in it["records"]]
        assert sorted(mapped) == sorted(data) and len(set(mapped)) == len(mapped)
        assert all(any(k.startswith("Module.logits_processor.") for k in it["records"])
                   for it in tmap["iterations"])


def test_prefix_cached_prompt(recipe):
    out, summary = recipe
    cached = summary["num_cached_tokens"][1][0]
    assert cached > 0
    tmap = token_map(rank_dir(os.path.join(out, "vllm", "step1")))
    (req,) = tmap["requests"].values()
    assert req["index"] == 0 and req["first_position"] == cached     # cached rows never computed
    assert req["tokens"] == [1, 2, 3]
    assert [it["num_rows"] for it in tmap["iterations"]] == [1, 1, 1]


def test_values_equal_hf_generate(recipe, tiny_llama):
    """vLLM's final hidden state and logits of request i / token k equal (float32 tolerance) both
    HF generate's dump of the same position and a plain HF forward over prompt + generated tokens."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    out, summary = recipe
    for run, lens in enumerate(summary["prompt_lens"]):
        vmap = token_map(rank_dir(os.path.join(out, "vllm", f"step{run}")))
        for i, plen in enumerate(lens):
            tokens = summary["vllm_tokens"][run][i]
            assert tokens == summary["hf_tokens"][run][i]
            (req,) = [info for info in vmap["requests"].values() if info["index"] == i]
            assert req["prompt_len"] == plen
            prompt = summary["prompt_ids"][run][i]
            for k in (1, 2, 3):
                v = rank_dir(os.path.join(out, "vllm_by_request", f"step{run}", f"req{i}", f"step{k}"))
                h = rank_dir(os.path.join(out, "hf_by_request", f"step{run}", f"req{i}", f"step{k}"))
                np.testing.assert_allclose(output0(v, NORM_V), output0(h, NORM_H), rtol=1e-4, atol=1e-5)
                np.testing.assert_allclose(output0(v, LOGITS_V), output0(h, LOGITS_H), rtol=1e-4, atol=1e-5)
                with torch.no_grad():
                    ref = model(torch.tensor([prompt + tokens[:k]])).logits[0, plen + k - 1]
                np.testing.assert_allclose(output0(v, LOGITS_V)[0], ref.numpy(), rtol=1e-4, atol=1e-5)


def test_statistics_and_mix_level(worker):
    out, facts = worker
    rank = rank_dir(os.path.join(out, "stats_mix", "step0"))
    tmap, dump = token_map(rank), load_dump(rank)
    assert dump["task"] == "statistics" and dump["level"] == "mix"
    assert [r["tokens"] for r in tmap["requests"].values()] == [[1, 2, 3], [1, 2, 3]]
    keys = list(dump["data"])
    assert any(k.startswith(("Functional.", "Torch.", "Tensor.")) for k in keys)     # API calls too
    assert any(k.startswith("Module.") for k in keys)
    assert all(v["output"][0].get("Max") is not None for k, v in dump["data"].items()
               if k.startswith("Module.model.norm."))
    from ts_integrations.vllm import split_by_request
    with pytest.raises(ValueError, match="task 'tensor'"):     # batched statistics cannot be divided
        split_by_request(os.path.join(out, "stats_mix"), os.path.join(out, "stats_split"))


def test_prefill_range_spans_prompt_chunks(worker):
    out, facts = worker
    from ts_integrations.vllm import split_by_request
    rank = rank_dir(os.path.join(out, "prefill", "step0"))
    tmap = token_map(rank)
    lens = facts["prefill_prompt_lens"]
    by_req = {r["index"]: rid for rid, r in tmap["requests"].items()}
    long_segments = in_range(tmap, by_req[1])
    assert len(long_segments) > 1                                   # the long prompt was chunked
    assert sum(s["rows"][1] - s["rows"][0] for _, s in long_segments) == lens[1]
    assert [s["sampled"] for _, s in long_segments][-1] is True
    assert not any(s["sampled"] for _, s in long_segments[:-1])
    split = os.path.join(out, "prefill_split")
    split_by_request(os.path.join(out, "prefill"), split)
    for i, plen in enumerate(lens):
        assert os.listdir(os.path.join(split, f"req{i}")) == ["step0"]
        data = load_dump(rank_dir(os.path.join(split, f"req{i}", "step0")))["data"]
        norms = [k for k in data if k.startswith("Module.model.norm.")]
        assert sum(data[k]["output"][0]["shape"][0] for k in norms) == plen


def test_direct_start_with_exposed_model(worker):
    out, facts = worker
    assert facts["direct_model"] == "LlamaForCausalLM"
    data = load_dump(rank_dir(os.path.join(out, "direct", "step0")))["data"]
    norms = sorted(k for k in data if k.startswith("Module.model.norm."))
    assert len(norms) == 3                                           # forwards 1..3 of one request
    assert all(data[k]["input_args"][0]["shape"] == [1, 64] for k in norms)
