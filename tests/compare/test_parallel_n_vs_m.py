"""N ranks against M of another parallel layout (DDP on 2 vs TP on 2, FSDP2 vs TP, DDP on 2 vs
DDP on 4 or a 2-D mesh on 4), a 2-D mesh with tensor parallelism on the OUTER mesh dimension
(non-contiguous TP groups), and task tensor: a sharded value's global tensor assembled from the
shards and the rank holding a bad shard named. Real gloo jobs (tests/distributed/stack_worker.py,
the same tiny LM and one global batch of 16 rows per step split over each job's data-parallel
ranks); the shard placement rules are checked against torch's own splitting, the assembled
tensors against numpy of the ranks' files."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ts_core.compare import compare
from ts_core.compare.align.layouts import SPLIT, build_view, job_partitions
from ts_core.dumpfmt.shards import submesh_groups
from ts_core.compare.explain.replicas import check_replicas
from ts_core.compare.align.shard_tensors import chunk_bounds, shard_index
from ts_core.compare.judge.verdict import ERROR
from ts_core.dumpfmt import reference_stats

from tests.integrations._helpers import RECIPES, ROOT, free_port, python, run

WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "distributed", "stack_worker.py")


# ---------------------------------------------------------------- placement rules, against torch

@pytest.mark.parametrize("n,k", [(25, 2), (5, 4), (6, 4), (32, 2), (7, 3)])
def test_chunk_bounds_are_torch_chunks(n, k):
    torch = pytest.importorskip("torch")
    from torch.distributed.tensor.placement_types import Shard

    pieces = Shard._custom_chunk(torch.arange(n), k, dim=0)
    assert [list(range(a, b)) for a, b in chunk_bounds(n, k)] == [p.tolist() for p in pieces]


@pytest.mark.parametrize("rows,sf,m", [(8, 2, 2), (25, 2, 2), (13, 3, 2)])
def test_strided_shard_index_is_torchs_split(rows, sf, m):
    """FSDP2 over TP: StridedShard(0, sf) on the dp dim then Shard(0) on tp -- each coordinate's
    indices are the rows torch's own _StridedShard/Shard splitting gives that coordinate."""
    torch = pytest.importorskip("torch")
    from torch.distributed.tensor.placement_types import Shard, _StridedShard

    full = torch.arange(rows)
    strided = _StridedShard(0, split_factor=sf)._split_tensor(full, m, with_padding=False)[0]
    for dp in range(m):
        tp_parts = Shard._custom_chunk(strided[dp], sf, dim=0)
        for tp in range(sf):
            idx = shard_index([rows], [f"StridedShard(0, sf={sf})", "Shard(0)"], [m, sf], [dp, tp])
            assert idx[0].tolist() == tp_parts[tp].tolist()


def test_submesh_groups_are_read_from_the_recorded_mesh():
    """Groups {0, 3} and {1, 2}: the coordinates alone (0, 0, 1, 1) would suggest {0, 2}, {1, 3};
    the recorded mesh_ranks say otherwise, and a Replicate() value equal within each true group
    is merged per group and its replicas are equal."""
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    groups = {0: ([0, 3], 0, a), 3: ([0, 3], 1, a), 1: ([1, 2], 0, b), 2: ([1, 2], 1, b)}

    def leaf(r):
        ranks, coord, x = groups[r]
        f = x.astype(np.float64)
        return {"type": "torch.Tensor", "dtype": "torch.float64", "shape": list(x.shape), **reference_stats(x),
                "dtensor": {"global_shape": list(x.shape), "placements": ["Replicate()"], "mesh_shape": [2],
                            "mesh_dim_names": ["tp"], "coordinate": [coord], "mesh_ranks": ranks,
                            "local": {"count": x.size, "sum": float(f.sum()), "sum_sq": float((f * f).sum()),
                                      "max": float(f.max()), "min": float(f.min()), "nan": 0, "inf": 0}}}
    leaves = [leaf(r) for r in range(4)]
    assert submesh_groups(leaves) == [[0, 3], [1, 2]]
    datas = [{"Functional.f.0.forward": {"input_args": [leaves[r]]}} for r in range(4)]
    assert job_partitions(datas) == [[[0, 3], [1, 2]]]
    golden = {"Functional.f.0.forward": {"input_args": [{"shape": [8, 6]}]}}
    whole = np.concatenate([a, b])
    for r in range(4):
        view, counts = build_view(golden, datas, r, SPLIT, shards=2, partitions=job_partitions(datas))
        got = view["Functional.f.0.forward"]["input_args"][0]
        want = reference_stats(whole)
        assert got["shape"] == [8, 6] and got["Max"] == want["Max"] and got["Min"] == want["Min"]
        assert got["Mean"] == pytest.approx(want["Mean"], rel=1e-12, abs=1e-15)
        assert counts == {"DTensor merged (sub-mesh) + tiles merged (dim 0)": 1}


def test_tiles_find_their_shape_when_the_call_counters_shift():
    """The parallel run made one extra linear call first (its counters run one ahead): the tiles of
    its Functional.linear.1 take the single run's Functional.linear.0 shape, merged exactly; a
    value no nearby call's shape fits stays the rank's own (a shape difference, never a pass)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    plain = lambda a: {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(a.shape), **reference_stats(a)}
    golden = {"Functional.linear.0.forward": {"output": [plain(x)]}}
    datas = [{"Functional.linear.0.forward": {"output": [plain(np.ones((2, 2), np.float32))]},
              "Functional.linear.1.forward": {"output": [plain(x[4 * r:4 * r + 4])]},
              "Functional.relu.0.forward": {"output": [plain(x[4 * r:4 * r + 4] * (r + 1))]}} for r in range(2)]
    view, counts = build_view(golden, datas, 0, SPLIT)
    got, want = view["Functional.linear.1.forward"]["output"][0], reference_stats(x)
    assert got["shape"] == [8, 4] and got["Max"] == want["Max"] and got["Min"] == want["Min"]
    assert got["Norm"] == pytest.approx(want["Norm"], rel=1e-12)
    assert counts["tiles merged (dim 0) (shape of a shifted call)"] == 1
    assert view["Functional.relu.0.forward"]["output"][0]["shape"] == [4, 4]      # no relu in the single run


# ---------------------------------------------------------------- real gloo jobs

STATS, TENSOR = "mix-statistics", "mix-tensor"
JOBS = {  # name -> (processes, worker arguments); one global batch of 4 x 4 rows per step
    "single": (1, ["--stack", "single"]),
    "ddp2": (2, ["--stack", "ddp"]),
    "ddp4": (4, ["--stack", "ddp"]),
    "tp2": (2, ["--stack", "tp"]),
    "fsdp2": (2, ["--stack", "fsdp2"]),
    "tpo": (4, ["--stack", "2d-tpouter"]),       # mesh (tp 2, dp 2): TP groups {0, 2} and {1, 3}
    "2d": (4, ["--stack", "2d"]),                # FSDP2 (dp 2) over TP (2): mesh (dp, tp), TP groups {0, 1}, {2, 3}
    "ddp2-bug": (2, ["--stack", "ddp", "--bug", "1:blocks.0.up.weight"]),
    "tp2-bug": (2, ["--stack", "tp", "--bug", "1:blocks.0.up.weight"]),
}
RUNS = {name: "mix:statistics,mix:tensor" for name in ("single", "tp2", "ddp2", "tp2-bug", "tpo")}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """(name, run) -> dump root, each job launched once when a test first needs it."""
    root = tmp_path_factory.mktemp("n_vs_m")
    made = set()

    def get(name: str, which: str = STATS) -> str:
        if name not in made:
            nproc, args = JOBS[name]
            head = [python()] if nproc == 1 else [python(), "-m", "torch.distributed.run", "--nproc_per_node",
                                                  str(nproc), "--master_port", str(free_port())]
            run(head + [WORKER, *args, "--global-batch", "4", "--runs", RUNS.get(name, "mix:statistics"),
                        "--dump-root", str(root / name), "--report", str(root / f"{name}.json")],
                timeout=300, cwd=str(root), env_extra={"PYTHONPATH": ROOT})
            made.add(name)
        return str(root / name / which)
    return get


def _compare(golden: str, target: str, tmp_path, **kw):
    return compare(golden, target, tmp_path / "out", html=False, verbose=False, workers=1, **kw)


def _errors(result):
    return [(r.rank, r.name, r.reason) for r in result.rows if r.verdict == ERROR]


@pytest.mark.slow
@pytest.mark.parametrize("golden,target", [("ddp2", "tp2"), ("fsdp2", "tp2"), ("ddp2", "ddp4"), ("ddp2", "tpo"),
                                           ("ddp4", "fsdp2"), ("tpo", "2d")])
def test_faithful_n_vs_m_pairs_give_no_divergence(dumps, tmp_path, golden, target):
    result = _compare(dumps(golden), dumps(target), tmp_path)
    layout = result.options["layout"]
    n, m = JOBS[golden][0], JOBS[target][0]
    assert layout["text"][0].startswith(f"layout: {n} ranks against {m}, both reduced to the global")
    assert _errors(result) == [] and result.first_divergence is None
    assert len(result.pairs) == 2 * max(n, m)        # every rank of each side, both steps
    assert all("no divergence on any rank pair" in line for line in layout["text"] if line.startswith("step"))
    with open(tmp_path / "out" / "summary.json") as f:
        assert json.load(f)["options"]["layout"]["rule"] == layout["rule"]


@pytest.mark.slow
def test_a_bug_on_one_rank_is_named_at_its_op_and_side_rank(dumps, tmp_path):
    """rank1 of the DDP job holds a perturbed weight: named as the target's (or golden's) rank1
    at the first linear, against TP on 2 ranks and against DDP on 4."""
    for golden, target, side in (("tp2", "ddp2-bug", "target"), ("ddp2-bug", "tp2", "golden"),
                                 ("ddp4", "ddp2-bug", "target")):
        result = _compare(dumps(golden), dumps(target), tmp_path / golden)
        fd = result.first_divergence
        assert fd is not None and fd.key == "Functional.linear.0.forward"
        assert f"step 0: first divergence Functional.linear.0.forward on {side} rank1 (" \
            "Functional.linear.0.forward.input.1, that rank's own value" in "\n".join(result.options["layout"]["text"])


@pytest.mark.slow
def test_rank_map_global_and_bad_specs(dumps, tmp_path):
    """Two dumps of one layout are compared rank by rank; --rank-map global reduces them too."""
    plain = _compare(dumps("tp2"), dumps("tp2-bug"), tmp_path / "plain")
    assert "layout" not in plain.options
    both = _compare(dumps("tp2"), dumps("tp2-bug"), tmp_path / "global", rank_map="global")
    assert both.options["layout"]["text"][0].startswith("layout: 2 ranks against 2, both reduced")
    assert both.first_divergence is not None and both.first_divergence.key == "Functional.linear.0.forward"
    from ts_core.compare.errors import DumpFormatError

    with pytest.raises(DumpFormatError, match="N ranks against M"):
        _compare(dumps("ddp2"), dumps("tp2"), tmp_path / "bad", rank_map="0,1")


@pytest.mark.slow
def test_tp_outer_2d_mesh_is_faithful_and_replicas_are_checked_within_tp_groups(dumps, tmp_path):
    """Mesh (tp 2, dp 2): the TP groups are ranks {0, 2} and {1, 3}, read from the recorded
    mesh_ranks; sub-mesh DTensors merged per group then tiled over the batch shards, plain
    values tiled over the (non-contiguous) groups; replicas all equal within their groups."""
    with open(os.path.join(dumps("tpo"), "step0", "rank2", "dump.json")) as f:
        data = json.load(f)["data"]
    block = data["Functional.linear.0.forward"]["input_args"][1]["dtensor"]
    assert block["mesh_ranks"] == [0, 2] and block["mesh_dim_names"] == ["tp"] and block["coordinate"] == [1]
    result = _compare(dumps("single"), dumps("tpo"), tmp_path)
    layout = result.options["layout"]
    assert layout["rule"] == SPLIT and "scaled by 1/2" in layout["text"][1]
    assert layout["values"]["DTensor merged (sub-mesh) + tiles merged (dim 0)"] > 0
    assert any(k.startswith("tiles merged (dims") for k in layout["values"])
    assert _errors(result) == [] and result.first_divergence is None
    replicas = check_replicas(dumps("tpo"))
    assert all(s["checked"] > 20 and s["mismatches"] == 0 for s in replicas["steps"])


@pytest.mark.slow
def test_tensor_mode_faithful_and_statistics_mode_says_it_cannot_name_the_shard(dumps, tmp_path):
    faithful = _compare(dumps("single", TENSOR), dumps("tp2", TENSOR), tmp_path / "f")
    assert faithful.options["layout"]["values"]["global tensors assembled"] > 0
    assert _errors(faithful) == [] and faithful.first_divergence is None
    assert any(r.mode == "tensor" and r.name == "Functional.linear.0.forward.input.1" for r in faithful.rows)
    # a 2-D job: sub-mesh DTensors assembled per TP group ({0, 2}, {1, 3}), then tiled over the batch
    two_d = _compare(dumps("single", TENSOR), dumps("tpo", TENSOR), tmp_path / "2d")
    assert _errors(two_d) == [] and two_d.first_divergence is None
    name = "merged.Functional.linear.1.forward.input_args.0.npy"         # blocks.0.down's input: Shard(2) per group
    got = np.load(tmp_path / "2d" / "out" / "layout_views" / "step0" / "rank3" / "dump_tensor_data" / name)
    want = np.load(os.path.join(dumps("single", TENSOR), "step0", "rank", "dump_tensor_data",
                                "Functional.linear.1.forward.input.0.npy"))
    assert got.shape == want.shape == (16, 8, 32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    stats = _compare(dumps("single"), dumps("tp2-bug"), tmp_path / "s")
    line = next(x for x in stats.options["layout"]["text"] if x.startswith("step 0:"))
    assert "not known from statistics" in line and "task tensor dump names the rank" in line


@pytest.mark.slow
def test_tensor_mode_names_the_rank_holding_the_bad_shard(dumps, tmp_path):
    """rank1's shard of blocks.0.up.weight (ColwiseParallel: Shard(0), rows 16..31) scaled by
    1.01: the assembled global weight is numpy's concatenation of the ranks' files; rows 16..31
    differ from the single run's, rows 0..15 do not; the compare names rank1 (1 vs N and N vs M)."""
    result = _compare(dumps("single", TENSOR), dumps("tp2-bug", TENSOR), tmp_path / "one")
    text = "\n".join(result.options["layout"]["text"])
    assert "step 0: first divergence Functional.linear.0.forward on a value merged across ranks, on rank1 " \
        "(tensor mode: its shard of Functional.linear.0.forward.input.1" in text
    key = "Functional.linear.0.forward.input.1.npy"
    shards = [np.load(os.path.join(dumps("tp2-bug", TENSOR), "step0", f"rank{r}", "dump_tensor_data", key))
              for r in range(2)]
    single = np.load(os.path.join(dumps("single", TENSOR), "step0", "rank", "dump_tensor_data", key))
    merged = np.load(tmp_path / "one" / "out" / "layout_views" / "step0" / "rank0" / "dump_tensor_data" /
                     "merged.Functional.linear.0.forward.input_args.1.npy")
    np.testing.assert_array_equal(merged, np.concatenate(shards))
    assert np.array_equal(merged[:16], single[:16]) and not np.allclose(merged[16:], single[16:], rtol=1e-4)
    np.testing.assert_allclose(merged[16:], single[16:] * 1.01, rtol=1e-6)
    both = _compare(dumps("ddp2", TENSOR), dumps("tp2-bug", TENSOR), tmp_path / "nm")
    assert "step 0: first divergence Functional.linear.0.forward on a value merged across ranks, on target rank1 " \
        "(tensor mode" in "\n".join(both.options["layout"]["text"])
