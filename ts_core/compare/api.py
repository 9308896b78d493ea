"""``compare(golden, target, output_dir)``: the entry point behind ``tsprobe compare``."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

from ..dumpfmt import write_json_atomic
from .align import layouts
from .align.matching import default_normalise
from .errors import DumpFormatError
from .executor import run_units
from .explain.ranks import attribute, rank_summary
from .explain.replicas import check_units, replicas_text
from .judge.tolerances import DEFAULT_TOLERANCES
from .load.loader import Dump, find_dumps, pair_units
from .model import CompareResult
from .pipeline import Options
from .report.files import write_csv, write_summary
from .report.html import write_html
from .report.text import terminal_text


RANKS_JSON = "ranks.json"


def compare(golden: os.PathLike | str, target: os.PathLike | str, output_dir: Optional[os.PathLike | str] = None,
            *, rtol: Optional[float] = None, atol: Optional[float] = None, stats_only: bool = False,
            equal_nan: bool = True, workers: Optional[int] = None, html: bool = True,
            verbose: bool = True, progress: Optional[bool] = None,
            normalise: Callable[[str], str] = default_normalise, crossframework: Optional[bool] = None,
            mapping: Optional[os.PathLike | str] = None, rank_map: Optional[str] = None) -> CompareResult:
    """Compare two dumps and name the first call that diverged.

    ``golden``/``target``: a dump root (``step*/rank*``), a step folder, a rank folder or a
    dump.json; each step/rank pair is compared (several in parallel processes).
    ``rtol``/``atol`` override the dtype defaults; ``stats_only`` ignores tensor files.
    With ``output_dir``, writes compare.csv, summary.json and report.html there.
    ``verbose`` prints the terminal summary. Raises DumpFormatError for unreadable input.
    ``crossframework``: pair a PyTorch dump with a MindSpore one through the torch<->MindSpore
    mapping (``mapping``: its yaml file, default ``torch_mapping.yaml``); ``None`` decides from
    the dumps' ``framework`` fields, ``False`` never maps.
    A 1-rank golden against an N-rank target (a single-device run against its DDP, FSDP2 or TP
    twin) is compared through rank layouts (layouts.py); ``rank_map`` (``same``, ``split`` or
    target ranks ``0,1``) overrides the layout decided from the data.
    """
    opts = Options(rtol=rtol, atol=atol, stats_only=stats_only, equal_nan=equal_nan, normalise=normalise,
                   crossframework=crossframework, mapping=str(mapping) if mapping is not None else None)
    g_units, t_units = find_dumps(golden), find_dumps(target)
    pairs, lone_g, lone_t = pair_units(g_units, t_units)
    views = layout = None
    if rank_map and not layouts.applies_either_way(g_units, t_units):
        raise DumpFormatError(f"--rank-map {rank_map}: applies to a 1-rank dump against a many-rank one; "
                              f"{golden} has {_labels(g_units)}, {target} has {_labels(t_units)}")
    if rank_map or (not pairs and layouts.applies_either_way(g_units, t_units)):
        views = tempfile.TemporaryDirectory(prefix="tsprobe-layout-") if output_dir is None else None
        layout = layouts.plan(g_units, t_units, Path(views.name if views else Path(output_dir) / "layout_views"),
                              rank_map)
        layout.text.extend("  replicas " + line for line in replicas_text(check_units(layout.many)).splitlines())
        pairs, lone_g, lone_t = layout.pairs, [], []
    if not pairs:
        for unit in lone_g + lone_t:    # a file that is no dump says so, not "nothing matches"
            Dump(unit)
        raise DumpFormatError(f"nothing to compare: no step/rank of {golden} ({_labels(lone_g)}) matches one "
                              f"of {target} ({_labels(lone_t)})")
    results = run_units(pairs, opts, workers, progress)
    tolerances = {k: v.to_dict() for k, v in DEFAULT_TOLERANCES.items()}
    overrides = {k: v for k, v in (("rtol", rtol), ("atol", atol)) if v is not None}
    if overrides:
        tolerances["overrides"] = overrides
    result = CompareResult(
        golden=str(golden), target=str(target), pairs=results,
        unpaired_golden=[str(u.json_path) for u in lone_g], unpaired_target=[str(u.json_path) for u in lone_t],
        tolerances=tolerances,
        options={"stats_only": stats_only, "equal_nan": equal_nan,
                 "normalise": getattr(normalise, "__name__", str(normalise)),
                 "crossframework": crossframework, "mapping": opts.mapping})
    if layout is not None:          # a view stands for its target rank
        for p, units in zip(results, pairs):
            p.rank = units[layout.view_side].rank
            for row in p.rows:
                row.rank = p.rank
    if len({p.rank for p in results}) > 1:      # many ranks: one merged summary over them
        result.ranks = rank_summary(result)
    if layout is not None:
        result.options["layout"] = {"rule": layout.rule, "values": layout.counts,
                                    "text": layout.text + attribute(result, layout.view_side)}
        if views is not None:
            views.cleanup()
    if output_dir is not None:
        write_outputs(result, Path(output_dir), html=html)
    if verbose:
        print(terminal_text(result), file=sys.stdout)
        if layout is not None:
            print("\n".join(result.options["layout"]["text"]), file=sys.stdout)
    return result


def _labels(units) -> str:
    return ", ".join(u.label for u in units)


def write_outputs(result: CompareResult, out: Path, html: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result.output_dir = str(out)
    result.files = {"csv": str(out / "compare.csv"), "summary": str(out / "summary.json")}
    if html:
        result.report_path = result.files["html"] = str(out / "report.html")
    if result.ranks.get("steps"):
        result.files["ranks"] = str(out / RANKS_JSON)
    write_csv(result.rows, out / "compare.csv", [p.first_divergence for p in result.pairs])
    if html:
        write_html(result, out / "report.html")
    write_summary(result, out / "summary.json")
    if result.ranks.get("steps"):
        write_json_atomic(out / RANKS_JSON, result.ranks)


__all__ = ["compare", "write_outputs"]
