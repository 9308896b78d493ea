"""``acc_check(dump)``: replay every recorded API call of a tensor dump and grade its outputs.

For each forward API record: rebuild the call from its saved inputs (``plan.py``), replay it
on CPU in float64 and in the recorded dtypes (``backends/<framework>/replay.py``), grade each
recorded output against the float64 result (``standards.py``); the same for the input
gradients when the dump holds the call's backward record. A call that cannot be replayed is a
``skip`` row saying why. The framework's replayer is imported only here, when a dump needs it.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..backends._depth import internal
from ..compare.load.loader import Dump
from ..dumpfmt import TensorFileError, find_dumps, is_tensor_summary
from ..dumpfmt.stack import user_frame
from .outcome import Outcome, ReplayError
from .plan import CallPlan, TensorArg, build_plans, decode
from .replay import replay
from ..verdicts import ERROR, PASS, WARNING, worse
from .standards import STANDARDS_YAML, compare_values, grade, load_standards, measure
from .result import SKIP, AccCheckResult, CallResult, DetailRow

_REPLAYERS = {"pytorch": "ts_core.backends.torch.replay", "mindspore": "ts_core.backends.mindspore.replay"}
# Each names a module whose ADAPTER is the framework side of replay.Adapter.


def acc_check(dump: "os.PathLike | str", output_dir: "os.PathLike | str | None" = None, *,
              references: Optional[Dict[str, Any]] = None, standards: Optional[str] = None,
              backward: bool = True, white_list: Optional[List[str]] = None,
              black_list: Optional[List[str]] = None, verbose: bool = True) -> AccCheckResult:
    """Grade every API call of a tensor dump against a float64 replay of it.

    ``references``: custom API name (key without counter and direction, ``mylib.fused_gelu``)
    -> a callable or ``"module.function"`` that computes what it should (also overrides a
    framework API). ``standards``: a copy of ``standards.yaml`` with other thresholds.
    ``white_list``/``black_list``: API names (``linear``, ``__add__``) to check only / never
    (msprobe's acc_check config). With ``output_dir``: the two CSVs and acc_check_summary.json.
    """
    std_path = os.fspath(standards) if standards else STANDARDS_YAML
    std = load_standards(std_path)
    result = AccCheckResult(dump=str(dump), standards=std_path)
    refs = dict(references or {})
    for unit in find_dumps(dump):
        d = Dump(unit)
        plans, other = build_plans(d.data, std["random_apis"])
        for k, v in other.items():
            result.other_records[k] = result.other_records.get(k, 0) + v
        replayer, why = _replayer(d.framework)
        stacks = d.stacks
        for plan in plans:
            call, rows = _check_call(plan, d, unit.step, unit.rank, replayer, why, refs, std, backward,
                                     white_list, black_list)
            call.source = user_frame(stacks.get(plan.key, []))
            result.calls.append(call)
            result.details.extend(rows)
    if output_dir is not None:
        from .report import write_outputs

        write_outputs(result, output_dir)
    if verbose:
        from .report import summary_text

        print(summary_text(result))
    return result


def _replayer(framework: str) -> Tuple[Any, str]:
    name = _REPLAYERS.get(framework or "pytorch")
    if name is None:
        return None, f"framework {framework!r} has no replayer (pytorch, mindspore)"
    try:
        return importlib.import_module(name).ADAPTER, ""
    except ImportError as e:
        return None, f"{framework or 'pytorch'} is not installed here ({e})"


def _check_call(plan: CallPlan, d: Dump, step, rank, replayer, why: str, refs: Dict[str, Any],
                std: Dict[str, Any], backward: bool, white: Optional[List[str]],
                black: Optional[List[str]]) -> Tuple[CallResult, List[DetailRow]]:
    api_name = plan.key.rsplit(".", 1)[0]
    call = CallResult(step, rank, api_name, plan.key, SKIP, "")
    short = plan.api.rsplit(".", 1)[-1]
    problem = plan.problem or why
    if problem is None or not problem:
        if black and short in black:
            problem = f"filtered out by the black list ({short})"
        elif white and short not in white:
            problem = f"filtered out by the white list ({short} is not in it)"
    if not problem:
        try:
            with internal():       # a debugger collecting in this process does not record the replays
                resolved = replayer.resolve(plan, refs)
                outcome = replay(replayer, plan, resolved, lambda t: _load(d, t), backward)
        except ReplayError as e:
            problem = str(e)
    if problem:
        call.message = problem
        return call, [DetailRow(step, rank, api_name, plan.key, "forward", SKIP, problem)]
    rows = _grade_values(plan, d, step, rank, api_name, outcome, std, "forward")
    call.forward = _worst(rows)
    notes = list(outcome.notes)
    if plan.backward_key is not None:
        if outcome.grads_reference is not None:
            brows = _grade_values(plan, d, step, rank, api_name, outcome, std, "backward")
            rows += brows
            call.backward = _worst(brows)
        else:
            call.backward = SKIP
            notes.append(outcome.backward_note)
    failing = [f"{r.name}: {r.message}" for r in rows if r.status in (ERROR, WARNING)]
    call.message = "; ".join(failing + [n for n in notes if n])
    return call, rows


def _worst(rows: List[DetailRow]) -> str:
    status = PASS
    for r in rows:
        if r.status in (PASS, WARNING, ERROR):
            status = worse(status, r.status)
    return status


def _load(d: Dump, t: TensorArg) -> np.ndarray:
    try:
        return d.load_tensor(t.data_name)
    except TensorFileError as e:
        raise ReplayError(str(e)) from None


def _grade_values(plan: CallPlan, d: Dump, step, rank, api_name: str, outcome: Outcome, std: Dict[str, Any],
                  direction: str) -> List[DetailRow]:
    """Rows for the recorded forward outputs, or (``backward``) the recorded input gradients."""
    if direction == "forward":
        key, recorded, ref, peer = plan.key, plan.outputs, outcome.reference, outcome.peer
    else:
        key, recorded, ref, peer = plan.backward_key, plan.grad_outputs, outcome.grads_reference, outcome.grads_peer
    rows = []
    for i, (arg, leaf) in enumerate(recorded):
        row = _grade_one(plan.api, f"{key}.{arg}", leaf, ref[i], peer[i] if peer is not None else None, d, step,
                         rank, api_name, direction, std)
        if row is not None:
            rows.append(row)
    return rows


def _grade_one(api: str, name: str, leaf: Any, ref: Any, peer: Any, d: Dump, step, rank, api_name: str,
               direction: str, std: Dict[str, Any]) -> Optional[DetailRow]:
    row = DetailRow(step, rank, api_name, name, direction, PASS)
    short = api.rsplit(".", 1)[-1]
    if leaf is None:
        if ref is None:
            return None
        row.status, row.message = ERROR, "the dump recorded None, the replay returned a value"
        return row
    if not is_tensor_summary(leaf):
        value = leaf.get("value") if isinstance(leaf, dict) else leaf
        row.standard = "value"
        row.status, row.message = compare_values(_plain(ref), value)
        return row
    row.dtype, row.shape = str(leaf.get("dtype")), list(leaf.get("shape") or [])
    t = decode(leaf, name)
    if ref is None:
        row.status, row.message = ERROR, "the replay returned None where the dump recorded a tensor"
        return row
    ref = np.asarray(ref)
    row.bench_dtype = str(ref.dtype)
    try:
        recorded = np.asarray(d.load_tensor(t.data_name), dtype=np.float64 if ref.dtype.kind == "f" else None)
    except TensorFileError as e:
        row.status, row.message = SKIP, str(e)
        return row
    if recorded.size != ref.size:
        row.status, row.message = ERROR, f"shape differs: recorded {row.shape}, replay {list(ref.shape)}"
        return row
    target = measure(ref, recorded.reshape(ref.shape), row.dtype, std)
    peer_m = measure(ref, np.asarray(peer).reshape(ref.shape), row.dtype, std) \
        if peer is not None and np.asarray(peer).size == ref.size else None
    g = grade(short, row.dtype, target, peer_m, std)
    for k, v in target.to_dict().items():
        if hasattr(row, k) and k != "numel":
            setattr(row, k, v)
    if peer_m is not None:
        row.peer_max_rel_err, row.peer_mean_rel_err = peer_m.max_rel_err, peer_m.mean_rel_err
        row.peer_rmse, row.peer_eb = peer_m.rmse, peer_m.eb
    for k, v in g.ratios.items():
        setattr(row, f"{k}_ratio", v)
    row.standard, row.status, row.message = g.standard, g.status, "; ".join(g.reasons)
    return row


def _plain(v: Any) -> Any:
    if isinstance(v, np.ndarray) and v.size == 1:
        return v.item()
    if isinstance(v, np.generic):
        return v.item()
    return v
