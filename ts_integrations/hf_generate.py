"""Inference capture by token range for Hugging Face ``generate``.

``generate_with_dump(model, debugger, token_range=(s, e), **generate_kwargs)`` dumps the
forwards of decoding iterations s..e (iteration 0 = prefill) of ``model.generate`` and writes
``token_map.json`` next to dump.json; see docs/inference.md. The window itself is shared with
vLLM (:mod:`ts_integrations.token_window`); cutting the dump into one dump per request and token
is ``split_by_request`` (:mod:`ts_core.dumpfmt.by_request`, re-exported here).

Nothing here imports torch or transformers at module import time.
"""
from __future__ import annotations

from typing import Any, Sequence

from ts_core.dumpfmt import TOKEN_MAP, split_by_request

from .token_window import IterationInfo, Segment, TokenWindow

__all__ = ["TOKEN_MAP", "generate_with_dump", "split_by_request"]

def _hf_describe(iteration: int, args: tuple, kwargs: dict) -> IterationInfo:
    """One ``model.generate`` forward: [B, T] inputs, left padding marked by the attention mask."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        ids = kwargs["inputs_embeds"]
    bsz, seq = int(ids.shape[0]), int(ids.shape[1])
    mask = kwargs.get("attention_mask")
    pos = kwargs.get("position_ids")
    valid = mask[:, -seq:].bool().tolist() if mask is not None and mask.dim() == 2 else [[True] * seq] * bsz
    totals = mask.sum(dim=1).tolist() if mask is not None and mask.dim() == 2 else None
    segments, prompt_lens = [], {}
    for b in range(bsz):
        cols = [t for t, v in enumerate(valid[b]) if v]
        if not cols:
            continue
        a, e = cols[0], cols[-1] + 1
        if pos is not None:
            p0 = int(pos[b, a])
        elif totals is not None:
            p0 = int(totals[b]) - (e - a)
        else:
            p0 = iteration + seq - 1 if iteration else 0
        rid = str(b)
        if iteration == 0:
            prompt_lens[rid] = e - a
        segments.append(Segment(request=rid, token=iteration, batch_index=b, rows=[a, e],
                                positions=[p0, p0 + e - a], logits_row=b, sampled=True))
    return IterationInfo("batch", segments, num_rows=bsz, num_reqs=bsz, seq_len=seq, prompt_lens=prompt_lens)


def generate_with_dump(model: Any, debugger: Any, token_range: Sequence[int], *args: Any,
                       advance_step: bool = True, **generate_kwargs: Any) -> Any:
    """``model.generate(*args, **generate_kwargs)`` dumping only decoding iterations s..e.

    Iteration 0 is the prefill, iteration k >= 1 the forward that consumes generated token
    k-1 (one forward per token, as ``generate`` runs with its KV cache). Request ids in the
    token map are the batch rows ("0", "1", ...; with ``num_beams``/``num_return_sequences``
    every expanded row is its own request). Batched prompts need left padding
    (``tokenizer.padding_side = "left"``), as ``generate`` itself does for decoder-only models.
    Returns what ``generate`` returns; the dump folder is closed with ``debugger.step()``
    unless ``advance_step=False``.
    """
    with TokenWindow(debugger, model, token_range, _hf_describe, source="hf_generate",
                     advance_step=advance_step):
        return model.generate(*args, **generate_kwargs)
