"""A single-device run compared with its DDP, FSDP2 and tensor-parallel twins (tsprobe compare with
rank layouts). The merge rules are checked against numpy on synthetic shards; the end-to-end
pairs are real gloo jobs (tests/distributed/stack_worker.py, the same tiny LM on every stack):
faithful pairs give no divergence (the difference is reduction-order noise, inside the default
tolerances), a weight perturbed on one rank only is named at its op (and rank, where the value
is the rank's own)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from ts_core.compare import compare
from ts_core.compare.errors import DumpFormatError
from ts_core.compare.align.layouts import MERGED, SAME, SPLIT, build_view, data_shards, detect
from ts_core.verdicts import ERROR
from ts_core.dumpfmt import reference_stats

from tests.integrations._helpers import RECIPES, ROOT, free_port, python, run

WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "distributed", "stack_worker.py")


# ---------------------------------------------------------------- merge rules, against numpy

def _plain(a: np.ndarray) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(a.shape), **reference_stats(a)}


def _dtensor(a: np.ndarray, full: tuple, placement: str, coord: int) -> dict:
    s = _plain(a)
    f = a.astype(np.float64)
    s["dtensor"] = {"global_shape": list(full), "placements": [placement], "mesh_shape": [2], "mesh_dim_names": None,
                    "coordinate": [coord], "local": {"count": a.size, "sum": float(f.sum()), "sum_sq": float((f * f).sum()),
                                                     "max": float(f.max()), "min": float(f.min()), "nan": 0, "inf": 0}}
    return s


def _close(got: dict, want: dict) -> None:
    assert got["Max"] == want["Max"] and got["Min"] == want["Min"]
    assert got["Mean"] == pytest.approx(want["Mean"], rel=1e-12, abs=1e-15)
    assert got["Norm"] == pytest.approx(want["Norm"], rel=1e-12)


def test_views_merge_tiles_and_shards_exactly():
    """Batch tiles (uneven), column tiles, Shard(0) DTensors and a Partial(sum) merge to the full
    tensor's statistics (Partial: its Mean only); split-batch backward tiles are scaled by 1/N."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 6)).astype(np.float32)
    w = rng.standard_normal((7, 4)).astype(np.float32)
    p0, p1 = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    golden = {"Functional.f.0.forward": {"input_args": [_plain(x)], "output": [_plain(x)]},
              "Functional.f.0.backward": {"input": [_plain(x)]},
              "Functional.g.0.forward": {"input_args": [_plain(w)], "output": [_plain(p0 + p1)]}}
    tiles = [x[:2], x[2:]]                     # uneven batch shards
    cols = [x[..., :4], x[..., 4:]]            # uneven column tiles
    ranks = [{"Functional.f.0.forward": {"input_args": [_plain(tiles[r])], "output": [_plain(cols[r])]},
              "Functional.f.0.backward": {"input": [_plain(2 * tiles[r])]},
              "Functional.g.0.forward": {"input_args": [_dtensor(w[:4] if r == 0 else w[4:], w.shape, "Shard(0)", r)],
                                         "output": [_dtensor(p0 if r == 0 else p1, (2, 3), "Partial(sum)", r)]}}
             for r in range(2)]
    assert detect(ranks) == SPLIT and detect([ranks[0], ranks[0]]) == SAME
    view, counts = build_view(golden, ranks, 1, SPLIT)
    f = view["Functional.f.0.forward"]
    _close(f["input_args"][0], reference_stats(x))
    _close(f["output"][0], reference_stats(x))
    assert f["input_args"][0]["shape"] == [5, 3, 6] and f["input_args"][0]["layout"] == MERGED
    _close(view["Functional.f.0.backward"]["input"][0], reference_stats(x))     # 2x per rank, 1/2 merged
    _close(view["Functional.g.0.forward"]["input_args"][0], reference_stats(w))
    partial = view["Functional.g.0.forward"]["output"][0]
    assert partial["Max"] is None and partial["Norm"] is None
    assert partial["Mean"] == pytest.approx(float((p0 + p1).mean()), rel=1e-12)
    assert counts == {"tiles merged (dim 0)": 2, "tiles merged (dim 2)": 1, "DTensor merged": 1,
                      "Partial (Mean only)": 1}


def test_views_merge_a_2d_mesh_exactly():
    """A (dp 2, tp 2) job: a plain value tiled over both mesh dims (batch x columns), one
    replicated over tp (batch tiles only), a DTensor Shard(2) on each dp group's tp sub-mesh
    (then tiled over dp) and a Partial(sum) on the sub-mesh (Means by count): the full tensor's
    statistics; split-batch backward tiles scaled by 1/2 (two batch shards, not four ranks)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 3, 8)).astype(np.float32)
    s0, s1 = rng.standard_normal((3, 3, 4)), rng.standard_normal((3, 3, 4))
    golden = {"Functional.f.0.forward": {"input_args": [_plain(x)], "output": [_plain(x)]},
              "Functional.f.0.backward": {"input": [_plain(x)]},
              "Functional.g.0.forward": {"input_args": [_plain(x)], "output": [_plain(np.concatenate([s0, s1]))]}}

    def rank(r: int) -> dict:
        dp, tp = divmod(r, 2)
        rows, cols = x[3 * dp:3 * dp + 3], slice(4 * tp, 4 * tp + 4)
        part = (s0, s1)[dp] * (0.25 if tp == 0 else 0.75)         # the sub-mesh's pending sum
        return {"Functional.f.0.forward": {"input_args": [_plain(rows)], "output": [_plain(rows[..., cols])]},
                "Functional.f.0.backward": {"input": [_plain(2 * rows)]},
                "Functional.g.0.forward": {"input_args": [_dtensor(rows[..., cols], rows.shape, "Shard(2)", tp)],
                                           "output": [_dtensor(part, part.shape, "Partial(sum)", tp)]}}
    ranks = [rank(r) for r in range(4)]
    assert detect(ranks) == SPLIT and data_shards(ranks) == 2
    for r in range(4):
        view, counts = build_view(golden, ranks, r, SPLIT, shards=2)
        f, g = view["Functional.f.0.forward"], view["Functional.g.0.forward"]
        _close(f["input_args"][0], reference_stats(x))
        _close(f["output"][0], reference_stats(x))
        _close(view["Functional.f.0.backward"]["input"][0], reference_stats(x))
        _close(g["input_args"][0], reference_stats(x))
        assert g["output"][0]["Max"] is None and g["output"][0]["shape"] == [6, 3, 4]
        assert g["output"][0]["Mean"] == pytest.approx(float(np.concatenate([s0, s1]).mean()), rel=1e-12)
    assert counts == {"tiles merged (dim 0)": 2, "tiles merged (dims 2, 0)": 1,
                      "DTensor merged (sub-mesh) + tiles merged (dim 0)": 2}


# ---------------------------------------------------------------- real gloo jobs

pytestmark_slow = pytest.mark.slow
JOBS = {  # name -> (processes, worker arguments)
    "single": (1, ["--stack", "single"]),
    "single-of-2": (1, ["--stack", "single", "--single-of", "2"]),
    "tp": (2, ["--stack", "tp"]),
    "tp-bug": (2, ["--stack", "tp", "--bug", "1:blocks.0.up.weight"]),
    "ddp": (2, ["--stack", "ddp"]),
    "ddp-same-bug": (2, ["--stack", "ddp", "--same-data", "--bug", "1:blocks.0.up.weight"]),
    "ddp-bug": (2, ["--stack", "ddp", "--bug", "1:blocks.0.up.weight"]),
    "fsdp2": (2, ["--stack", "fsdp2"]),
    "2d": (4, ["--stack", "2d"]),             # FSDP2 (dp 2) over TP (2); TP peers share a batch
    "2d-bug": (4, ["--stack", "2d", "--bug", "3:blocks.0.up.weight"]),
    # a vocabulary of 25 on 2 TP ranks: the embedding/head weights in uneven Shard(0) shards (13, 12)
    "single-v25": (1, ["--stack", "single", "--vocab", "25"]),
    "tp-sp-v25": (2, ["--stack", "tp-sp", "--vocab", "25"]),
}
RUNS = {"single-v25": "mix:statistics,mix:tensor", "tp-sp-v25": "mix:statistics,mix:tensor"}   # + task tensor


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """name -> dump root, each job launched once when a test first needs it."""
    root = tmp_path_factory.mktemp("parallel")
    made = {}

    def get(name: str) -> str:
        if name not in made:
            nproc, args = JOBS[name]
            out = root / name
            head = [python()] if nproc == 1 else [python(), "-m", "torch.distributed.run", "--nproc_per_node",
                                                  str(nproc), "--master_port", str(free_port())]
            run(head + [WORKER, *args, "--runs", RUNS.get(name, "mix:statistics"), "--dump-root", str(out),
                        "--report", str(root / f"{name}.json")], timeout=300, cwd=str(root),
                env_extra={"PYTHONPATH": ROOT})        # this checkout's ts_core, not the installed one
            made[name] = str(out / "mix-statistics")
        return made[name]
    return get


def _compare(dumps, golden: str, target: str, tmp_path, **kw):
    return compare(dumps(golden), dumps(target), tmp_path / "out", html=False, verbose=False, workers=1, **kw)


def _errors(result):
    return [r.name for r in result.rows if r.verdict == ERROR]


@pytestmark_slow
def test_single_vs_tp_is_faithful(dumps, tmp_path):
    result = _compare(dumps, "single", "tp", tmp_path)
    layout = result.options["layout"]
    assert layout["rule"] == SAME
    assert layout["values"]["DTensor merged"] > 0 and layout["values"]["tiles merged (dim 2)"] > 0
    assert _errors(result) == [] and result.first_divergence is None
    assert sorted({p.rank for p in result.pairs}) == ["rank0", "rank1"]
    assert any("no divergence on any rank" in line and "reduction-order noise" in line for line in layout["text"])


@pytestmark_slow
def test_tp_as_golden_against_single_and_rank_map(dumps, tmp_path):
    """The many-rank run may be the golden side; --rank-map forces the rule and picks ranks."""
    result = compare(dumps("tp"), dumps("single"), tmp_path / "rev", html=False, verbose=False, workers=1)
    assert result.options["layout"]["rule"] == SAME and result.options["layout"]["text"][0].startswith(
        "layout: 2 ranks against 1")
    assert _errors(result) == [] and sorted({p.rank for p in result.pairs}) == ["rank0", "rank1"]
    only1 = _compare(dumps, "single", "tp", tmp_path, rank_map="1")
    assert {p.rank for p in only1.pairs} == {"rank1"} and "forced by --rank-map" in only1.options["layout"]["text"][0]
    with pytest.raises(DumpFormatError, match="--rank-map"):
        compare(dumps("single"), dumps("single"), None, verbose=False, rank_map="same")
    with pytest.raises(DumpFormatError, match="expected same, split"):
        _compare(dumps, "single", "tp", tmp_path, rank_map="rank1")


@pytestmark_slow
def test_single_vs_tp_bug_on_one_shard_is_named_at_its_op(dumps, tmp_path):
    result = _compare(dumps, "single", "tp-bug", tmp_path)
    fd = result.first_divergence
    assert fd is not None and fd.key == "Functional.linear.0.forward"          # blocks.0.up
    assert "Module.blocks.0.up" in (fd.module or "")
    # the perturbed weight is a DTensor merged across ranks: statistics cannot tell which shard
    assert any("merged across ranks" in line for line in result.options["layout"]["text"])


@pytestmark_slow
def test_single_vs_ddp_split_batch_is_faithful(dumps, tmp_path):
    result = _compare(dumps, "single-of-2", "ddp", tmp_path)
    assert result.options["layout"]["rule"] == SPLIT
    values = result.options["layout"]["values"]
    assert values["tiles merged (dim 0)"] > 0 and values["averaged over ranks"] > 0
    assert _errors(result) == [] and result.first_divergence is None
    # the parameter gradients (reduced across ranks) are compared rank by rank and agree
    assert any(".parameters_grad" in r.name and r.rank == "rank1" for r in result.rows)


@pytestmark_slow
def test_ddp_bug_on_one_rank_is_named_at_its_op_and_rank(dumps, tmp_path):
    result = _compare(dumps, "single", "ddp-same-bug", tmp_path)
    assert result.options["layout"]["rule"] == SAME
    step0 = [p for p in result.pairs if p.step == 0]
    firsts = {p.rank: p.first_divergence for p in step0}
    assert firsts["rank1"] is not None and firsts["rank1"].key == "Functional.linear.0.forward"
    assert firsts["rank0"] is None or firsts["rank0"].direction == "backward"   # reached it through the all-reduce
    assert any(line.startswith("step 0: first divergence Functional.linear.0.forward on rank1")
               for line in result.options["layout"]["text"])


@pytestmark_slow
def test_ddp_split_batch_bug_on_one_rank_is_named_at_its_op_and_rank(dumps, tmp_path):
    """Split batch: the activations are merged across ranks (both views see the difference), the
    perturbed parameter is rank1's own value: rank1 is named."""
    result = _compare(dumps, "single-of-2", "ddp-bug", tmp_path)
    assert result.options["layout"]["rule"] == SPLIT
    assert result.first_divergence is not None and result.first_divergence.key == "Functional.linear.0.forward"
    assert any(line.startswith("step 0: first divergence Functional.linear.0.forward on rank1")
               for line in result.options["layout"]["text"])
    assert any(line.startswith("  replicas step 0: 1 of") and "blocks.0.up.Linear.forward.0.parameters.weight" in line
               for line in result.options["layout"]["text"])


@pytestmark_slow
def test_single_vs_fsdp2_sharded_gradients_merge_and_agree(dumps, tmp_path):
    """FSDP2's Shard(0) gradients merged across ranks agree with the single run's gradients."""
    result = _compare(dumps, "single-of-2", "fsdp2", tmp_path)
    assert result.options["layout"]["rule"] == SPLIT and result.options["layout"]["values"]["DTensor merged"] > 0
    grads = [r for r in result.rows if ".parameters_grad" in r.name]
    assert len(grads) >= 2 * 2 * 10 and all(r.verdict != ERROR for r in grads), \
        [(r.name, r.reason) for r in grads if r.verdict == ERROR]


@pytestmark_slow
def test_single_vs_fsdp2_is_faithful(dumps, tmp_path):
    result = _compare(dumps, "single-of-2", "fsdp2", tmp_path)
    assert _errors(result) == [] and result.first_divergence is None


@pytestmark_slow
def test_single_vs_2d_is_faithful(dumps, tmp_path):
    """FSDP2 over TP on 4 ranks: sub-mesh DTensors merged per TP group then tiled over the batch
    shards, plain values tiled over both mesh dims; no divergence, replicas checked per sub-mesh."""
    result = _compare(dumps, "single-of-2", "2d", tmp_path)
    layout = result.options["layout"]
    assert layout["rule"] == SPLIT and "scaled by 1/2" in layout["text"][1]
    values = layout["values"]
    assert values["tiles merged (dims 2, 0)"] > 0 and values["DTensor merged (sub-mesh) + tiles merged (dim 0)"] > 0
    assert values["DTensor merged"] > 0                  # the 2-D (dp, tp) parameters and gradients
    assert _errors(result) == [] and result.first_divergence is None
    assert sorted({p.rank for p in result.pairs}) == ["rank0", "rank1", "rank2", "rank3"]
    assert any(line.startswith("  replicas step 0:") and "all equal" in line for line in layout["text"])


@pytestmark_slow
def test_single_vs_2d_bug_on_one_shard_is_found_at_its_op(dumps, tmp_path):
    result = _compare(dumps, "single-of-2", "2d-bug", tmp_path)
    fd = result.first_divergence
    assert fd is not None and fd.key == "Functional.linear.0.forward" and "Module.blocks.0.up" in (fd.module or "")


# The vocabulary-parallel embedding's output is a _MaskPartial DTensor: the rows of the tokens
# outside a rank's vocabulary range are zeroed only when the pending sum is reduced, so the local
# statistics recorded before include them; the dump names that placement Partial(sum) (see
# ts_core/backends/torch/tensors.py::_placement), and its Mean is merged as a plain sum.
MASK_PARTIAL = "Functional.embedding.0.forward.output.0"


@pytestmark_slow
def test_single_vs_tp_padded_vocab_merges_uneven_shards(dumps, tmp_path):
    """Uneven Shard(0) embedding/head shards and vocabulary tiles of the logits merge to the single
    run's statistics; the head's merged gradient equals numpy's statistics of the full gradient."""
    import json

    result = _compare(dumps, "single-v25", "tp-sp-v25", tmp_path)
    assert result.options["layout"]["rule"] == SAME
    assert set(_errors(result)) <= {MASK_PARTIAL}
    head = [r for r in result.rows if r.name.startswith("Module.head.Linear.parameters_grad")]
    assert len(head) == 2 * 2 and all(r.verdict != ERROR for r in head)
    logits = [r for r in result.rows if r.name == "Functional.linear.4.forward.output.0"]
    assert logits and all(r.verdict != ERROR for r in logits)

    def load(dump: str, rank: str) -> dict:
        with open(os.path.join(dump, "step1", rank, "dump.json")) as f:
            return json.load(f)["data"]
    single, ranks = load(dumps("single-v25"), "rank"), [load(dumps("tp-sp-v25"), f"rank{r}") for r in range(2)]
    key = "Module.head.Linear.parameters_grad.0"
    assert [d[key]["weight"][0]["shape"] for d in ranks] == [[13, 16], [12, 16]]
    view, _ = build_view(single, ranks, 1, SAME)
    merged = view[key]["weight"][0]
    full = np.load(dumps("tp-sp-v25") + ".grads.npz")["head.weight"]     # the gathered full gradient
    want = reference_stats(full)
    assert merged["shape"] == [25, 16] and merged["Max"] == pytest.approx(want["Max"], rel=1e-6)
    assert merged["Min"] == pytest.approx(want["Min"], rel=1e-6)
    assert merged["Mean"] == pytest.approx(want["Mean"], rel=1e-5, abs=1e-9)
    assert merged["Norm"] == pytest.approx(want["Norm"], rel=1e-6)


@pytestmark_slow
def test_single_vs_tp_padded_vocab_in_tensor_mode_assembles_uneven_shards(dumps, tmp_path):
    """Task tensor: the uneven Shard(0) head-gradient shards (13 and 12 rows) are placed into the
    global tensor exactly (equal to the job's own gathered full gradient), and the pair is faithful
    element by element."""
    single, tp = (dumps(n).replace("mix-statistics", "mix-tensor") for n in ("single-v25", "tp-sp-v25"))
    result = compare(single, tp, tmp_path / "out", html=False, verbose=False, workers=1)
    assert result.options["layout"]["values"]["global tensors assembled"] > 0
    assert _errors(result) == [] and result.first_divergence is None
    view = tmp_path / "out" / "layout_views" / "step1" / "rank1" / "dump_tensor_data"
    merged = np.load(view / "merged.Module.head.Linear.parameters_grad.0.weight.0.npy")
    np.testing.assert_array_equal(merged, np.load(tp + ".grads.npz")["head.weight"])
    assert any(r.mode == "tensor" and r.name == "Module.head.Linear.parameters_grad.0.weight" for r in result.rows)


@pytestmark_slow
def test_single_vs_tp_padded_vocab_is_faithful(dumps, tmp_path):
    """The vocabulary-parallel embedding's output is a MaskPartial DTensor (its local rows of
    other ranks' tokens are masked only by the reduction): recorded as such, never merged as a
    plain pending sum, so it raises no false alarm."""
    result = _compare(dumps, "single-v25", "tp-sp-v25", tmp_path)
    assert _errors(result) == []


@pytestmark_slow
def test_check_replicas_names_the_parameter_a_rank_holds_apart(dumps):
    from ts_core.compare.explain.replicas import check_replicas

    faithful = check_replicas(dumps("tp"))          # replicated norms, Replicate() DTensors
    assert all(s["checked"] > 10 and s["mismatches"] == 0 and s["first"] is None for s in faithful["steps"])
    bug = check_replicas(dumps("ddp-same-bug"))
    first = bug["steps"][0]["first"]
    assert first["value"] == "Module.module.blocks.0.up.Linear.forward.0.parameters.weight"
    assert sorted(v["ranks"] for v in first["versions"]) == [["rank0"], ["rank1"]]
    rank0, rank1 = sorted(first["versions"], key=lambda v: v["ranks"])
    assert rank1["Max"] == pytest.approx(rank0["Max"] * 1.01, rel=1e-6)    # the planted 1.01


@pytestmark_slow
def test_recipe_names_the_rank_whose_replica_drifted(tmp_path):
    out = run([python(), os.path.join(RECIPES, "parallel_compare_recipe.py"), "--bad-rank", "1", "--against-world",
               "4", "--dump-path", str(tmp_path / "dump")], timeout=400, cwd=str(tmp_path),
              env_extra={"PYTHONPATH": ROOT}).stdout
    assert "layout: 1 rank against 2 (split-batch" in out
    assert "step 0: first divergence Functional.linear.0.forward on rank1" in out
    assert "replicas step 0: 1 of 8 replicated values differ" in out
    # N ranks against M: DDP on 2 (rank1 drifted) against DDP on 4, the same global batch
    assert "layout: 2 ranks against 4, both reduced to the global (single-run) view" in out
    assert "step 0: first divergence Functional.linear.0.forward on golden rank1" in out
