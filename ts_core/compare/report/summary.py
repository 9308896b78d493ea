"""``tsprobe summary DUMP``: what a dump holds, and the first record carrying NaN/Inf (its first
line: the earliest step's first NaN/Inf, with the source line that made the call)."""
from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional

from ...dumpfmt import STAT_FIELDS, forward_key
from ...dumpfmt.stack import one_line
from ..align.matching import BACKWARD, FORWARD, OTHER
from ..judge.metrics import _num
from ..load.loader import Dump, find_dumps, is_tensor_summary
from .text import where


def _nonfinite(leaf: Any) -> Optional[str]:
    if not is_tensor_summary(leaf):
        return None
    bad = [k for k in STAT_FIELDS if (v := _num(leaf.get(k))) is not None and not math.isfinite(v)]
    return ", ".join(f"{k}={leaf.get(k)}" for k in bad) if bad else None


def summarize(path: os.PathLike | str) -> List[Dict[str, Any]]:
    """One dict per step/rank: counts, tensor mode, first NaN/Inf in execution order."""
    out = []
    for unit in find_dumps(path):
        dump = Dump(unit)
        calls = dump.calls()
        counts = {FORWARD: 0, BACKWARD: 0, OTHER: 0, "parameters_grad": 0}
        tensors = with_data = 0
        first_bad = None
        for c in calls:
            counts["parameters_grad" if c.kind == "parameters_grad" else c.direction] += 1
        for direction in (FORWARD, BACKWARD, OTHER):
            for c in calls:
                if c.direction != direction:
                    continue
                for e in c.entries:
                    if e.is_tensor:
                        tensors += 1
                        with_data += bool(e.leaf.get("data_name"))
                        bad = _nonfinite(e.leaf)
                        if bad and first_bad is None:
                            first_bad = {"key": c.key, "tensor": f"{c.key}.{e.arg}", "direction": direction,
                                         "stats": bad, "source": _source(dump, c.key)}
        out.append({"path": str(unit.json_path), "step": unit.step, "rank": unit.rank, "task": dump.task,
                    "level": dump.level, "framework": dump.framework, "records": len(calls), "counts": counts,
                    "tensors": tensors, "tensor_files": with_data, "tensor_mode": with_data > 0,
                    "tensor_format": dump.tensors.layout, "tensors_stored": len(dump.tensors.names()),
                    "first_nonfinite": first_bad})
    return out


def _source(dump: Dump, key: str) -> Optional[str]:
    """The innermost recorded frame of the call (its forward's stack): ``File F, line L, in
    FUNC: CODE``, or None when the dump has no stack for it."""
    frames = dump.stacks.get(forward_key(key)) or dump.stacks.get(key)
    return one_line(frames[0]) if frames else None


def summary_text(items: List[Dict[str, Any]]) -> str:
    lines = []
    bad = next((i for i in items if i["first_nonfinite"]), None)
    if bad is not None:
        nf = bad["first_nonfinite"]
        lines.append(f"first NaN/Inf: {where(bad['step'], bad['rank'])}: {nf['tensor']} ({nf['direction']}; "
                     f"{nf['stats']})" + (f" at {nf['source']}" if nf.get("source") else ""))
    steps = sorted({i["step"] for i in items if i["step"] is not None})
    ranks = sorted({i["rank"] for i in items})
    lines.append(f"{len(items)} dump(s); steps: {steps or '-'}; ranks: {ranks}")
    for i in items:
        c = i["counts"]
        mode = ("tensor" + (f" (packed, {i['tensors_stored']} stored)" if i["tensor_format"] == "packed" else "")
                if i["tensor_mode"] else "statistics only")
        lines.append(f"{where(i['step'], i['rank']) or 'dump'}: {i['records']} records "
                     f"({c['forward']} forward, {c['backward']} backward, {c['parameters_grad']} parameters_grad, "
                     f"{c['other']} other), {i['tensors']} tensors, {mode}; task={i['task'] or '?'} "
                     f"level={i['level'] or '?'} framework={i['framework'] or '?'}")
        nf = i["first_nonfinite"]
        lines.append(f"  first NaN/Inf: {nf['tensor']} ({nf['stats']})" if nf else "  no NaN/Inf recorded")
    return "\n".join(lines)
