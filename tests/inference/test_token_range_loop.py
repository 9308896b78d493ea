"""Part 1: ``PrecisionDebugger.start(model, token_range=[s, e])`` on a plain decoding loop that
calls the model once per token (iteration 0 = the prefill), as msprobe's users write it."""
from __future__ import annotations

import os

import numpy as np
import pytest

from ts_core import PrecisionDebugger

from ..conftest import load_dump, require

pytestmark = [require("transformers"), require("tokenizers")]

PROMPT = [5, 6, 7, 8, 9, 10, 11]
NORM = "Module.model.norm.LlamaRMSNorm.forward"
HEAD = "Module.lm_head.Linear.forward"


@pytest.fixture(scope="module")
def model(tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()


def decode(model, n_forwards: int, prompt=PROMPT):
    """Greedy loop with a KV cache: forward 0 takes the prompt, forward k the token of forward k-1.
    Returns the last-position logits of every forward."""
    import torch
    ids = torch.tensor([prompt])
    past, logits = None, []
    with torch.no_grad():
        for _ in range(n_forwards):
            out = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits.append(out.logits[:, -1].clone())
            ids = out.logits[:, -1:].argmax(-1)
    return logits


def keys_of(data: dict, prefix: str):
    return sorted((k for k in data if k.startswith(prefix + ".")), key=lambda k: int(k.rsplit(".", 1)[1]))


def test_dumps_iterations_s_to_e_only(model, dump_root):
    dbg = PrecisionDebugger(task="statistics", level="L0", dump_path=dump_root)
    dbg.start(model, token_range=[1, 3])
    decode(model, 6)
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(os.path.join(dump_root, "step0", "rank"))["data"]
    norms = keys_of(data, NORM)
    assert norms == [f"{NORM}.0", f"{NORM}.1", f"{NORM}.2"]
    # iterations 1..3 are decode forwards: one row each, never the 7-token prefill
    assert [data[k]["input_args"][0]["shape"] for k in norms] == [[1, 1, 64]] * 3


def test_prefill_only(model, dump_root):
    dbg = PrecisionDebugger(task="statistics", level="L0", dump_path=dump_root)
    dbg.start(model, token_range=[0, 0])
    decode(model, 4)
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(os.path.join(dump_root, "step0", "rank"))["data"]
    norms = keys_of(data, NORM)
    assert norms == [f"{NORM}.0"]
    assert data[norms[0]]["input_args"][0]["shape"] == [1, len(PROMPT), 64]


def test_dumped_logits_are_the_loops_logits(model, dump_root):
    reference = decode(model, 5)
    dbg = PrecisionDebugger(task="tensor", level="L0", dump_path=dump_root)
    dbg.start(model, token_range=[2, 4])
    with_tool = decode(model, 5)
    dbg.stop()
    dbg.step()
    dbg.close()
    for a, b in zip(reference, with_tool):          # no numerical interference
        assert np.array_equal(a.numpy(), b.numpy())
    rank = os.path.join(dump_root, "step0", "rank")
    data = load_dump(rank)["data"]
    heads = keys_of(data, HEAD)
    assert len(heads) == 3
    for n, key in enumerate(heads):
        arr = np.load(os.path.join(rank, "dump_tensor_data", data[key]["output"][0]["data_name"]))
        assert np.array_equal(arr[:, -1], reference[2 + n].numpy())


@pytest.mark.parametrize("bad", [[3, 1], [-1, 2], [1], (1, 2, 3), ["1", "2"], [True, 2]])
def test_bad_token_range_is_refused(model, dump_root, bad):
    dbg = PrecisionDebugger(task="statistics", level="L0", dump_path=dump_root)
    with pytest.raises(ValueError, match="token_range"):
        dbg.start(model, token_range=bad)
    dbg.close()


def test_token_range_needs_the_model(dump_root):
    dbg = PrecisionDebugger(task="statistics", level="L1", dump_path=dump_root)
    with pytest.raises(ValueError, match="model"):
        dbg.start(token_range=[1, 3])
    dbg.close()


def test_each_step_counts_from_its_own_prefill(model, dump_root):
    dbg = PrecisionDebugger(task="statistics", level="L0", dump_path=dump_root)
    for _ in range(2):
        dbg.start(model, token_range=[1, 3])
        decode(model, 6)
        dbg.stop()
        dbg.step()
    dbg.close()
    for step in (0, 1):
        data = load_dump(os.path.join(dump_root, f"step{step}", "rank"))["data"]
        assert len(keys_of(data, NORM)) == 3, f"step {step}"


def test_inference_mode_loop(model, dump_root):
    import torch
    dbg = PrecisionDebugger(task="statistics", level="L0", dump_path=dump_root)
    dbg.start(model, token_range=[1, 3])
    with torch.inference_mode():
        decode(model, 5)
    dbg.stop()
    dbg.step()
    dbg.close()
    data = load_dump(os.path.join(dump_root, "step0", "rank"))["data"]
    assert len(keys_of(data, NORM)) == 3
