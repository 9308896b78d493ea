"""Compare at scale: throughput and peak memory per worker against workers and ranks, on the
local process pool and on a Dask cluster, with the statistics-first saving.

Writes two synthetic many-rank tensor dumps through tsprobe's writer (tests/compare/rank_dumps.py:
a layer stack per rank, target bit-equal except one perturbed rank and float32 noise on every
rank's all_reduce output, crc32 recorded), then for each rank count, executor and worker count
times the compare's units (``executor.run_pairs``; a Dask cluster is started once per worker
count and timed apart) with and without ``stats_first``, and the driver's serial part (the
many-rank summary and the output files) on the same results. Reports, per run: wall time,
tensor MB read and MB/s of dump compared, the peak RSS of each worker process, and the
per-unit cost the projection to N machines uses. Each configuration runs ``--repeat`` times and
the fastest run is kept (the machine is shared); the peak RSS is the worker process's maximum
so far (workers are reused across the runs of one worker count).

    python benchmarks/compare_scale.py [--ranks 16,64] [--workers 1,2] [--width 256] [--repeat 2] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.compare.rank_dumps import write_dumps  # noqa: E402
from ts_core.compare import CompareResult, write_outputs  # noqa: E402
from ts_core.compare.pipeline import Options  # noqa: E402
from ts_core.compare.executor import Outcome, run_pairs  # noqa: E402
from ts_core.compare.load.loader import find_dumps, pair_units  # noqa: E402
from ts_core.compare.explain.precedence import conclude  # noqa: E402
from ts_core.compare.explain.ranks import rank_summary  # noqa: E402


def dump_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)


def tensor_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files
               if f.endswith(".npy"))


def run(pairs, opts: Options, executor: str, workers: int, scheduler=None) -> dict:
    outcomes: List[Outcome] = []
    t0 = time.perf_counter()
    results = run_pairs(pairs, opts, executor=executor, workers=workers, scheduler=scheduler, outcomes=outcomes)
    units = time.perf_counter() - t0
    rss: Dict[str, float] = defaultdict(float)
    for o in outcomes:
        rss[o.worker] = max(rss[o.worker], o.peak_rss_mb)
    out = tempfile.mkdtemp(prefix="tscmp_scale_out_")
    t0 = time.perf_counter()
    result = CompareResult(golden="g", target="t", pairs=results, unpaired_golden=[], unpaired_target=[],
                           tolerances={}, options={})
    result.ranks = rank_summary(result)
    conclude(result)
    write_outputs(result, Path(out))
    driver = time.perf_counter() - t0
    shutil.rmtree(out)
    return {"units_s": units, "driver_s": driver, "bytes_read": sum(o.bytes_read for o in outcomes),
            "unit_cpu_s": sum(o.seconds for o in outcomes), "workers_seen": len(rss),
            "peak_rss_mb_per_worker": round(max(rss.values()), 1),
            "first_divergence_ranks": sorted({p.rank for p in results if p.first_divergence})[:3]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="16,64")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--width", type=int, default=256, help="layer width (weights width^2 float32)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--executors", default="local,dask")
    p.add_argument("--repeat", type=int, default=2, help="runs of each configuration (the fastest is kept)")
    p.add_argument("--json", help="write the measurements here")
    args = p.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    executors = args.executors.split(",")
    work = tempfile.mkdtemp(prefix="tscmp_scale_")
    rows = []
    try:
        dumps = {}
        for n in ranks:
            t0 = time.perf_counter()
            g, t = write_dumps(os.path.join(work, f"r{n}"), n, 1, layers=args.layers, width=args.width,
                               batch=args.batch)
            dumps[n] = (g, t, pair_units(find_dumps(g), find_dumps(t))[0])
            print(f"wrote {n} ranks x 2 dumps ({(dump_bytes(g) + dump_bytes(t)) / 2**20:.0f} MB) in "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
        for executor in executors:
            for w in workers:
                cluster, scheduler, startup = None, None, 0.0
                if executor == "dask":
                    import distributed
                    t0 = time.perf_counter()
                    cluster = distributed.LocalCluster(n_workers=w, threads_per_worker=1, processes=True,
                                                       dashboard_address=None, silence_logs=logging.ERROR)
                    scheduler, startup = cluster.scheduler_address, time.perf_counter() - t0
                try:
                    for n in ranks:
                        g, t, pairs = dumps[n]
                        for stats_first in (False, True):
                            runs = [run(pairs, Options(stats_first=stats_first), executor, w, scheduler)
                                    for _ in range(args.repeat)]
                            m = min(runs, key=lambda r: r["units_s"])      # the least disturbed run
                            m["driver_s"] = min(r["driver_s"] for r in runs)
                            m.update(executor=executor, workers=w, ranks=n, stats_first=stats_first,
                                     cluster_start_s=startup, dump_bytes=dump_bytes(g) + dump_bytes(t),
                                     tensor_bytes=tensor_bytes(g) + tensor_bytes(t))
                            rows.append(m)
                            print(_line(m), file=sys.stderr)
                finally:
                    if cluster is not None:
                        cluster.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    print()
    print(projection(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def _line(m: dict) -> str:
    return (f"{m['executor']:<5} w={m['workers']} ranks={m['ranks']:<3} stats_first={m['stats_first']!s:<5} "
            f"units {m['units_s']:.2f} s, driver {m['driver_s']:.2f} s, read {m['bytes_read'] / 2**20:.1f} of "
            f"{m['tensor_bytes'] / 2**20:.1f} MB, peak RSS/worker {m['peak_rss_mb_per_worker']:.0f} MB")


def table(rows: List[dict]) -> str:
    out = ["| executor | workers | ranks | stats first | units wall s | dump MB/s | tensor MB read / in dumps "
           "| peak RSS per worker MB | driver s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for m in rows:
        out.append(f"| {m['executor']} | {m['workers']} | {m['ranks']} | {'yes' if m['stats_first'] else 'no'} | "
                   f"{m['units_s']:.2f} | {m['dump_bytes'] / 2**20 / m['units_s']:.0f} | "
                   f"{m['bytes_read'] / 2**20:.1f} / {m['tensor_bytes'] / 2**20:.1f} "
                   f"({100 * m['bytes_read'] / m['tensor_bytes']:.1f}%) | {m['peak_rss_mb_per_worker']:.0f} | "
                   f"{m['driver_s']:.2f} |")
    return "\n".join(out)


def projection(rows: List[dict]) -> str:
    """Per unit: worker seconds per MB of dump (full read) and per rank (statistics first), from
    the largest rank count on one Dask worker; the driver's seconds per rank."""
    dask1 = [m for m in rows if m["executor"] == "dask" and m["workers"] == 1]
    base = dask1 or [m for m in rows if m["workers"] == 1]
    if not base:
        return ""
    n = max(m["ranks"] for m in base)
    full = next(m for m in base if m["ranks"] == n and not m["stats_first"])
    first = next(m for m in base if m["ranks"] == n and m["stats_first"])
    per_mb = full["unit_cpu_s"] / (full["dump_bytes"] / 2**20)
    per_rank_sf = first["unit_cpu_s"] / n
    overhead = (full["units_s"] - full["unit_cpu_s"]) / n       # scheduling + transfer per unit
    driver = full["driver_s"] / n
    return (f"per unit on one worker ({full['executor']}, {n} ranks): {1 / per_mb:.0f} MB/s of dump with every "
            f"tensor read; {per_rank_sf * 1000:.1f} ms per rank with statistics first; scheduling and result "
            f"transfer {overhead * 1000:.1f} ms per unit; driver (many-rank summary + outputs) {driver * 1000:.1f} "
            f"ms per rank")


if __name__ == "__main__":
    main()
