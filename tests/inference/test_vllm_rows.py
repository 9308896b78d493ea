"""Which rows of a flattened vLLM forward are which request/token, on stand-ins of vLLM's model
runner state (no vLLM needed): batching, chunked prefill, prefix caching, recomputation."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ..conftest import require

pytestmark = require("torch")


def runner(req_ids, prompt_lens, num_tokens, qsl):
    import torch
    n = len(req_ids)
    batch = SimpleNamespace(num_reqs=n, req_ids=list(req_ids), num_prompt_tokens=np.array(prompt_lens),
                            num_tokens_no_spec=np.array(num_tokens), num_computed_tokens_cpu=np.zeros(n, int))
    return SimpleNamespace(input_batch=batch, query_start_loc=SimpleNamespace(cpu=torch.tensor(qsl)))


def describe(run, positions):
    import torch
    from ts_integrations.vllm import _VllmDescriber
    llm = SimpleNamespace(llm_engine=SimpleNamespace(output_processor=SimpleNamespace(request_states={})))
    d = _VllmDescriber(llm, run)
    pos = torch.tensor(positions)
    return d(0, (), {"input_ids": torch.zeros(len(positions), dtype=torch.long), "positions": pos})


def segs(info):
    return [(s["request"], s["token"], s["rows"], s["positions"], s["logits_row"], s["sampled"])
            for s in info.segments]


def test_decode_of_one_request_beside_a_prompt_chunk():
    # request "0" (prompt 4, one token generated) decodes; "1" (prompt 10) computes rows 3..8
    run = runner(["0-ab", "1-cd"], [4, 10], [5, 10], [0, 1, 7])
    info = describe(run, [4] + list(range(3, 9)))
    assert info.layout == "flat" and info.num_rows == 7 and info.num_reqs == 2
    assert segs(info) == [("0", 1, [0, 1], [4, 5], 0, True),
                          ("1", 0, [1, 7], [3, 9], 1, False)]       # chunk: its logits are not sampled
    assert info.prompt_lens == {"0": 4, "1": 10}


def test_last_prompt_chunk_is_sampled_and_is_token_0():
    run = runner(["7-x"], [10], [10], [0, 1])
    assert segs(describe(run, [9])) == [("7", 0, [0, 1], [9, 10], 0, True)]


def test_prefix_cached_prompt_starts_past_zero():
    run = runner(["2-x"], [40], [40], [0, 8])
    assert segs(describe(run, list(range(32, 40)))) == [("2", 0, [0, 8], [32, 40], 0, True)]


def test_recomputed_request_gets_one_segment_per_generated_token():
    # after preemption: prompt 3 and two generated tokens computed again in one forward
    run = runner(["5-x"], [3], [6], [0, 6])
    assert segs(describe(run, list(range(6)))) == [("5", 0, [0, 3], [0, 3], None, False),
                                                   ("5", 1, [3, 4], [3, 4], None, False),
                                                   ("5", 2, [4, 5], [4, 5], None, False),
                                                   ("5", 3, [5, 6], [5, 6], 0, True)]


def test_external_id_from_the_output_processor():
    import torch
    from ts_integrations.vllm import _VllmDescriber
    state = SimpleNamespace(external_req_id="my-request")
    llm = SimpleNamespace(llm_engine=SimpleNamespace(
        output_processor=SimpleNamespace(request_states={"internal-1": state})))
    d = _VllmDescriber(llm, runner(["internal-1"], [2], [3], [0, 1]))
    info = d(0, (), {"input_ids": torch.zeros(1, dtype=torch.long), "positions": torch.tensor([2])})
    assert info.segments[0]["request"] == "my-request" and info.segments[0]["internal_id"] == "internal-1"


def test_multiprocess_engine_is_refused(monkeypatch):
    from ts_integrations.vllm import TokenRangeDump

    class MultiprocessLLM:            # the front end of the default engine: no model executor here
        class llm_engine:
            engine_core = object()

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(RuntimeError, match="VLLM_ENABLE_V1_MULTIPROCESSING"):
        TokenRangeDump(MultiprocessLLM(), debugger=None, token_range=(1, 3))


def test_token_range_checked_before_the_engine():
    from ts_integrations.vllm import TokenRangeDump
    with pytest.raises(ValueError, match="token_range"):
        TokenRangeDump(object(), debugger=None, token_range=(2, 1))
