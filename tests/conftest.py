"""Shared test helpers: tiny real models and dump readers."""
from __future__ import annotations

import importlib.util
import json
import os

import pytest


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


def require(module: str):
    """``@require("transformers")``: skip with a reason when an optional dependency is absent."""
    return pytest.mark.skipif(not _has(module), reason=f"needs {module} installed")


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.cuda`` tests skip, saying why, where torch sees no CUDA device."""
    cuda = [item for item in items if "cuda" in item.keywords]
    if not cuda:
        return
    try:
        import torch

        why = None if torch.cuda.is_available() else f"needs a CUDA GPU (torch {torch.__version__} sees none)"
    except ImportError:
        why = "needs torch with CUDA"
    if why:
        for item in cuda:
            item.add_marker(pytest.mark.skip(reason=why))


def load_dump(rank_dir: str) -> dict:
    with open(os.path.join(rank_dir, "dump.json"), encoding="utf-8") as f:
        return json.load(f)


def load_json(rank_dir: str, name: str) -> dict:
    with open(os.path.join(rank_dir, name), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture
def dump_root(tmp_path):
    return str(tmp_path / "dump")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("TSPROBE_QUIET", "1")


def tensor_summaries(obj, tensor_type: str = "torch.Tensor"):
    """Every tensor summary in a record (or a whole ``data`` mapping), in argument order."""
    if isinstance(obj, dict) and obj.get("type") == tensor_type:
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensor_summaries(v, tensor_type)
    elif isinstance(obj, list):
        for v in obj:
            yield from tensor_summaries(v, tensor_type)
