"""vLLM: dump generated-token positions s..e of every request, whatever the batching.

::

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"      # before LLM(): in-process engine
    llm = LLM(model=..., enforce_eager=True)
    debugger = PrecisionDebugger(config_path="config.json")
    with TokenRangeDump(llm, debugger, token_range=(1, 3)):
        llm.generate(prompts, params)

vLLM runs one top-level forward per engine iteration over the scheduled tokens of all running
requests, flattened to ``[num_tokens, ...]``; a long prompt may be cut into chunks over several
iterations and a cached prefix is not computed at all. Counting forward calls (msprobe's
``start(model, token_range)``) therefore does not find "token k". Here every forward is
described from vLLM's own state at its start -- the request ids of the model runner's input
batch, the ``query_start_loc`` row offsets of the attention metadata in the forward context,
the ``positions`` argument and each request's prompt length -- so each row gets its request and
token position k (0 = prompt rows, k >= 1 = the forward that consumes generated token k-1).
A forward is dumped when one of its rows is in the range, from its start until the logits
processor (which runs after the model forward, on the rows that are sampled) returns; the
token_map.json next to dump.json says which rows of which record belong to which request and
token. See docs/inference.md.

Nothing here imports vllm at module import time.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from ts_core.dumpfmt import split_by_request

from .token_window import IterationInfo, Segment, TokenWindow, check_token_range

__all__ = ["TokenRangeDump", "get_model", "get_model_runner", "split_by_request"]

_MP_HELP = ("TokenRangeDump needs vLLM's in-process engine: set "
            "os.environ['VLLM_ENABLE_V1_MULTIPROCESSING'] = '0' before creating the LLM "
            "(with the default multiprocess engine the model runs in another process, where hooks "
            "installed in this one never fire).")


def get_model_runner(llm: Any) -> Any:
    """The model runner of an in-process ``LLM`` (raises with what to do otherwise)."""
    engine = getattr(llm, "llm_engine", llm)
    executor = getattr(engine, "model_executor", None)
    if executor is None:
        core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
        executor = getattr(core, "model_executor", None)
    worker = getattr(getattr(executor, "driver_worker", None), "worker", None)
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        raise RuntimeError(f"{_MP_HELP} (no model runner at llm.llm_engine.model_executor.driver_worker"
                           f".worker.model_runner of this {type(llm).__name__}; "
                           f"VLLM_ENABLE_V1_MULTIPROCESSING="
                           f"{os.environ.get('VLLM_ENABLE_V1_MULTIPROCESSING', 'unset')})")
    return runner


def get_model(llm: Any) -> Any:
    """The torch ``nn.Module`` vLLM runs, for ``debugger.start(model=...)``."""
    return get_model_runner(llm).get_model()


class _VllmDescriber:
    """Which rows of the forward about to run belong to which request and token position."""

    def __init__(self, llm: Any, runner: Any):
        self.runner = runner
        self.processor = getattr(getattr(llm, "llm_engine", None), "output_processor", None)
        self.external: Dict[str, str] = {}

    def external_id(self, internal: str) -> str:
        ext = self.external.get(internal)
        if ext is None:
            state = getattr(self.processor, "request_states", {}).get(internal)
            ext = getattr(state, "external_req_id", None)
            if ext is None:      # vLLM makes internal ids as f"{request_id}-{random suffix}"
                ext = internal.rsplit("-", 1)[0] if "-" in internal else internal
            self.external[internal] = ext
        return ext

    def query_start_loc(self, num_reqs: int) -> List[int]:
        meta = None
        fc = sys.modules.get("vllm.forward_context")     # loaded whenever an engine runs
        if fc is not None:
            try:
                meta = fc.get_forward_context().attn_metadata
            except Exception:       # no forward context set: use the runner's own buffer
                meta = None
        if isinstance(meta, list):      # micro-batches: not with the CPU runner
            meta = meta[0] if len(meta) == 1 else None
        if isinstance(meta, dict):
            for m in meta.values():
                qsl = getattr(m, "query_start_loc", None)
                if qsl is not None and int(qsl.shape[0]) >= num_reqs + 1:
                    return [int(v) for v in qsl[:num_reqs + 1].tolist()]
        buf = getattr(self.runner, "query_start_loc", None)
        cpu = getattr(buf, "cpu", buf)
        return [int(v) for v in cpu[:num_reqs + 1].tolist()]

    def __call__(self, iteration: int, args: tuple, kwargs: dict) -> IterationInfo:
        batch = self.runner.input_batch
        num_reqs = int(batch.num_reqs)
        req_ids = list(batch.req_ids[:num_reqs])
        qsl = self.query_start_loc(num_reqs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        rows_tensor = ids if ids is not None else embeds
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        if positions is not None and positions.dim() == 2:      # M-RoPE: [3, num_tokens]
            positions = positions[0]
        num_rows = int(rows_tensor.shape[0]) if rows_tensor is not None else qsl[-1]
        pos = [int(p) for p in positions[:qsl[-1]].tolist()] if positions is not None else None
        segments: List[Segment] = []
        prompt_lens: Dict[str, int] = {}
        for i, internal in enumerate(req_ids):
            a, b = qsl[i], qsl[i + 1]
            if b <= a:
                continue
            rid = self.external_id(internal)
            plen = int(batch.num_prompt_tokens[i])
            prompt_lens[rid] = plen
            if pos is None:
                start = int(batch.num_computed_tokens_cpu[i])
                rpos = list(range(start, start + b - a))
            else:
                rpos = pos[a:b]
            total = int(batch.num_tokens_no_spec[i])
            # prompt rows form one segment (token 0); every later row is its own token
            j = 0
            while j < len(rpos):
                token = max(0, rpos[j] - plen + 1)
                k = j + 1
                if token == 0:
                    while k < len(rpos) and rpos[k] - plen + 1 <= 0:
                        k += 1
                last = k == len(rpos)
                segments.append(Segment(request=rid, token=token, rows=[a + j, a + k],
                                        positions=[rpos[j], rpos[k - 1] + 1],
                                        logits_row=i if last else None,
                                        sampled=bool(last and rpos[-1] + 1 >= total),
                                        internal_id=internal))
                j = k
        return IterationInfo("flat", segments, num_rows=num_rows, num_reqs=num_reqs, prompt_lens=prompt_lens,
                             extra={"num_tokens": qsl[-1]})


class TokenRangeDump:
    """Dump generated-token positions ``token_range`` (inclusive) of every request of ``llm``.

    ``with TokenRangeDump(llm, debugger, token_range=(1, 3)): llm.generate(...)`` -- the
    debugger is started on the vLLM model when the block opens; forwards holding a row of some
    request at a token position in the range are dumped (with the logits computed from them);
    on exit the debugger stops, ``token_map.json`` is written into the step's rank folder and
    ``debugger.step()`` closes the folder (``advance_step=False`` leaves that to you).

    ``.model`` is the underlying torch model (``debugger.start(model=tr.model)`` for direct use);
    ``.token_map_path`` the side file written on exit; ``split_by_request`` cuts the dump into one
    dump per request with one step per token position.
    """

    def __init__(self, llm: Any, debugger: Any, token_range: Sequence[int] = (1, 1), *,
                 advance_step: bool = True):
        self.llm = llm
        self.debugger = debugger
        self.token_range = check_token_range(token_range)
        self.advance_step = advance_step
        self.runner = get_model_runner(llm)
        self.model = self.runner.get_model()
        spec = getattr(self.runner, "speculative_config", None)
        if spec is not None:
            raise NotImplementedError("TokenRangeDump does not map rows of speculative decoding "
                                      "(several sampled tokens per request per forward) yet")
        self._window: Optional[TokenWindow] = None

    @property
    def token_map_path(self) -> Optional[str]:
        return self._window.token_map_path if self._window is not None else None

    @property
    def token_map(self) -> Optional[dict]:
        return self._window.token_map() if self._window is not None else None

    def __enter__(self) -> "TokenRangeDump":
        self._window = TokenWindow(self.debugger, self.model, self.token_range,
                                   _VllmDescriber(self.llm, self.runner), source="vllm",
                                   end_module=getattr(self.model, "logits_processor", None),
                                   advance_step=self.advance_step)
        self._window.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._window.__exit__(*exc)
