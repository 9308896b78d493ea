"""``troubleshooter.migrator`` look-alike: ``api_dump_init/start/stop/compare``, ``compare_npy_dir``.

Collection is done by the one engine, :class:`ts_core.debugger.PrecisionDebugger` (level
``mix``, task ``tensor`` or ``statistics``), into a hidden folder ``rank0/.tsprobe_raw``; at
``api_dump_stop()`` the debugger is closed (every patch and hook removed) and its records are
translated into TroubleShooter's layout by :mod:`ts_core.compat.layout`.
"""
from __future__ import annotations

import csv
import math
import os
import shutil
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..compare.align import crossframework
from ..compare.align.matching import align
from ..compare.judge.metrics import compare_arrays
from ..dumpfmt import DUMP_JSON, parse_key
from .npy_dir import compare_npy_dir, get_name_map_list_by_name
from .layout import Translator, load_info

__all__ = ["api_dump_init", "api_dump_start", "api_dump_stop", "api_dump_compare",
           "compare_npy_dir", "get_name_map_list_by_name"]

MODES = ("all", "list", "range", "api_list")
DUMP_TYPES = ("all", "statistics", "npy", "stack")


class _State:
    def __init__(self, net: Any, output_path: str, retain_backward: bool, framework: str):
        self.net = net
        self.framework = framework                    # "pytorch" | "mindspore"
        self.rank_dir = os.path.join(os.fspath(output_path), "rank0")
        self.retain_backward = retain_backward
        prefix = "torch" if framework == "pytorch" else "mindspore"
        self.translator = Translator(self.rank_dir, prefix)
        self.debugger = None
        self.window = 0
        self.options: Dict[str, Any] = {}
        self.dropouts: List[Tuple[Any, Dict[str, Any]]] = []


_state: Optional[_State] = None


def _framework(net: Any) -> str:
    """'pytorch' or 'mindspore' for a Module/Cell; a TypeError in TroubleShooter's terms otherwise
    (not the core's ``start(model=...)`` one: the user never called start)."""
    import sys

    torch, ms = sys.modules.get("torch"), sys.modules.get("mindspore")
    if "mindtorch" not in sys.modules and torch is not None and isinstance(net, torch.nn.Module):
        return "pytorch"
    if ms is not None and isinstance(net, ms.nn.Cell) and "mindtorch" not in sys.modules:
        return "mindspore"
    what = "None" if net is None else type(net).__name__
    hint = " (MindTorch networks are not supported by the TroubleShooter API; use PrecisionDebugger)" \
        if "mindtorch" in sys.modules else ""
    raise TypeError(f"api_dump_init(net, output_path): net must be the network to dump, a torch.nn.Module or a "
                    f"mindspore.nn.Cell; got {what}{hint}")


def api_dump_init(net: Any, output_path: str = "./ts_api_dump", *, retain_backward: bool = False,
                  compare_statedict: bool = False) -> None:
    """Prepare dumping ``net`` (torch Module or MindSpore Cell) into ``output_path/rank0``."""
    global _state
    if _state is not None and _state.debugger is not None:
        api_dump_stop()
    fw = _framework(net)
    _state = _State(net, output_path, bool(retain_backward), fw)
    if compare_statedict:
        if fw == "pytorch":   # TroubleShooter writes pt_net.pth; we never pickle: .npz of the state_dict
            sd = {k: v.detach().float().cpu().numpy() if v.is_floating_point() else v.cpu().numpy()
                  for k, v in net.state_dict().items()}
            np.savez(os.path.join(_state.rank_dir, "pt_net.npz"), **sd)


def _zero_dropout(st: _State) -> None:
    st.dropouts = []
    if st.framework == "pytorch":
        import torch
        for m in st.net.modules():
            if isinstance(m, torch.nn.modules.dropout._DropoutNd):
                st.dropouts.append((m, {"p": m.p}))
                m.p = 0.0
    else:
        import mindspore as ms
        for _, c in st.net.cells_and_names():
            if isinstance(c, (ms.nn.Dropout, getattr(ms.nn, "Dropout1d", ms.nn.Dropout),
                              getattr(ms.nn, "Dropout2d", ms.nn.Dropout), getattr(ms.nn, "Dropout3d", ms.nn.Dropout))):
                saved = {a: getattr(c, a) for a in ("p", "keep_prob") if hasattr(c, a)}
                st.dropouts.append((c, saved))
                if "p" in saved:
                    c.p = 0.0
                if "keep_prob" in saved:
                    c.keep_prob = 1.0


def _restore_dropout(st: _State) -> None:
    for m, saved in st.dropouts:
        for a, v in saved.items():
            setattr(m, a, v)
    st.dropouts = []


def api_dump_start(mode: str = "all", scope: Optional[Sequence[str]] = None, dump_type: str = "all",
                   filter_data: bool = True, filter_stack: bool = True) -> None:
    """Start dumping (seed 001): ``mode`` all/list/range/api_list with ``scope``; ``dump_type``
    all/statistics/npy/stack; ``filter_data`` drops non-float tensors."""
    if _state is None:
        raise RuntimeError("api_dump_start: call migrator.api_dump_init(net, output_path) first")
    if mode not in MODES:
        raise ValueError(f"api_dump_start: mode={mode!r}; use one of {MODES}")
    if dump_type not in DUMP_TYPES:
        raise ValueError(f"api_dump_start: dump_type={dump_type!r}; use one of {DUMP_TYPES}")
    if mode != "all" and (not scope or not isinstance(scope, (list, tuple))):
        raise ValueError(f"api_dump_start: mode={mode!r} needs scope as a non-empty list of names")
    if mode == "range" and len(scope) != 2:
        raise ValueError(f"api_dump_start: mode='range' needs scope=[first, last], got {scope!r}")
    st = _state
    if st.debugger is not None:
        return
    from ..debugger import PrecisionDebugger
    raw = os.path.join(st.rank_dir, ".tsprobe_raw", f"window{st.window}")
    shutil.rmtree(raw, ignore_errors=True)
    task = "tensor" if dump_type in ("all", "npy") else "statistics"
    data_mode = ["all"] if st.retain_backward else ["forward"]
    st.options = dict(mode=mode, scope=list(scope or []), dump_type=dump_type, filter_data=bool(filter_data))
    _zero_dropout(st)
    st.debugger = PrecisionDebugger(task=task, dump_path=raw, level="mix", framework=st.framework,
                                    data_mode=data_mode)
    st.debugger.start(st.net)


def api_dump_stop() -> None:
    """Stop dumping: close the debugger (restores every patch), restore dropout, write the layout."""
    st = _state
    if st is None or st.debugger is None:
        return
    dbg, st.debugger = st.debugger, None
    quiet = os.environ.get("TSPROBE_QUIET")
    os.environ["TSPROBE_QUIET"] = "1"        # the hidden raw folder is not the user's output
    try:
        dbg.stop()
        dirs = list(dbg.dump_dirs)
        dbg.close()
    finally:
        if quiet is None:
            os.environ.pop("TSPROBE_QUIET", None)
        else:
            os.environ["TSPROBE_QUIET"] = quiet
    _restore_dropout(st)
    seen = []
    for d in dirs + list(dbg.dump_dirs):
        if d not in seen and os.path.isfile(os.path.join(d, DUMP_JSON)):
            seen.append(d)
    for d in seen:
        st.translator.add_dump(d, retain_backward=st.retain_backward, **st.options)
    st.translator.write()
    shutil.rmtree(os.path.join(st.rank_dir, ".tsprobe_raw"), ignore_errors=True)
    st.window += 1


# -- compare ---------------------------------------------------------------------------------
_HEAD = ["ORIGIN NET ({o})", "TARGET NET ({t})", "shape of origin", "shape of target", "result of allclose",
         "ratio of allclose", "cosine similarity", "mean diff", "max diff"]


def _apis(entries: List[list]) -> Dict[str, List[list]]:
    """api name (``NN_Linear_0``) -> its entries, in execution order."""
    out: Dict[str, List[list]] = {}
    for e in entries:
        api, rest = e[0].split("_forward_" if "_forward_" in e[0] else "_backward_", 1)
        out.setdefault(api, []).append(e)
    return out


def _split_steps(entries: List[list]) -> List[List[list]]:
    """A new step starts where a forward entry follows a backward one (TroubleShooter's rule)."""
    steps: List[List[list]] = [[]]
    prev_bwd = False
    for e in entries:
        fwd = "_forward_" in e[0]
        if fwd and prev_bwd:
            steps.append([])
        steps[-1].append(e)
        prev_bwd = not fwd
    return [s for s in steps if s]


def _forward_apis(entries: List[list]) -> List[Tuple[str, str]]:
    """(api name, tsprobe key of its forward record) of every api, in forward execution order.
    The key is entry[1] (layout.py keeps it); an entry without one is aligned by its api name."""
    seen: Dict[str, str] = {}
    for e in entries:
        if "_forward_" in e[0]:
            api = e[0].split("_forward_", 1)[0]
            if api not in seen:
                key = e[1] if len(e) > 1 and isinstance(e[1], str) else ""
                seen[api] = key if parse_key(key).kind in ("api", "module") else api
    return list(seen.items())


def _pair_apis(o: List[Tuple[str, str]], t: List[Tuple[str, str]], o_fw: str, t_fw: str
               ) -> List[Tuple[Optional[str], Optional[str]]]:
    """Same framework: identical names. Otherwise the matcher of ``tsprobe compare``: the
    MindSpore side's keys in torch vocabulary (torch_mapping.yaml, ``Cell.fc.Dense`` ->
    ``Module.fc.Linear``), aligned in order so an extra call on one side leaves the rest paired."""
    o_apis, t_apis = [a for a, _ in o], [b for b, _ in t]
    if o_fw == t_fw:
        ts = set(t_apis)
        pairs = [(a, a if a in ts else None) for a in o_apis]
        os_ = set(o_apis)
        return pairs + [(None, b) for b in t_apis if b not in os_]
    o_names, t_names = [k for _, k in o], [k for _, k in t]
    if crossframework.is_cross(o_fw, t_fw):
        ms_is_origin = crossframework.framework_of(o_fw) == crossframework.MINDSPORE
        torch_keys = t_names if ms_is_origin else o_names
        tr = crossframework.Translator(crossframework.Mapping.from_data(crossframework.load_mapping()), torch_keys)
        if ms_is_origin:
            o_names = [tr.key(k) for k in o_names]
        else:
            t_names = [tr.key(k) for k in t_names]
    return [(o_apis[i] if i is not None else None, t_apis[j] if j is not None else None)
            for i, j in align(o_names, t_names)]


def _metrics(oe: Optional[list], te: Optional[list], odir: str, tdir: str, rtol, atol, equal_nan) -> list:
    nan = math.nan
    oshape = tuple(oe[4]) if oe else None
    tshape = tuple(te[4]) if te else None
    if oe is None or te is None:
        return [oshape, tshape, None, nan, nan, nan, nan]
    of, tf = os.path.join(odir, oe[0] + ".npy"), os.path.join(tdir, te[0] + ".npy")
    if os.path.isfile(of) and os.path.isfile(tf):
        a = np.load(of, allow_pickle=False)
        b = np.load(tf, allow_pickle=False)
        if a.shape != b.shape:
            if a.size == b.size:
                b = b.reshape(a.shape)
            else:
                return [oshape, tshape, False, 0.0, nan, nan, nan]
        m = compare_arrays(a, b, rtol, atol, equal_nan=equal_nan)
        ok = bool(np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol, equal_nan=equal_nan))
        cos = m.cosine if m.cosine is not None else nan
        return [oshape, tshape, ok, m.allclose_ratio, cos, m.mean_abs_err, m.max_abs_err]
    # statistics only: compare [max, min, mean]
    so, st_ = oe[5], te[5]
    if any(v is None for v in list(so) + list(st_)):
        return [oshape, tshape, None, nan, nan, nan, nan]
    a, b = np.array(so, np.float64), np.array(st_, np.float64)
    ok = bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))
    diff = np.abs(a - b)
    return [oshape, tshape, ok, float(np.mean(np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))),
            nan, float(diff.mean()), float(diff.max())]


def _rows(o_entries, t_entries, pairs, direction, odir, tdir, rtol, atol, equal_nan, ignore_unmatched):
    oa, ta = _apis([e for e in o_entries if f"_{direction}_" in e[0]]), _apis([e for e in t_entries if f"_{direction}_" in e[0]])
    rows = []
    for o, t in pairs:
        if (o is None or t is None) and ignore_unmatched:
            continue
        oe = oa.get(o, []) if o else []
        te = ta.get(t, []) if t else []
        if not oe and not te:
            continue
        for part in ("input", "output"):
            ol = [e for e in oe if f"_{direction}_{part}." in e[0]]
            tl = [e for e in te if f"_{direction}_{part}." in e[0]]
            if direction == "forward" and part == "input" and o and t and o.startswith("NN_"):
                ol, tl = ol[:1], tl[:1]       # a layer's data input; weights are laid out differently
            for k in range(max(len(ol), len(tl))):
                e1 = ol[k] if k < len(ol) else None
                e2 = tl[k] if k < len(tl) else None
                if (e1 is None or e2 is None) and ignore_unmatched:
                    continue
                rows.append([e1[0] if e1 else None, e2[0] if e2 else None]
                            + _metrics(e1, e2, odir, tdir, rtol, atol, equal_nan))
    return rows


def _write_csv(path: str, head: List[str], rows: List[list]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(head)
        for r in rows:
            w.writerow(["" if v is None else (list(v) if isinstance(v, tuple) else v) for v in r])


def api_dump_compare(origin_path: str, target_path: str, output_path: Optional[str] = None, *,
                     rtol: float = 1e-4, atol: float = 1e-4, equal_nan: bool = False,
                     ignore_unmatched: bool = False) -> Dict[str, Any]:
    """Compare two api_dump outputs (torch<->MindSpore or same framework).

    Returns ``{"mapping": [...], "forward": [...], "backward": [...]}`` (lists per step when
    several steps were dumped with backward). With ``output_path`` writes
    ``ts_api_mapping.csv``, ``ts_api_forward_compare.csv``, ``ts_api_backward_compare.csv``
    (``_{step}`` suffixed when several steps). Rows hold numpy.allclose on the npy files, or on
    [max, min, mean] when the npy files are absent (dump_type statistics)."""
    op, o_entries, odir = load_info(origin_path)
    tp, t_entries, tdir = load_info(target_path)
    o_steps, t_steps = _split_steps(o_entries), _split_steps(t_entries)
    n_steps = max(len(o_steps), len(t_steps))
    head = [h.format(o=op, t=tp) for h in _HEAD]
    result: Dict[str, Any] = {"mapping": [], "forward": [], "backward": []}
    for s in range(n_steps):
        oe = o_steps[s] if s < len(o_steps) else []
        te = t_steps[s] if s < len(t_steps) else []
        pairs = _pair_apis(_forward_apis(oe), _forward_apis(te), op, tp)
        fwd = _rows(oe, te, pairs, "forward", odir, tdir, rtol, atol, equal_nan, ignore_unmatched)
        bwd = _rows(oe, te, list(reversed(pairs)), "backward", odir, tdir, rtol, atol, equal_nan, ignore_unmatched)
        mapping = [p for p in pairs if not (ignore_unmatched and (p[0] is None or p[1] is None))]
        result["mapping"].append(mapping)
        result["forward"].append(fwd)
        result["backward"].append(bwd)
        if output_path:
            os.makedirs(output_path, exist_ok=True)
            sfx = f"_{s}" if n_steps > 1 else ""
            _write_csv(os.path.join(output_path, f"ts_api_mapping{sfx}.csv"),
                       [f"ORIGIN NET ({op})", f"TARGET NET ({tp})"], [list(p) for p in mapping])
            _write_csv(os.path.join(output_path, f"ts_api_forward_compare{sfx}.csv"), head, fwd)
            _write_csv(os.path.join(output_path, f"ts_api_backward_compare{sfx}.csv"), head, bwd)
    if n_steps == 1:
        result = {k: v[0] for k, v in result.items()}
    _print(result, n_steps, head)
    return result


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.6g}"
    if isinstance(v, tuple):
        return str(list(v))
    return str(v)


def format_rows(head: List[str], rows: List[list]) -> str:
    """The compare rows as TroubleShooter prints them: one aligned table; an API that one net
    did not run is 'missing' (its side '-'), not 'not allclose'."""
    table = [head] + [[_cell(v) for v in r[:4]] + (["missing"] + ["-"] * (len(r) - 5) if r[0] is None or r[1] is None
                                                    else [_cell(v) for v in r[4:]]) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |", line]
    out += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in table[1:]]
    return "\n".join(out + [line])


def _print(result: Dict[str, Any], n_steps: int, head: List[str]) -> None:
    """Each direction's table, then one line: rows, allclose, not allclose, missing on a side
    (an API only one net ran is missing, not 'not allclose')."""
    steps = [result] if n_steps == 1 else [{k: v[s] for k, v in result.items()} for s in range(n_steps)]
    for s, res in enumerate(steps):
        for title in ("forward", "backward"):
            rows = res[title]
            if not rows:
                continue
            missing = [r for r in rows if r[0] is None or r[1] is None]
            bad = [r for r in rows if r[4] is not True and r not in missing]
            step = f" (step {s})" if n_steps > 1 else ""
            print(f"api_dump_compare {title}{step}:")
            print(format_rows(head, rows))
            print(f"{len(rows)} rows: {len(rows) - len(bad) - len(missing)} allclose, {len(bad)} not allclose, "
                  f"{len(missing)} missing on one side")
