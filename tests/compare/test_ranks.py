"""Many ranks: real gloo runs on 2-4 CPU processes, one rank with a faulty kernel; compare of
all ranks at once and merge of per-rank results name each rank's first divergence, the rank
that diverged first and the all_reduce that carried its difference to the others."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ts_core.compare import compare

from tests.integrations._helpers import python, run

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dump(tmp_path, name: str, world: int, bad: int) -> str:
    root = str(tmp_path / name)
    if os.path.isdir(root):
        return root
    run([python(), os.path.join(ROOT, "tests", "compare", "ranks_worker.py"), root, str(world), str(bad)], timeout=180,
        cwd=ROOT, env_extra={"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert sorted(os.listdir(os.path.join(root, "step0"))) == [f"rank{r}" for r in range(world)]
    return root


def check_summary(step: dict, world: int, bad: int) -> None:
    others = [f"rank{r}" for r in range(world) if r != bad]
    assert step["diverged_first"] == [f"rank{bad}"]
    ranks = {r["rank"]: r for r in step["ranks"]}
    fd = ranks[f"rank{bad}"]["first_divergence"]
    assert fd["key"] == "Functional.linear.0.forward" and fd["collectives_before"] == 0
    assert "many_ranks_recipe.py" in fd["source"] and "fc1(x)" in fd["source"]
    for r in others:       # the others compute fine until the all_reduce mixes rank `bad`'s data in
        assert ranks[r]["first_divergence"]["collectives_before"] == 1
    link = step["collectives"][0]
    assert link["key"] == "Distributed.all_reduce.0.forward"
    assert link["inputs_differ_on"] == [f"rank{bad}"] and link["reached"] == others
    assert {r: v["input"] for r, v in link["ranks"].items()} == {f"rank{r}": ("error" if r == bad else "pass")
                                                                for r in range(world)}
    assert f"rank{bad} diverged first: Functional.linear.0.forward (before any collective)" in step["explanation"]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """Golden and target runs per world size, made once for the module (each run spawns WORLD
    processes that import torch)."""
    base = tmp_path_factory.mktemp("ranks")
    return lambda world, bad: (dump(base, f"golden{world}", world, -1), dump(base, f"target{world}_{bad}", world, bad))


@pytest.mark.parametrize("world,bad", [(2, 1), (4, 2)])
def test_compare_many_ranks(tmp_path, dumps, world, bad):
    golden, target = dumps(world, bad)
    out = tmp_path / "out"
    result = compare(golden, target, str(out), verbose=False, workers=2)
    assert [p.rank for p in result.pairs] == [f"rank{r}" for r in range(world)]
    check_summary(result.ranks["steps"][0], world, bad)
    saved = json.loads((out / "ranks.json").read_text())
    assert saved == json.loads(json.dumps(result.ranks))
    assert json.loads((out / "summary.json").read_text())["ranks"] == saved
    assert "diverged first" in str(result)                   # the terminal summary says it too


def test_merge_per_rank_results(tmp_path, dumps):
    world, bad = 4, 2
    golden, target = dumps(world, bad)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for r in range(world):            # one compare per rank, as on separate nodes
        done = subprocess.run([sys.executable, "-m", "ts_core.cli", "compare", os.path.join(golden, "step0", f"rank{r}"),
                               os.path.join(target, "step0", f"rank{r}"), "-o", str(tmp_path / "per" / f"rank{r}"),
                               "--no-html"], capture_output=True, cwd=ROOT, env=env, timeout=120)
        assert done.returncode in (0, 1), done.stderr      # 1: this rank diverged
    p = subprocess.run([sys.executable, "-m", "ts_core.cli", "merge", str(tmp_path / "per"), "-o",
                        str(tmp_path / "merged"), "--api", "Distributed.all_reduce", "--index", "MaxRelativeErr",
                        "verdict"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "rank2 diverged first" in p.stdout
    merged = json.loads((tmp_path / "merged" / "ranks.json").read_text())
    check_summary(merged["steps"][0], world, bad)
    lines = (tmp_path / "merged" / "merged.csv").read_text().splitlines()
    assert lines[0] == "step,name," + ",".join(f"rank{r}.{c}" for r in range(world) for c in ("max_rel_diff", "verdict")) \
        or lines[0] == "step,name," + ",".join(f"rank{r}.{c}" for r in range(world) for c in ("max_rel_err", "verdict"))
    first = next(ln for ln in lines if ln.startswith("0,Distributed.all_reduce.0.forward.input.0,"))
    cells = first.split(",")[2:]
    assert cells[1::2] == ["error" if r == bad else "pass" for r in range(world)]
    assert float(cells[2 * bad]) > 1e-3 and float(cells[0]) == 0.0    # rank2's all_reduce input is 1% off
    # a rank merged twice is refused; a folder without results is named
    dup = subprocess.run([sys.executable, "-m", "ts_core.cli", "merge", str(tmp_path / "per"), str(tmp_path / "per" / "rank1"),
                          "-o", str(tmp_path / "m2")], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert dup.returncode == 2 and "merge each rank's result once" in dup.stderr
    empty = subprocess.run([sys.executable, "-m", "ts_core.cli", "merge", golden, "-o",
                            str(tmp_path / "m3")], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert empty.returncode == 2 and "holds no compare result" in empty.stderr


def test_clean_ranks(dumps):
    golden, _ = dumps(2, 1)
    result = compare(golden, golden, verbose=False)     # a run against itself (seeded runs are bit-identical)
    step = result.ranks["steps"][0]
    assert step["diverged_first"] == [] and step["explanation"] == "no rank diverged"
    assert all(r["first_divergence"] is None for r in step["ranks"])
