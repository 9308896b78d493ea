"""``tsprobe compare --executor dask`` on real Dask clusters: a LocalCluster of 2 worker
processes, and a cluster started here from the ``dask scheduler`` / ``dask worker`` commands
(separate processes on localhost). A 64-rank x 2-step dump written through tsprobe's own writer
(rank_dumps.py) is compared on each and the outputs are checked byte for byte against the
local executor's (one process). A worker that kills itself in the middle of a unit (the test-only
hook executor.KILL_ONCE_ENV, first run only) is replaced and its unit re-run: the result is still
complete. A corrupt rank is reported for that rank while the others complete. Statistics first
is checked against the bytes of the tensors whose checksums differ, counted from the files."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ts_core.cli import main
from ts_core.compare import compare
from ts_core.compare.pipeline import Options
from ts_core.compare.executor import KILL_ONCE_ENV, run_pairs
from ts_core.compare.load.loader import find_dumps, pair_units
from ts_core.compare.judge.verdict import ERROR

from tests.compare.rank_dumps import write_dumps

distributed = pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = ("compare.csv", "summary.json", "ranks.json", "report.html")
RANKS, STEPS = 64, 2


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    return write_dumps(str(tmp_path_factory.mktemp("ranks")), RANKS, STEPS, layers=2)


def _outputs(out: Path) -> dict:
    return {name: (out / name).read_bytes() for name in OUTPUTS if (out / name).exists()}


def _local(golden, target, out: Path, **kw) -> dict:
    """The outputs of the local executor in one process (what every executor must give)."""
    compare(golden, target, out, workers=1, verbose=False, **kw)
    got = _outputs(out)
    shutil.rmtree(out)          # the same folder for the run under test: paths in summary.json agree
    return got


@pytest.fixture(scope="module")
def cli_cluster(tmp_path_factory):
    """A scheduler and a 2-process worker started from the dask commands. Unit step1/rank7/chunk1
    kills its worker the first time it runs (only a chunked compare has that unit)."""
    work = tmp_path_factory.mktemp("cluster")
    sched_file, marker = work / "scheduler.json", work / "killed"
    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([dask, "scheduler", "--scheduler-file", str(sched_file), "--host", "127.0.0.1",
                               "--port", "0", "--dashboard-address", ":0"], env=env, cwd=work,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    procs.append(subprocess.Popen([dask, "worker", "--scheduler-file", str(sched_file), "--nworkers", "2",
                                   "--nthreads", "1", "--no-dashboard", "--local-directory", str(work)],
                                  env=dict(env, **{KILL_ONCE_ENV: f"step1/rank7/chunk1@{marker}"}), cwd=work,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        with distributed.Client(scheduler_file=str(sched_file), timeout="60s") as client:  # waits for the file
            client.wait_for_workers(2, timeout=120)
        yield sched_file, marker
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=60)


def test_local_cluster_gives_the_local_outputs_byte_for_byte(dumps, tmp_path, capsys):
    golden, target = dumps
    out = tmp_path / "out"
    want = _local(golden, target, out, stats_first=True)
    result = compare(golden, target, out, executor="dask", workers=2, verbose=False, stats_first=True,
                     progress=True)
    assert _outputs(out) == want
    assert f"compare (dask) [{'#' * 30}] {RANKS * STEPS}/{RANKS * STEPS}" in capsys.readouterr().err
    assert len(result.pairs) == RANKS * STEPS
    fd = result.ranks["steps"][1]
    assert fd["diverged_first"] == [f"rank{RANKS // 2}"]        # the perturbed rank, found on the cluster
    assert result.first_divergence.key == "Functional.linear.1.forward"


def test_scheduler_file_cluster_from_the_dask_commands(dumps, cli_cluster, tmp_path, capsys):
    golden, target = dumps
    sched_file, marker = cli_cluster
    out = tmp_path / "out"
    want = _local(golden, target, out)
    assert main(["compare", golden, target, "-o", str(out), "--executor", "dask", "--scheduler-file",
                 str(sched_file)]) == 1              # the planted divergence: exit status 1
    assert _outputs(out) == want
    assert not marker.exists()          # no chunk units: the kill hook did not fire


def test_a_worker_lost_mid_compare_still_gives_the_full_result(dumps, cli_cluster, tmp_path):
    """Step 1 in chunked units (2 per pair + a finish unit); chunk 1 of step1/rank7 kills its
    worker process the first time: the nanny restarts it, the scheduler runs the unit again."""
    golden, target = (f"{d}/step1" for d in dumps)
    sched_file, marker = cli_cluster
    out = tmp_path / "out"
    want = _local(golden, target, out)
    with open(sched_file) as f:
        address = json.load(f)["address"]
    result = compare(golden, target, out, executor="dask", scheduler=address, chunks=2, verbose=False)
    assert marker.exists()              # the worker did die in the middle of the compare
    assert _outputs(out) == want        # and every unit's result is there, as in one process
    assert len(result.pairs) == RANKS and all(p.rows for p in result.pairs)


def test_a_corrupt_rank_is_reported_and_the_rest_completes(tmp_path, cli_cluster):
    golden, target = write_dumps(str(tmp_path / "small"), 3, 1, layers=1)
    (Path(target) / "step0" / "rank1" / "dump.json").write_text('{"task": "tensor", "data": {"Functio')
    shutil.rmtree(Path(target) / "step0" / "rank2")
    out = tmp_path / "out"
    want = _local(golden, target, out)
    result = compare(golden, target, out, executor="dask", scheduler_file=str(cli_cluster[0]), verbose=False)
    assert _outputs(out) == want
    by_rank = {p.rank: p for p in result.pairs}
    assert sorted(by_rank) == ["rank0", "rank1"]
    bad = by_rank["rank1"]
    assert [r.verdict for r in bad.rows] == [ERROR] and "not valid JSON" in bad.rows[0].reason
    assert "rank1/dump.json" in bad.note
    assert by_rank["rank0"].counts["matched"] == 2 and by_rank["rank0"].rows
    assert result.unpaired_golden == [str(Path(golden) / "step0" / "rank2" / "dump.json")]


def test_statistics_first_reads_only_the_tensors_whose_checksums_differ(dumps):
    """Bytes read, counted by the loader, against the bytes of the tensor files whose recorded
    crc32 differs between the dumps (read off dump.json and the .npy files here); the verdicts
    and first divergences are those of the full read."""
    golden, target = (f"{d}/step1" for d in dumps)
    pairs, _, _ = pair_units(find_dumps(golden), find_dumps(target))
    full, first = [], []
    want_rows = run_pairs(pairs, Options(), workers=1, outcomes=full)
    got_rows = run_pairs(pairs, Options(stats_first=True), workers=1, outcomes=first)
    differ = dumped = 0
    for g, t in pairs:
        gd, td = (json.loads(u.json_path.read_text())["data"] for u in (g, t))
        for key, rec in gd.items():
            for part in ("input_args", "output"):
                for gs, ts in zip(rec[part], td[key][part]):
                    size = sum(np.load(u.dir / "dump_tensor_data" / s["data_name"]).nbytes
                               for u, s in ((g, gs), (t, ts)))
                    dumped += size
                    differ += size if gs["md5"] != ts["md5"] else 0
    # the diagnosis of a first divergence reads its tensors again, in both runs alike
    again = sum(o.bytes_read for o in full) - dumped
    assert again >= 0
    assert sum(o.bytes_read for o in first) == differ + again
    assert 0 < differ < dumped / 4
    for w, g in zip(want_rows, got_rows):
        assert [r.verdict for r in w.rows] == [r.verdict for r in g.rows]
        assert (w.first_divergence and w.first_divergence.key) == (g.first_divergence and g.first_divergence.key)


def test_a_plain_compare_needs_no_dask(dumps, tmp_path):
    golden, target = dumps
    code = ("import sys, ts_core; from ts_core.compare import compare; "
            f"compare({golden + '/step0'!r}, {target + '/step0'!r}, {str(tmp_path / 'o')!r}, verbose=False); "
            "assert not {'dask', 'distributed'} & set(sys.modules), sorted(m for m in sys.modules if 'dask' in m)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_cluster_flags_without_the_dask_executor_are_refused(dumps, capsys):
    golden, target = dumps
    assert main(["compare", golden, target, "--scheduler", "tcp://127.0.0.1:1"]) == 2
    assert "add --executor dask" in capsys.readouterr().err
    assert main(["compare", golden, target, "--executor", "dask", "--chunks", "0"]) == 2
