"""``compare(golden, target, output_dir)``: the entry point behind ``tsprobe compare``."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Optional

from ..dumpfmt import write_json_atomic, write_text_atomic
from .align import global_views, layouts
from .align.matching import default_normalise
from .errors import DumpFormatError
from .executor import run_pairs
from .explain.attribution import attribute
from .explain.precedence import conclude
from .explain.ranks import rank_summary
from .judge.tolerances import DEFAULT_TOLERANCES
from .load.loader import Dump, find_dumps, pair_units
from .model import CompareResult
from .pipeline import Options
from .report.files import write_csv, write_summary
from .report.html import write_html
from .report.merge import MERGED_CSV, SUMMARY_JSON, merged_table
from .report.text import terminal_text


RANKS_JSON = "ranks.json"


def compare(golden: os.PathLike | str, target: os.PathLike | str, output_dir: Optional[os.PathLike | str] = None,
            *, rtol: Optional[float] = None, atol: Optional[float] = None, stats_only: bool = False,
            equal_nan: bool = True, workers: Optional[int] = None, html: bool = True,
            verbose: bool = True, progress: Optional[bool] = None,
            normalise: Callable[[str], str] = default_normalise, crossframework: Optional[bool] = None,
            mapping: Optional[os.PathLike | str] = None, rank_map: Optional[str] = None,
            stats_first: bool = False, executor: str = "local", scheduler: Optional[str] = None,
            scheduler_file: Optional[str] = None, chunks: int = 1,

            golden_rerun: Optional[os.PathLike | str] = None,
            target_rerun: Optional[os.PathLike | str] = None) -> CompareResult:
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
    ``stats_first``: read tensor files only where the recorded summaries differ (judge/statsfirst.py).
    ``executor``: where the units (step, rank, chunk) run: ``local`` (``workers`` processes) or
    ``dask`` (a LocalCluster of ``workers``, or the cluster at ``scheduler``/``scheduler_file``);
    ``chunks``: units per step/rank pair. The outputs do not depend on either (executor.py).
    ``golden_rerun``/``target_rerun``: a second dump of the same side (the same program run
    again); the side is compared with it and the diagnosis says whether the first divergence
    is nondeterminism (explain/rerun.py).
    """
    opts = Options(rtol=rtol, atol=atol, stats_only=stats_only, equal_nan=equal_nan, normalise=normalise,
                   crossframework=crossframework, mapping=str(mapping) if mapping is not None else None,
                   stats_first=stats_first)
    g_units, t_units = find_dumps(golden), find_dumps(target)
    pairs, lone_g, lone_t = pair_units(g_units, t_units)
    views = layout = None
    many = global_views.applies(g_units, t_units)
    if rank_map and not (layouts.applies_either_way(g_units, t_units) or many):
        raise DumpFormatError(f"--rank-map {rank_map}: applies to a 1-rank dump against a many-rank one, or N "
                              f"ranks against M; {golden} has {_labels(g_units)}, {target} has {_labels(t_units)}")
    planner = None
    if many and (rank_map or global_views.differ(g_units, t_units)):      # N ranks against M: global views
        planner = global_views.plan
    elif rank_map or (not pairs and layouts.applies_either_way(g_units, t_units)):    # 1 rank against a layout
        planner = layouts.plan
    if planner is not None:
        if output_dir is None:
            import tempfile

            views = tempfile.TemporaryDirectory(prefix="tsprobe-layout-")
        layout = planner(g_units, t_units, Path(views.name) if views else Path(output_dir) / "layout_views", rank_map)
        pairs, lone_g, lone_t = layout.pairs, [], []
    if not pairs:
        for unit in lone_g + lone_t:    # a file that is no dump says so, not "nothing matches"
            Dump(unit)
        raise DumpFormatError(f"nothing to compare: no step/rank of {golden} ({_labels(lone_g)}) matches one "
                              f"of {target} ({_labels(lone_t)})")
    outcomes: list = []
    results = run_pairs(pairs, opts, executor=executor, workers=workers, chunks=chunks, progress=progress,
                        scheduler=scheduler, scheduler_file=scheduler_file, outcomes=outcomes)
    tolerances = {k: v.to_dict() for k, v in DEFAULT_TOLERANCES.items()}
    overrides = {k: v for k, v in (("rtol", rtol), ("atol", atol)) if v is not None}
    if overrides:
        tolerances["overrides"] = overrides
    result = CompareResult(
        golden=str(golden), target=str(target), pairs=results,
        unpaired_golden=[str(u.json_path) for u in lone_g], unpaired_target=[str(u.json_path) for u in lone_t],
        tolerances=tolerances, unreadable=list(dict.fromkeys(o.error for o in outcomes if o.error)),
        options={"stats_only": stats_only, "equal_nan": equal_nan,
                 "normalise": getattr(normalise, "__name__", str(normalise)),
                 "crossframework": crossframework, "mapping": opts.mapping})
    if layout is not None:          # a view stands for its target rank
        for i, (p, units) in enumerate(zip(results, pairs)):
            p.rank = layout.labels[i] if layout.labels else units[layout.view_side].rank
            for row in p.rows:
                row.rank = p.rank
    if len({p.rank for p in results}) > 1:      # many ranks: one merged summary over them
        result.ranks = rank_summary(result)
    if layout is not None:
        result.options["layout"] = {"rule": layout.rule, "values": layout.counts,
                                    "text": layout.text + _replica_lines(layout)
                                    + attribute(result, layout)}
        if views is not None:
            views.cleanup()
    conclude(result)                # the first divergence and the headline, decided once
    for side, first, rerun in (("golden", golden, golden_rerun), ("target", target, target_rerun)):
        if rerun is not None:
            _check_rerun(result, side, compare(first, rerun, None, rtol=rtol, atol=atol, stats_only=stats_only,
                                               equal_nan=equal_nan, workers=workers, html=False, verbose=False,
                                               progress=progress, normalise=normalise))
    if output_dir is not None:
        write_outputs(result, Path(output_dir), html=html)
    if verbose:
        print(terminal_text(result), file=sys.stdout)
        if layout is not None:
            print("\n".join(result.options["layout"]["text"]), file=sys.stdout)
    return result


def _replica_lines(layout) -> list:
    """The replica check of the many-rank side(s) of a layout compare, as its text lines."""
    from .explain.replicas import check_units, replicas_text

    return [f"  replicas {label}{line}" for label, units in layout.replica_units
            for line in replicas_text(check_units(units)).splitlines()]


def _check_rerun(result: CompareResult, side: str, self_result: CompareResult) -> None:
    """Add what a side compared with its own rerun says to the diagnosis of the first divergence."""
    from .explain.diagnosis import add_rerun
    from .explain.rerun import nondeterminism

    fd = result.first_divergence
    pair = next((p for p in result.pairs if fd is not None and p.first_divergence is fd), None)
    if pair is not None:
        pair.diagnosis = add_rerun(pair.diagnosis, nondeterminism(side, self_result, fd))


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


def write_merged(result: CompareResult, out: os.PathLike | str, apis=None, index=None, html: bool = True) -> None:
    """``tsprobe merge``'s outputs: compare.csv, summary.json, ranks.json, report.html (as
    ``tsprobe compare -o``) and merged.csv (report/merge.py's table)."""
    out = Path(out)
    table = merged_table(result, apis, index)        # bad index names fail before anything is written
    write_outputs(result, out, html=html)
    write_text_atomic(out / MERGED_CSV, table)
    result.files["merged"] = str(out / MERGED_CSV)
    write_summary(result, out / SUMMARY_JSON)


__all__ = ["compare", "write_outputs", "write_merged"]
