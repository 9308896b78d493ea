"""A pair of dumps of which exactly one was written by msprobe: its recording conventions
(load/msprobe_conventions.py) and the calls it does not record (load/msprobe_api.py) are
counted apart and said in one line each, never reported as differences."""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, List, Tuple

from ...dumpfmt import BACKWARD, INPUT, STAT_FIELDS, is_tensor_summary, parse_key
from ..load.msprobe_api import LOW_RISK, msprobe_records
from ..load.msprobe_conventions import drop_checksums_from_backward
from .pairs import CallPair

NOT_RECORDED = ("a call msprobe does not record (not in its API list, low-risk at its default risk_level, or the "
                "backward of a call that returns its input)")


def one_msprobe(gd: Any, td: Any) -> bool:
    return bool(gd.msprobe) != bool(td.msprobe)


def prepare(gd: Any, td: Any) -> List[str]:
    """Before the calls are read: apply what needs both sides; the notes on msprobe's conventions."""
    if not one_msprobe(gd, td):
        return []
    ms = gd if gd.msprobe else td
    c, notes = ms.conventions, []
    if c.inner:
        why = "; ".join(f"{k}: msprobe hooks {w}" for k, w in sorted(c.inner.items()))
        notes.append(f"{len(c.inner)} msprobe backward record(s) hold the gradient at an inner autograd node "
                     f"({why}): their input gradients are not compared (a recording convention, not a finding)")
    if c.keyword_modules:
        notes.append(f"{len(c.keyword_modules)} msprobe module backward record(s) hold no input gradient (inputs "
                     f"passed as keywords get none from torch's full backward hook): not compared")
    if c.inplace_checksums:
        notes.append(f"{c.inplace_checksums} in-place input checksum(s) msprobe took after the op ran: not "
                     f"compared (their statistics are)")
    if ms.level in ("mix", "L0"):
        n = drop_checksums_from_backward(ms.data)
        if n:
            notes.append(f"msprobe's module backward hooks ({ms.level}) change gradients in the last bits: {n} "
                         f"checksum(s) from the backward pass on are not compared (their statistics are)")
    return notes


OPTIMIZER_INTERNAL = ("a call torch's optimizer (or gradient clipping) makes inside its step: msprobe records it, "
                      "tsprobe runs it unrecorded as framework machinery")
_MACHINERY_FRAMES = ("/torch/optim/", "/torch/nn/utils/clip_grad.py")


def mark_optimizer_internals(seqs: List[List[CallPair]], gd: Any, td: Any) -> Tuple[int, str]:
    """Mark the calls alone on the msprobe side that torch's optimizer made (msprobe's construct
    parent "optimizer", or a frame of torch.optim / clip_grad on its stack) as harmless: tsprobe
    leaves torch's optimizer internals unrecorded (their choice of kernels is per device). Returns
    how many and the one line that says so ("" when none)."""
    if not one_msprobe(gd, td):
        return 0, ""
    ms = gd if gd.msprobe else td

    def by_optimizer(key: str) -> bool:
        forward = parse_key(key).forward_key
        return ms.construct.get(forward) == "optimizer" or any(
            m in frame for frame in ms.stacks.get(forward, ()) for m in _MACHINERY_FRAMES)
    names = _mark_lone(seqs, msprobe_side=True, golden_is_ms=bool(gd.msprobe), harmless=by_optimizer,
                       why=OPTIMIZER_INTERNAL)
    return _counted(names, "calls inside torch's optimizer step that msprobe records and tsprobe does not")


def mark_not_recorded(seqs: List[List[CallPair]], gd: Any, td: Any) -> Tuple[int, str]:
    """Mark the calls alone on the tsprobe side that msprobe does not record as harmless;
    returns how many and the one line that says so ("" when none)."""
    if not one_msprobe(gd, td):
        return 0, ""
    ms = gd if gd.msprobe else td
    low_risk_too = any(parse_key(k).kind == "api" and _api(k)[1] in LOW_RISK and msprobe_records(*_api(k), True)
                       for k in ms.data)      # made with risk_level ALL

    def unrecorded(key: str) -> bool:
        info = parse_key(key)
        # a call that returns its input (dropout in eval) creates no node for msprobe's hook
        no_node = info.direction == BACKWARD and key not in ms.data \
            and _returns_input(ms.data.get(info.forward_key))
        return not msprobe_records(*_api(key), low_risk_too) or no_node
    names = _mark_lone(seqs, msprobe_side=False, golden_is_ms=bool(gd.msprobe), harmless=unrecorded,
                       why=NOT_RECORDED)
    return _counted(names, "calls msprobe does not record")


def _mark_lone(seqs: List[List[CallPair]], msprobe_side: bool, golden_is_ms: bool,
               harmless: Callable[[str], bool], why: str) -> Counter:
    """Mark as harmless (`why`) the API calls alone on one side (msprobe's or tsprobe's) for
    which `harmless(key)` holds; returns their API names, counted."""
    names: Counter = Counter()
    alone_is_golden = golden_is_ms == msprobe_side
    for seq in seqs:
        for cp in seq:
            alone, other = (cp.golden, cp.target) if alone_is_golden else (cp.target, cp.golden)
            if other is not None or alone is None or alone.kind != "api" or alone.members:
                continue
            if harmless(alone.key):
                cp.harmless = why
                names[_api(alone.key)[1]] += 1
    return names


def _counted(names: Counter, what: str) -> Tuple[int, str]:
    """How many, and the one line "N <what> (a, b, c, d, ...): not compared" ("" when none)."""
    n = sum(names.values())
    if not n:
        return 0, ""
    top = ", ".join(a for a, _ in names.most_common(4)) + (", ..." if len(names) > 4 else "")
    return n, f"{n} {what} ({top}): not compared"


def _returns_input(forward: Any) -> bool:
    """Does msprobe's forward record show the call's output equal to its first input (same
    shape and statistics)?"""
    if not isinstance(forward, dict):
        return False
    args, outs = forward.get("input_args") or [], forward.get("output") or []
    a, o = (args[0] if args else None), (outs[0] if outs else None)
    fields = ("shape", "dtype") + STAT_FIELDS
    return is_tensor_summary(a) and is_tensor_summary(o) and all(a.get(k) == o.get(k) for k in fields)


def unreached(cp: CallPair, role: str, ge: Any, te: Any, gd: Any, td: Any) -> bool:
    """A module backward's gradient of an output that msprobe recorded as null (no gradient
    reached it from outside the module) while tsprobe recorded the gradient its own inner use
    gave it: not compared (counted on msprobe's dump)."""
    if cp.kind != "module" or cp.direction != BACKWARD or role != INPUT or not one_msprobe(gd, td):
        return False
    ms_leaf, other = (ge, te) if gd.msprobe else (te, ge)
    if (ms_leaf is None or ms_leaf.leaf is None) and other is not None and other.is_tensor:
        (gd if gd.msprobe else td).conventions.unreached += 1
        return True
    return False


def unreached_note(gd: Any, td: Any) -> List[str]:
    n = (gd if gd.msprobe else td).conventions.unreached if one_msprobe(gd, td) else 0
    return [f"{n} module output gradient(s) msprobe recorded as null (no gradient reached the output from outside "
            f"the module; tsprobe records the one its inner use gave it): not compared"] if n else []


def _api(key: str) -> Tuple[str, str]:
    info = parse_key(key)
    return info.prefix, info.api_name


__all__ = ["NOT_RECORDED", "OPTIMIZER_INTERNAL", "mark_not_recorded", "mark_optimizer_internals", "one_msprobe",
           "prepare"]
