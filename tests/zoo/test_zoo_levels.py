"""Every level (L0, L1, mix, debug) and task (statistics, tensor, md5) on a subset of the zoo:
bit-identical loss, gradients and parameters, and records of the kind the level asks for.
(mix/tensor runs on every architecture in test_zoo.py.)"""
from __future__ import annotations

import os

import pytest

from ts_core import PrecisionDebugger
from ts_core.dumpfmt import UNINITIALIZED, debug_key

from ..torch_state import hooks_on, surface_changes, torch_surface
from .harness import differences, train_step
from .records import missing_leaf_records, rank_data

CASES = [("llama", "L0", "statistics"), ("t5", "L0", "md5"), ("mixtral", "L1", "md5"),
         ("bert", "L1", "tensor"), ("qwen2_moe", "mix", "statistics"), ("swin", "mix", "md5"),
         ("gemma", "debug", "tensor"), ("deberta_v2", "debug", "statistics"), ("mamba", "L0", "tensor")]


def _summaries(data: dict):
    """Every tensor summary in the records (forward, backward, debug)."""
    stack = list(data.values())
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if "dtype" in v and "shape" in v:
                yield v
            else:
                stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def written(summaries):
    """Tensor summaries of values read from written memory: a read of a buffer nothing has written
    yet (MoE routing's empty buffers) is recorded as uninitialized, with no values at all."""
    return [s for s in summaries if s.get("type") == "torch.Tensor" and not s.get(UNINITIALIZED)]


@pytest.mark.parametrize("arch,level,task", CASES)
def test_level_and_task_keep_every_bit(arch, level, task, tmp_path):
    ref = train_step(arch)
    before = torch_surface()        # after the model's first run: torch wraps some functions lazily
    extra = {"summary_mode": "md5"} if task == "md5" else {}
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="statistics" if task == "md5" else task,
                            level=level, step=[0], **extra)
    got = train_step(arch, dbg, watch_leaves=level == "L0", save_all=level == "debug")
    dbg.close()
    assert differences(ref, got) == []
    assert hooks_on(got.model) == []
    assert surface_changes(before, torch_surface()) == []

    data = rank_data(str(tmp_path))
    modules = [k for k in data if k.startswith("Module.")]
    apis = [k for k in data if k.startswith(("Functional.", "Tensor.", "Torch."))]
    if level == "L0":
        assert missing_leaf_records(data, got.model, got.calls) == [] and not apis
    elif level == "L1":
        assert apis and not modules and any(k.endswith(".backward") for k in apis)
    elif level == "mix":
        assert apis and any(".backward." in k for k in modules)
    else:                                           # debug: exactly what save() was given
        leaves = [p for p, m in got.model.named_modules() if p and next(m.children(), None) is None]
        ran = [p for p in leaves if any(k == debug_key(p, 0) for k in data)]
        assert ran and not modules and not apis
        assert any(debug_key(f"{p}_grad", 0) in data for p in ran)
    summaries = list(_summaries(data))
    assert summaries
    tensor_files = os.path.join(tmp_path, "step0", "rank", "dump_tensor_data")
    if task == "tensor":
        assert all("data_name" in s for s in written(summaries))
        assert os.listdir(tensor_files)
    else:
        assert not os.path.exists(tensor_files) or not os.listdir(tensor_files)
    has_md5 = ["md5" in s for s in written(summaries)]
    assert all(has_md5) if task == "md5" else not any(has_md5)
