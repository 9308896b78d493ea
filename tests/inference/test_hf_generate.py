"""Part 3 and 4 for Hugging Face ``generate``: ``generate_with_dump`` dumps decoding iterations
s..e, token_map.json says which rows are which request/token, ``split_by_request`` makes one
dump per request with one step per token, which the compare pairs token k with token k."""
from __future__ import annotations

import os

import numpy as np
import pytest

from ts_core import PrecisionDebugger
from ts_integrations.hf_generate import TOKEN_MAP, generate_with_dump, split_by_request

from ..conftest import load_dump, require
from .conftest import rank_dir, token_map

pytestmark = [require("transformers"), require("tokenizers")]

PROMPTS = ["hello my name is tsprobe", "the quick brown fox jumps over the lazy dog and then it runs"]
NORM = "Module.model.norm.LlamaRMSNorm.forward.0"
HEAD = "Module.lm_head.Linear.forward.0"


@pytest.fixture(scope="module")
def hf(tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    return tok, model


def gen_kwargs(tok, prompts=PROMPTS, n=5):
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return dict(**enc, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)


def dump_generate(hf, root, prompts=PROMPTS, token_range=(1, 3), task="tensor", **kw):
    tok, model = hf
    dbg = PrecisionDebugger(task=task, level="L0", dump_path=root)
    out = generate_with_dump(model, dbg, token_range, **gen_kwargs(tok, prompts), **kw)
    dbg.close()
    return out


def test_three_decode_iterations_per_request(hf, dump_root):
    tok, _ = hf
    dump_generate(hf, dump_root)
    rank = rank_dir(os.path.join(dump_root, "step0"))
    tmap = token_map(rank)
    lens = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS]
    assert lens[0] != lens[1]
    assert tmap["source"] == "hf_generate" and tmap["token_range"] == [1, 3]
    assert tmap["forwards_seen"] == 5
    assert {rid: (r["index"], r["prompt_len"], r["tokens"]) for rid, r in tmap["requests"].items()} == {
        "0": (0, lens[0], [1, 2, 3]), "1": (1, lens[1], [1, 2, 3])}
    assert [it["iteration"] for it in tmap["iterations"]] == [1, 2, 3]
    for k, it in enumerate(tmap["iterations"], start=1):
        assert it["layout"] == "batch" and it["seq_len"] == 1
        assert [(s["request"], s["token"], s["rows"], s["positions"], s["in_range"]) for s in it["segments"]] == [
            ("0", k, [0, 1], [lens[0] + k - 1, lens[0] + k], True),
            ("1", k, [0, 1], [lens[1] + k - 1, lens[1] + k], True)]
    # every record of the dump belongs to exactly one mapped forward
    data = load_dump(rank)["data"]
    mapped = [key for it in tmap["iterations"] for key in it["records"]]
    assert sorted(mapped) == sorted(data) and len(set(mapped)) == len(mapped)
    assert sum(k.startswith("Module.model.norm.") for k in data) == 3


def test_generation_is_unchanged(hf, dump_root):
    tok, model = hf
    plain = model.generate(**gen_kwargs(tok))
    dumped = dump_generate(hf, dump_root)
    assert plain.tolist() == dumped.tolist()


def test_split_pairs_token_k_with_token_k(hf, tmp_path):
    """Request 1 generated in a padded batch and alone: per token, the same values."""
    tok, model = hf
    batch, single = str(tmp_path / "batch"), str(tmp_path / "single")
    dump_generate(hf, batch)
    dump_generate(hf, single, prompts=PROMPTS[1:])
    written = split_by_request(batch, str(tmp_path / "batch_split"))
    assert len(written) == 6
    split_by_request(single, str(tmp_path / "single_split"))
    for k in (1, 2, 3):
        a_dir = rank_dir(str(tmp_path / "batch_split" / "req1" / f"step{k}"))
        b_dir = rank_dir(str(tmp_path / "single_split" / "req0" / f"step{k}"))
        assert token_map(a_dir)["token"] == k and token_map(a_dir)["request"] == "1"
        a, b = load_dump(a_dir)["data"], load_dump(b_dir)["data"]
        assert sorted(a) == sorted(b)           # one forward of every module, numbered from 0
        for key in (NORM, HEAD):
            assert a[key]["output"][0]["shape"] == b[key]["output"][0]["shape"] == (
                [1, 64] if key == NORM else [1, model.config.vocab_size])
            x = np.load(os.path.join(a_dir, "dump_tensor_data", a[key]["output"][0]["data_name"]))
            y = np.load(os.path.join(b_dir, "dump_tensor_data", b[key]["output"][0]["data_name"]))
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
            assert a[key]["output"][0]["Max"] == pytest.approx(float(x.max()))
            assert a[key]["output"][0]["Norm"] == pytest.approx(float(np.linalg.norm(x)), rel=1e-6)


def test_compare_engine_pairs_split_dumps(hf, tmp_path):
    from ts_core.compare import compare
    dump_generate(hf, str(tmp_path / "batch"))
    dump_generate(hf, str(tmp_path / "single"), prompts=PROMPTS[1:])
    split_by_request(str(tmp_path / "batch"), str(tmp_path / "bs"))
    split_by_request(str(tmp_path / "single"), str(tmp_path / "ss"))
    result = compare(str(tmp_path / "ss" / "req0"), str(tmp_path / "bs" / "req1"), verbose=False)
    assert len(result.pairs) == 3                       # steps 1, 2, 3 = tokens 1, 2, 3
    counts = result.counts() if callable(result.counts) else result.counts
    assert counts["error"] == 0 and counts["unmatched_golden"] == 0 and counts["unmatched_target"] == 0


def test_statistics_split_needs_tensors_when_requests_share_a_forward(hf, tmp_path):
    batch, single = str(tmp_path / "batch"), str(tmp_path / "single")
    dump_generate(hf, batch, task="statistics")
    with pytest.raises(ValueError, match="task 'tensor'"):
        split_by_request(batch, str(tmp_path / "out1"))
    dump_generate(hf, single, prompts=PROMPTS[:1], task="statistics")
    written = split_by_request(single, str(tmp_path / "out2"))
    assert len(written) == 3
    raw = load_dump(rank_dir(os.path.join(single, "step0")))["data"]
    cut = load_dump(written[0])["data"]
    first = raw[NORM]["output"][0]           # one request: statistics are copied, batch dim dropped
    assert cut[NORM]["output"][0]["Max"] == first["Max"] and cut[NORM]["output"][0]["shape"] == [1, 64]


def test_under_inference_mode(hf, dump_root):
    import torch
    with torch.inference_mode():
        dump_generate(hf, dump_root, task="statistics")
    tmap = token_map(rank_dir(os.path.join(dump_root, "step0")))
    assert [r["tokens"] for r in tmap["requests"].values()] == [[1, 2, 3], [1, 2, 3]]


def test_step_filter_and_step_folders(hf, dump_root):
    tok, model = hf
    dbg = PrecisionDebugger(task="statistics", level="L0", dump_path=dump_root, step=[1, 2])
    for _ in range(3):                              # each call is one step
        generate_with_dump(model, dbg, (2, 2), **gen_kwargs(tok))
    dbg.close()
    assert sorted(os.listdir(dump_root)) == ["step1", "step2"]
    for step in ("step1", "step2"):
        tmap = token_map(rank_dir(os.path.join(dump_root, step)))
        assert [it["iteration"] for it in tmap["iterations"]] == [2]


def test_two_calls_in_one_step(hf, dump_root):
    tok, model = hf
    dbg = PrecisionDebugger(task="statistics", level="L0", dump_path=dump_root)
    generate_with_dump(model, dbg, (1, 1), advance_step=False, **gen_kwargs(tok))
    generate_with_dump(model, dbg, (1, 1), advance_step=False, **gen_kwargs(tok, PROMPTS[:1]))
    dbg.step()
    dbg.close()
    rank = rank_dir(os.path.join(dump_root, "step0"))
    tmap = token_map(rank)
    assert {rid: r["index"] for rid, r in tmap["requests"].items()} == {"0": 0, "1": 1, "2": 2}
    assert [[s["request"] for s in it["segments"]] for it in tmap["iterations"]] == [["0", "1"], ["2"]]
    data = load_dump(rank)["data"]
    assert sorted(k for it in tmap["iterations"] for k in it["records"]) == sorted(data)


def test_bad_token_range(hf, dump_root):
    tok, model = hf
    dbg = PrecisionDebugger(task="statistics", level="L0", dump_path=dump_root)
    with pytest.raises(ValueError, match="token_range"):
        generate_with_dump(model, dbg, (3, 1), **gen_kwargs(tok))
    dbg.close()


def test_split_without_token_map(tmp_path):
    with pytest.raises(FileNotFoundError, match=TOKEN_MAP):
        split_by_request(str(tmp_path), str(tmp_path / "out"))


def test_split_of_an_xor_dump_keeps_xor_checksums(hf, tmp_path):
    """summary_mode xor: each request's cut gets the XOR of its own rows, still no statistics."""
    tok, model = hf
    dbg = PrecisionDebugger(task="tensor", level="L0", dump_path=str(tmp_path / "batch"), summary_mode="xor")
    generate_with_dump(model, dbg, (1, 2), **gen_kwargs(tok))
    dbg.close()
    written = split_by_request(str(tmp_path / "batch"), str(tmp_path / "split"))
    assert len(written) == 4
    for folder in written:
        out = load_dump(folder)["data"][HEAD]["output"][0]
        raw = np.load(os.path.join(folder, "dump_tensor_data", out["data_name"])).tobytes()
        raw += b"\0" * (-len(raw) % 8)
        acc = 0
        for i in range(0, len(raw), 8):
            acc ^= int.from_bytes(raw[i:i + 8], "little")
        assert out["md5"] == f"0x{acc:016x}" and "Max" not in out
