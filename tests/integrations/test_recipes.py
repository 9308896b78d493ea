"""Every recipe runs as a user runs it (its own process, defaults, a temporary dump path)."""
from __future__ import annotations

import os
import re

import pytest

from ..conftest import require
from ._helpers import RECIPES, python, records, run, step_dirs

pytestmark = pytest.mark.slow


def run_recipe(tmp_path, name: str, *args: str):
    dump_root = str(tmp_path / "dump")
    p = run([python(), os.path.join(RECIPES, name), "--dump-path", dump_root, *args], timeout=120,
            cwd=str(tmp_path))
    # configs/statistics_mix.yaml: steps 0 and 1, mix level
    assert step_dirs(dump_root) == ["step0", "step1"], p.stdout
    for s in (0, 1):
        data = records(dump_root, s)
        assert any(k.startswith("Module.") for k in data) and any(".parameters_grad." in k for k in data)
    # the `tsprobe summary` listing of the dump
    assert re.search(r"^step 1, (rank \d+|not distributed): \d+ records", p.stdout, re.M), p.stdout
    return dump_root, p


def test_torch_loop_recipe(tmp_path):
    dump_root, _ = run_recipe(tmp_path, "torch_loop_recipe.py")
    data = records(dump_root, 1)
    assert len([k for k in data if k.startswith("Module.conv.Conv2d.forward.")]) == 2   # 2 micro-batches


@require("lightning")
def test_lightning_recipe(tmp_path):
    dump_root, _ = run_recipe(tmp_path, "lightning_recipe.py")
    assert len([k for k in records(dump_root, 0) if k.startswith("Module.fc1.Linear.forward.")]) == 2


@require("transformers")
def test_hf_trainer_recipe(tmp_path):
    dump_root, _ = run_recipe(tmp_path, "hf_trainer_recipe.py", "--bf16")
    data = records(dump_root, 0)
    assert len([k for k in data if k.startswith("Module.transformer.h.0.GPT2Block.forward.")]) == 2
    assert data["Module.transformer.h.0.mlp.c_fc.Conv1D.forward.0"]["output"][0]["dtype"] == "torch.bfloat16"


@require("accelerate")
def test_accelerate_recipe(tmp_path):
    dump_root, p = run_recipe(tmp_path, "accelerate_recipe.py")
    assert "on 1 process(es)" in p.stdout
