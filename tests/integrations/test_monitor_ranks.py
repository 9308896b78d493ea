"""Monitor mode with two ranks (torch.distributed, gloo, two CPU processes under torchrun):
recipes/monitor_ddp_recipe.py injects a NaN at the Poison module on rank 1 only, at step 3.
monitor.jsonl gets one line per step and rank; rank 1 names the poisoned op; rank 0, whose
forward stays clean, sees the all-reduced NaN gradients (record_param_grads) and triggers at the
same step, so ``on_trigger: stop`` stops both ranks together (no hang)."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from ._helpers import RECIPES, free_port, python, run

pytestmark = pytest.mark.slow

NAN_STEP = 3


def _recipe():
    sys.path.insert(0, RECIPES)
    try:
        import monitor_ddp_recipe
    finally:
        sys.path.remove(RECIPES)
    return monitor_ddp_recipe


def test_nan_on_rank1_only_two_processes(tmp_path):
    dump = str(tmp_path / "dump")
    p = run([python(), "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
             os.path.join(RECIPES, "monitor_ddp_recipe.py"), "--dump-path", dump, "--nan-step", str(NAN_STEP),
             "--nan-rank", "1"], timeout=150, cwd=str(tmp_path))
    for r in (0, 1):
        assert f"rank {r}: {NAN_STEP + 1} steps, captures at [{NAN_STEP}]" in p.stdout, p.stdout

    with open(os.path.join(dump, "monitor.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert sorted((r["step"], r["rank"]) for r in rows) == [(s, r) for s in range(NAN_STEP + 1) for r in (0, 1)]
    by = {(r["step"], r["rank"]): r for r in rows}

    # step 0, before any update: each rank's loss is its own shard's, recomputed here independently
    recipe = _recipe()
    torch.manual_seed(0)
    model = recipe.MLP()
    for rank in (0, 1):
        g = torch.Generator().manual_seed(100 + rank)
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)
        assert by[(0, rank)]["loss"] == F.mse_loss(model(x), y).item()
    for s in range(NAN_STEP):                   # clean steps: nothing triggered, all-reduced gradients
        assert "trigger" not in by[(s, 0)] and "trigger" not in by[(s, 1)]
        assert by[(s, 0)]["grad_norm"] == by[(s, 1)]["grad_norm"]
        assert by[(s, 0)]["loss"] != by[(s, 1)]["loss"]

    bad1, bad0 = by[(NAN_STEP, 1)], by[(NAN_STEP, 0)]
    assert bad1["trigger"] == ["nan"] and bad1["loss"] == "nan" and bad1["nonfinite"]["forward"] > 0
    first1 = bad1["capture"]["first"]
    assert first1["key"] == "Module.module.poison.Poison.forward.0" and first1["direction"] == "forward"
    assert "monitor_ddp_recipe.py" in first1["source"]
    # rank 0: a clean forward and a finite loss; the NaN reached it through the gradient all-reduce
    assert bad0["trigger"] == ["nan"] and bad0["loss"] != "nan"
    assert bad0["nonfinite"]["forward"] == 0 and bad0["nonfinite"]["parameters_grad"] > 0
    assert ".parameters_grad." in bad0["capture"]["first"]["key"]
    for rank in (0, 1):                          # keep_steps 2: the NaN step and the one before
        assert bad1["capture"]["dumps"][-1].endswith(os.path.join(f"step{NAN_STEP}", "rank1"))
        for s in (NAN_STEP - 1, NAN_STEP):
            assert os.path.isfile(os.path.join(dump, f"step{s}", f"rank{rank}", "dump.json"))
    assert sorted(os.listdir(dump)) == ["monitor.jsonl", f"step{NAN_STEP - 1}", f"step{NAN_STEP}"]
