"""Find the call that *introduced* an error, not the ones that propagated it.

Walk calls in execution order (forward, then backward). A call is the first divergence
when some output fails and each of its failing inputs is not the output of an earlier
call: a parameter, a model input, a changed argument (``eps``, ``approximate``), or a
gradient produced by something the dump did not record. Which earlier call produced a
tensor is recognised by its recorded fingerprint (dtype, shape, statistics, md5) on the
same side. If a failing input was produced by a call present on one side only, that
extra call is the divergence.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from .loader import INPUT, OUTPUT, PARAMETER, Dump, Entry, is_tensor_summary
from .matching import forward_key
from .result import FirstDivergence, Row
from .verdict import ERROR

_FRAME = re.compile(r"File (?P<file>.+?), line (?P<line>\d+), in (?P<func>.+?),\s*(?P<code>.*)", re.S)
# Frames that never are "the user's line": the frameworks, the dump tools, the standard library.
# Model code in site-packages (transformers, ...) does count: it is where the op was called.
_LIBRARY = re.compile(r"[/\\](torch|mindspore|msprobe|ts_core|ts_integrations)[/\\]|<frozen|"
                      r"[/\\]lib[/\\]python3\.\d+[/\\](?!site-packages|dist-packages)")


def fingerprint(leaf) -> Optional[tuple]:
    """What identifies one recorded tensor: equal fingerprints mean the same tensor value."""
    if not is_tensor_summary(leaf):
        return None
    stats = tuple(repr(leaf.get(k)) for k in ("Max", "Min", "Mean", "Norm", "md5"))
    if all(s == "None" for s in stats):
        return None
    return (str(leaf.get("dtype")), repr(leaf.get("shape"))) + stats


def user_frame(frames: List[str]) -> Optional[str]:
    """The innermost frame outside torch/mindspore, msprobe, tsprobe and the standard library,
    as 'file:line in func: code'."""
    if not frames:
        return None
    ordered = list(frames)
    if "in <module>" in ordered[0] and "in <module>" not in ordered[-1]:
        ordered.reverse()  # written outermost first
    parsed = []
    for f in ordered:
        m = _FRAME.match(f.strip())
        parsed.append((f, m))
    for f, m in parsed:
        path = m.group("file") if m else f
        if not _LIBRARY.search(path):
            if m:
                return f"{m.group('file')}:{m.group('line')} in {m.group('func')}: {m.group('code').strip()}"
            return f.strip()
    f, m = parsed[-1]
    return f"{m.group('file')}:{m.group('line')} in {m.group('func')}: {m.group('code').strip()}" if m else f.strip()


def _register(cp, produced: Tuple[Dict, Dict]) -> None:
    for side, table in zip(("golden", "target"), produced):
        call = cp.golden if side == "golden" else cp.target
        if call is None:
            continue
        for e in call.entries:
            if e.role == OUTPUT:
                fp = fingerprint(e.leaf)
                if fp is not None:
                    table.setdefault(fp, cp)


def _producer(cp, row: Row, produced: Tuple[Dict, Dict]):
    """The earlier call that produced this input on either side; one present on a single
    side only (an extra call) takes precedence, since it explains the difference."""
    found = []
    for side, table in zip(("golden", "target"), produced):
        e: Optional[Entry] = cp.entry(side, row.role, row.arg)
        fp = fingerprint(e.leaf) if e is not None else None
        if fp is not None and fp in table:
            found.append(table[fp])
    extra = [p for p in found if p.golden is None or p.target is None]
    return (extra or found or [None])[0]


def _describe_inputs(rows: List[Row]) -> str:
    parts = []
    for r in rows:
        if r.mode == "value":
            parts.append(f"{r.arg} (golden {r.golden_value!r}, target {r.target_value!r})")
        elif r.role == PARAMETER:
            parts.append(f"{r.arg} (a parameter)")
        else:
            parts.append(f"{r.arg} (not produced by any earlier recorded call: a parameter, a model input "
                         f"or the result of an op the dump does not record)")
    return ", ".join(parts)


def _worst(rows: List[Row]) -> Row:
    errors = [r for r in rows if r.verdict == ERROR]
    return (errors or rows)[0]


def _build(cp, out_rows: List[Row], cause: str, gd: Dump, td: Dump, step, rank) -> FirstDivergence:
    worst = _worst(out_rows)
    sides = [(c, d) for c, d in ((cp.golden, gd), (cp.target, td)) if c is not None]
    # a backward call has no stack of its own: use its forward call's
    # a merged group (cross-framework: "Torch.sigmoid.0.forward+Tensor.__mul__.0.forward") uses its first call's
    first = lambda c: c.key.split("+", 1)[0] if "+" in c.key and not c.key.startswith("+") else c.key  # noqa: E731
    stack = next((s for c, d in sides for s in (d.stacks.get(forward_key(first(c))), d.stacks.get(first(c))) if s), [])
    module = next((d.construct[first(c)] for c, d in sides if d.construct.get(first(c))), None)
    return FirstDivergence(
        key=cp.key, target_key=cp.target.key if cp.target else None, direction=cp.direction,
        tensor=worst.name, verdict=worst.verdict, reason=worst.reason, cause=cause,
        metrics=worst.metrics(), stack=list(stack), source=user_frame(list(stack)),
        module=str(module) if module else None, step=step, rank=rank,
        statistics_based=worst.mode != "tensor")


def _unmatched_divergence(src, consumer, row: Row, gd: Dump, td: Dump, step, rank) -> FirstDivergence:
    """The extra call (present on one side only) whose output feeds a differing input."""
    side = "golden" if src.golden is not None else "target"
    call = src.golden or src.target
    outs = [r for r in src.rows if r.role == OUTPUT] or src.rows
    cause = (f"{call.key} runs only in {side} and changes what {consumer.key} receives: "
             f"{row.arg} differs from there on")
    fd = _build(src, outs, cause, gd, td, step, rank)
    fd.verdict = ERROR
    fd.reason = f"call present only in {side}; its output feeds {consumer.key} ({row.arg}), which differs"
    return fd


def find_first_divergence(seqs, gd: Dump, td: Dump, step, rank) -> Tuple[Optional[FirstDivergence], str]:
    """Return the first divergence (or None) and a note saying why there is none."""
    for seq in seqs:
        produced: Tuple[Dict, Dict] = ({}, {})
        for cp in seq:
            out_fail = [r for r in cp.rows if r.role == OUTPUT and r.failed]
            if out_fail and cp.golden is not None and cp.target is not None and cp.kind != "parameters_grad":
                in_fail = [r for r in cp.rows if r.role in (INPUT, PARAMETER) and r.failed]
                propagated = [(r, src) for r in in_fail for src in [_producer(cp, r, produced)] if src is not None]
                if not propagated:
                    if in_fail:
                        cause = f"these inputs differ and come from no earlier call: {_describe_inputs(in_fail)}"
                    else:
                        cause = "its inputs and parameters match but its outputs do not: the difference is computed here"
                    return _build(cp, out_fail, cause, gd, td, step, rank), ""
                for r, src in propagated:
                    if src.golden is None or src.target is None:
                        return _unmatched_divergence(src, cp, r, gd, td, step, rank), ""
            _register(cp, produced)
    failing = [(cp, r) for seq in seqs for cp in seq for r in cp.rows if r.failed]
    if not failing:
        return None, "no call introduced an error: every compared value is within tolerance"
    grads = [cp.key for cp, r in failing if cp.kind == "parameters_grad"]
    if grads:
        return None, (f"no call introduced an error; parameter gradients differ from {grads[0]} on, "
                      f"although every recorded call's outputs match")
    return None, (f"no call introduced an error; {len(failing)} values differ only where their "
                  f"difference is explained by earlier calls")
