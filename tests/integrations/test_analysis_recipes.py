"""The analysis recipes run as a user runs them (own process, defaults, a temporary dump path)."""
from __future__ import annotations

import json
import os

import pytest

from ._helpers import RECIPES, python, run

pytestmark = pytest.mark.slow


def recipe(tmp_path, name: str, *args: str):
    return run([python(), os.path.join(RECIPES, name), "--dump-path", str(tmp_path / "dump"), *args],
               timeout=300, cwd=str(tmp_path))


def test_acc_check_recipe(tmp_path):
    p = recipe(tmp_path, "acc_check_recipe.py", "--out", str(tmp_path / "out"))
    assert "APIs that fail: ['MyKernels.fast_gelu']" in p.stdout
    summary = json.loads((tmp_path / "out" / "acc_check_summary.json").read_text())
    assert summary["counts"]["error"] == 2 and summary["counts"]["skip"] == 0


def test_config_check_recipe(tmp_path):
    p = recipe(tmp_path, "config_check_recipe.py")
    assert "differences at step 0: environment:CUBLAS_WORKSPACE_CONFIG, hyperparameters:lr, weights:2.weight" \
        in p.stdout


def test_report_tree_recipe(tmp_path):
    p = recipe(tmp_path, "report_tree_recipe.py")
    assert "first divergence in the tree: forward > layers.1 (Block) > layers.1.act (GELU) > Functional.gelu.1" \
        in p.stdout
    assert (tmp_path / "dump" / "compare" / "report.html").is_file()


def test_many_ranks_recipe(tmp_path):
    p = recipe(tmp_path, "many_ranks_recipe.py", "--world", "2", "--bad-rank", "1")
    assert "diverged first: ['rank1']" in p.stdout
    merged = json.loads((tmp_path / "dump" / "merged" / "ranks.json").read_text())
    assert merged["steps"][0]["diverged_first"] == ["rank1"]
