"""Real parallel training stacks with the tool on: FSDP2 (``fully_shard``: resharding on and off,
bf16 mixed precision), tensor parallel (``parallelize_module``: column/row-wise), sequence
parallel with loss parallel, a 2-D mesh (FSDP2 over TP on 4 processes), DDP, and activation
checkpointing (non-reentrant under FSDP2; reentrant with bf16 autocast under DDP). Each stack runs
as real gloo processes (stack_worker.py): never a crash, losses / gradients / updated parameters
bit-identical to the same job without the tool (full tensors), a complete dump on every rank, and
DTensor summaries whose mergeable statistics give the global gradient's statistics, checked in
numpy against the full gradient."""
from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest

from ts_core.dumpfmt import DTENSOR, merge_shards, reference_stats

from ..integrations._helpers import ROOT, free_port, python, records, run

pytestmark = pytest.mark.slow

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stack_worker.py")
# stack -> (processes, LEVEL:SUMMARY runs); every level and summary is covered by some stack
STACKS = {
    "fsdp2": (2, "L0:statistics,L1:md5,mix:tensor,mix:async"),
    "fsdp2-noreshard": (2, "mix:statistics"),
    "fsdp2-bf16": (2, "mix:md5"),
    "tp": (2, "L0:md5,L1:statistics,mix:tensor,mix:async"),
    "tp-sp": (2, "mix:statistics"),
    "2d": (4, "mix:statistics"),
    "2d-tpouter": (4, "mix:statistics"),                # TP on the outer mesh dim: groups {0, 2}, {1, 3}
    "ddp": (2, "mix:md5"),
    "fsdp2-ckpt": (2, "mix:statistics"),              # non-reentrant activation checkpointing
    "ddp-ckpt-autocast": (2, "L1:statistics,mix:md5"),  # reentrant checkpointing, bf16 autocast
    "fsdp2-pure": (2, "L0:statistics,mix:async"),       # without the native kernels: torch ops only
}
PURE = "-pure"          # the stack without the suffix, run with TSPROBE_NATIVE=0


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# FullyShardedDataParallel (FSDP1) refuses CPU ("FSDP needs a non-CPU accelerator device"): run
# where 2 GPUs are, else skipped saying so
FSDP1 = pytest.param("fsdp1", marks=pytest.mark.skipif(_gpus() < 2, reason="FSDP1 needs 2 GPUs (torch refuses it "
                                                                         "on CPU); none here"))
STACKS["fsdp1"] = (2, "L0:statistics,mix:md5")


@pytest.fixture(scope="module", params=sorted(set(STACKS) - {"fsdp1"}) + [FSDP1])
def job(request, tmp_path_factory):
    stack = request.param
    nproc, runs = STACKS[stack]
    root = tmp_path_factory.mktemp(stack)
    report = root / "report.json"
    pure = stack.endswith(PURE)
    run([python(), "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
         str(free_port()), WORKER, "--stack", stack.removesuffix(PURE), "--runs", runs, "--dump-root",
         str(root / "dump"), "--report", str(report)], timeout=420, cwd=str(root),
        env_extra={"PYTHONPATH": ROOT, **({"TSPROBE_NATIVE": "0"} if pure else {})})   # this checkout's ts_core
    with open(report) as f:
        return stack, nproc, json.load(f)


def test_no_crash_and_bit_identical_on_every_rank(job):
    stack, nproc, ranks = job
    assert len(ranks) == nproc
    for rank, report in enumerate(ranks):
        for name, entry in report["runs"].items():
            assert "error" not in entry, f"{stack} {name} rank {rank}:\n{entry['error']}"
            assert entry["differences"] == [], f"{stack} {name} rank {rank}: {entry['differences']}"


def test_every_rank_has_a_complete_dump(job):
    stack, nproc, ranks = job
    for name, entry in ranks[0]["runs"].items():
        for step in (0, 1):
            per_rank = [records(entry["dump"], step, f"rank{r}") for r in range(nproc)]
            assert all(per_rank), f"{stack} {name} step {step}: a rank recorded nothing"
            assert all(list(r) == list(per_rank[0]) for r in per_rank), \
                f"{stack} {name}: ranks recorded different calls"
            level = name.split(":")[0]
            modules = [k for k in per_rank[0] if k.startswith("Module.")]
            apis = [k for k in per_rank[0] if not k.startswith("Module.")]
            assert bool(modules) == (level in ("L0", "mix")) and bool(apis) == (level in ("L1", "mix"))
            if level != "L1":
                assert any(".backward." in k for k in modules)
                assert any(re.match(r"Module\.(module\.)?blocks\.0\.up\.Linear\.parameters_grad", k)
                           for k in modules)     # DDP's wrapper adds "module."
                # fully_shard renames the class to FSDPBlock: records keep the user's class
                assert not any(".FSDP" in k for k in modules)


def _tensor_summaries(value):
    if isinstance(value, dict) and "dtype" in value and "shape" in value:
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensor_summaries(v)
    elif isinstance(value, list):
        for v in value:
            yield from _tensor_summaries(v)


def test_no_statistics_missing_and_dtensor_blocks_consistent(job):
    """Every tensor value has its statistics (no freed or wrapper tensor skipped silently); a
    DTensor's summary is its local shard's, with the shard's mergeable statistics beside it."""
    stack, nproc, ranks = job
    for name, entry in ranks[0]["runs"].items():
        for r in range(nproc):
            data = records(entry["dump"], 1, f"rank{r}")
            for key, rec in data.items():
                for s in _tensor_summaries(rec):
                    if not math.prod(s["shape"]):
                        continue
                    assert s["Max"] is not None and s["Norm"] is not None, (stack, name, key, s)
                    # a clean run: a NaN here is memory read before it was written (FSDP2's
                    # all-gather buffers, recorded by a call of its own machinery)
                    assert math.isfinite(s["Max"]) and math.isfinite(s["Norm"]), (stack, name, key, s)
                    block = s.get(DTENSOR)
                    if block is None:
                        continue
                    local = block["local"]
                    assert local["count"] == math.prod(s["shape"]) and len(block["global_shape"]) == len(s["shape"])
                    assert s["Max"] == local["max"] and s["Min"] == local["min"]
                    assert s["Mean"] == pytest.approx(local["sum"] / local["count"], rel=1e-12, abs=1e-300)
                    assert len(block["coordinate"]) == len(block["mesh_shape"]) == len(block["placements"])
                    # the mesh's global ranks: this rank among them, at its coordinate (row-major)
                    assert len(block["mesh_ranks"]) == math.prod(block["mesh_shape"])
                    flat = 0
                    for c, m in zip(block["coordinate"], block["mesh_shape"]):
                        flat = flat * m + c
                    assert block["mesh_ranks"][flat] == r, (key, block)


def test_merged_shards_give_the_full_gradient_statistics(job):
    """parameters_grad of sharded parameters (FSDP2: Shard(0) over the data mesh; TP: column and
    row shards, replicated biases; 2-D: both) merged across ranks equal numpy's statistics of
    the full gradient (gathered with full_tensor() by the job itself)."""
    stack, nproc, ranks = job
    if stack == "fsdp1":
        pytest.skip("FSDP1 keeps flat parameters: the dump has no per-parameter shards to merge")
    name, entry = next(iter(ranks[0]["runs"].items()))
    reference = np.load(entry["dump"] + ".grads.npz")
    per_rank = [records(entry["dump"], 1, f"rank{r}") for r in range(nproc)]
    checked = 0
    for pname in reference.files:
        module, _, attr = pname.rpartition(".")
        key = next((k for k in per_rank[0] if re.match(rf"Module\.(module\.)?{re.escape(module)}\.[A-Za-z]+\.parameters_grad", k)),
                   None)
        if key is None:
            continue
        summaries = [rec[key][attr][0] for rec in per_rank]
        want = reference_stats(reference[pname])
        if DTENSOR not in summaries[0]:
            assert stack.startswith(("ddp", "tp", "2d-tpouter")), f"{stack}: {pname} is not a DTensor"
            for s in summaries:     # a replicated plain gradient: every rank has all of it
                assert s["Max"] == pytest.approx(want["Max"], rel=1e-6)
                assert s["Norm"] == pytest.approx(want["Norm"], rel=1e-5)
            continue
        got = merge_shards(summaries)
        if any(p.startswith("Partial") for p in summaries[0][DTENSOR]["placements"]):
            # a pending sum (sequence parallel's norm weights): the extremes of a sum are not
            # known from its terms' statistics, so no merge is claimed
            assert got is None
            continue
        assert got is not None, (stack, pname, [s[DTENSOR] for s in summaries])
        assert got["count"] == reference[pname].size
        assert got["Max"] == want["Max"] and got["Min"] == want["Min"], (stack, pname)
        # each shard's sums are accumulated in float32 blocks (the native kernel): a relative error
        # of ~1e-7 of the absolute sum, whatever the float64 merge adds
        scale = float(np.abs(reference[pname].astype(np.float64)).mean())
        assert got["Mean"] == pytest.approx(want["Mean"], rel=1e-6, abs=1e-6 * scale), (stack, pname)
        assert got["Norm"] == pytest.approx(want["Norm"], rel=1e-6), (stack, pname)
        checked += 1
    if not stack.startswith("ddp"):
        assert checked >= 4, f"{stack}: only {checked} sharded gradients checked"
