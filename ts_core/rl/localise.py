"""Where the trainer's and the engine's forwards part: both dumped on one token sequence, paired
stage by stage, the first stage beyond the noise band named with what it points at.

Both sides see the same positions: the sequence (prompt + sampled tokens) is replayed through
the engine as a prompt (prefill under a fresh ``cache_salt``: no cached prefix, token range [0, 0] of
:class:`ts_integrations.vllm.TokenRangeDump`), and through the trainer's forward under the dump
core (``PrecisionDebugger``, task tensor, level L0). The pairing is the mapping table of
:mod:`ts_core.rl.stages`, read from the two dumps by module path: vLLM's fused ``qkv_proj`` /
``gate_up_proj`` and its own norm and rotary kernels sit *inside* the paired modules, so the
generic call-by-call engine has nothing to pair them with; decoder-layer granularity (each
sub-module's output flattened to ``[tokens, H]``) is where the two implementations agree on
meaning. A chunked prefill gives several records of one module: their rows are concatenated.
The generic engine still runs on the two dumps (:func:`generic_compare`); its result and report
are kept beside the stage table, which is what the verdict uses.
"""
from __future__ import annotations

import os
import uuid
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .stages import OP_CAUSE, Stage, rel_err, rows


def _outputs(root: str) -> Dict[str, List[List[Optional[np.ndarray]]]]:
    """module path -> per call (in order), its output tensors (None for a non-tensor)."""
    from ts_core.compare.load.loader import Dump, find_dumps

    units = find_dumps(root)
    if not units:
        raise FileNotFoundError(f"{root}: no dump.json written")
    dump = Dump(units[-1])
    out: Dict[str, List[List[Optional[np.ndarray]]]] = {}
    for key, rec in dump.data.items():
        if not key.startswith("Module.") or not isinstance(rec, dict):
            continue
        parts = key[len("Module."):].rsplit(".", 3)       # path, class, forward, n
        if len(parts) != 4 or parts[2] != "forward":
            continue
        outs = rec.get("output")
        outs = outs if isinstance(outs, list) else [outs]
        arrs = [dump.load_tensor(e["data_name"]) if isinstance(e, dict) and e.get("data_name") else None
                for e in outs]
        out.setdefault(parts[0], []).append(arrs)
    return out


def _read(calls: List[List[Optional[np.ndarray]]], how: str) -> Optional[np.ndarray]:
    chunks = []
    for outs in calls:
        if not outs or outs[0] is None:
            return None
        a = rows(outs[0])
        if how == "sum01" and len(outs) > 1 and outs[1] is not None:
            a = a + rows(outs[1])
        chunks.append(a)
    return np.concatenate(chunks, axis=0) if chunks else None


def dump_trainer(model: Any, sequence: Sequence[int], path: str) -> str:
    """The trainer's forward on `sequence`, dumped (task tensor, level L0) under `path`."""
    import torch

    from ts_core import PrecisionDebugger

    dbg = PrecisionDebugger(task="tensor", level="L0", dump_path=path, fingerprint=False)
    try:
        dbg.start(model)
        with torch.no_grad():
            model(input_ids=torch.tensor([list(sequence)], device=next(model.parameters()).device))
        dbg.stop()
        dbg.step()
    finally:
        dbg.close()
    return path


def dump_engine(llm: Any, sequence: Sequence[int], path: str, cache_salt: str) -> str:
    """The engine's prefill of `sequence` (replayed as a prompt), dumped under `path`. A fresh
    `cache_salt` makes every row computed (no cached prefix, from the rollout or anything else)
    without resetting the engine's prefix cache, which belongs to the training loop."""
    from vllm import SamplingParams

    from ts_core import PrecisionDebugger
    from ts_integrations.vllm import TokenRangeDump

    dbg = PrecisionDebugger(task="tensor", level="L0", dump_path=path, fingerprint=False)
    try:
        with TokenRangeDump(llm, dbg, token_range=(0, 0)):
            llm.generate([{"prompt_token_ids": list(sequence), "cache_salt": cache_salt}],
                         SamplingParams(max_tokens=1, temperature=0.0),
                         use_tqdm=False)
    finally:
        dbg.close()
    return path


def compare_stages(trainer_dump: str, engine_dump: str, stages: List[Stage],
                   band: Dict[str, float]) -> List[Dict[str, Any]]:
    """One row per stage: the relative L2 difference, its band, and whether it stands above it."""
    t, e = _outputs(trainer_dump), _outputs(engine_dump)
    table = []
    for s in stages:
        a = _read(e[s.engine], s.engine_read) if s.engine in e else None
        b = _read(t[s.name], "out0") if s.name in t else None
        row = {"stage": s.name, "op": s.op, "layer": s.layer, "engine_module": s.engine,
               "band": band.get(s.name)}
        if a is None or b is None:
            row.update(rel=None, above=None, note="not in the " + ("engine" if a is None else "trainer") + " dump")
        else:
            r = rel_err(a, b)
            row.update(rel=r, above=bool(row["band"] is not None and r > row["band"]),
                       rows=[int(a.shape[0]), int(b.shape[0])])
        table.append(row)
    return table


def first_divergence(table: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The first stage beyond its band (data-flow order), with the op it points at."""
    for row in table:
        if row.get("above"):
            return {**row, "points_at": OP_CAUSE.get(row["op"], row["op"]),
                    "ratio": row["rel"] / row["band"] if row["band"] else float("inf")}
    return None


def localise(model: Any, llm: Any, sequence: Sequence[int], stages: List[Stage], band: Dict[str, float],
             workdir: str) -> Dict[str, Any]:
    """Dump both sides on `sequence` under `workdir`, pair the stages, name the first divergence."""
    from ts_core import PrecisionDebugger

    if PrecisionDebugger.current() is not None:
        return {"skipped": "a PrecisionDebugger is open in this process (one per process): close it, or run "
                           "rl-check where none is, to localise", "stages": [], "first": None}
    tdir, edir = os.path.join(workdir, "trainer_dump"), os.path.join(workdir, "engine_dump")
    dump_trainer(model, sequence, tdir)
    dump_engine(llm, sequence, edir, cache_salt=f"tsprobe-rl-replay-{uuid.uuid4().hex}")
    table = compare_stages(tdir, edir, stages, band)
    missing = [r["stage"] for r in table if r.get("note") == "not in the engine dump"]
    note = ("the engine's decoder modules left no records (a compiled model: hooks do not fire inside its "
            "graph): create the LLM with enforce_eager=True to localise below the logits"
            if len(missing) > len(table) // 2 else None)
    return {"sequence_len": len(sequence), "trainer_dump": tdir, "engine_dump": edir, "stages": table, "note": note,
            "first": first_divergence(table), "generic": generic_compare(tdir, edir, os.path.join(workdir, "compare"))}


def generic_compare(trainer_dump: str, engine_dump: str, out: str) -> Dict[str, Any]:
    """The same two dumps through tsprobe's call-by-call engine (``tsprobe compare``), for the record:
    it pairs what the two implementations share (o_proj, down_proj, norms...) with dtype tolerances
    and no noise band, and reports vLLM's fused calls as unpaired. Its report.html is kept in `out`."""
    from ts_core.compare.api import compare

    try:
        res = compare(trainer_dump, engine_dump, out, verbose=False, progress=False)
    except Exception as exc:          # informative only: the stage table above is the answer
        return {"error": f"{type(exc).__name__}: {exc}"}
    fd = res.first_divergence
    rows = res.rows
    return {"report": res.report_path, "rows": len(rows),
            "first": None if fd is None else {"key": fd.key, "target_key": fd.target_key, "cause": fd.cause}}
