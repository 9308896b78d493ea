"""The Lightning callback under ``ModelParallelStrategy`` (FSDP2 or tensor parallel applied in
``configure_model``) on 2 CPU processes: the fit with the callback gives the same losses and
updated parameters, bit for bit, as the fit without it, and both ranks write both steps with
DTensor parameter gradients. (Lightning's ``FSDPStrategy`` is FSDP1: it needs an accelerator.)"""
from __future__ import annotations

import os

import numpy as np
import pytest

from ..conftest import require
from ..integrations._helpers import python, records, run

pytestmark = [pytest.mark.slow, require("lightning")]

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightning_worker.py")


@pytest.mark.parametrize("parallel", ["fsdp2", "tp"])
def test_lightning_model_parallel_with_the_callback_is_bit_identical(tmp_path, parallel):
    for out, dump in (("off.npz", None), ("on.npz", "dump")):
        run([python(), WORKER, "--parallel", parallel, "--out", out] + (["--dump", dump] if dump else []),
            timeout=300, cwd=str(tmp_path))
    off, on = np.load(tmp_path / "off.npz"), np.load(tmp_path / "on.npz")
    assert sorted(off.files) == sorted(on.files) and len(off["losses"]) == 2
    different = [k for k in off.files if not np.array_equal(off[k], on[k])]
    assert different == []
    for step in (0, 1):
        per_rank = [records(str(tmp_path / "dump"), step, f"rank{r}") for r in (0, 1)]
        assert list(per_rank[0]) == list(per_rank[1]) and per_rank[0]
        grads = per_rank[0]["Module.lm.blocks.0.up.Linear.parameters_grad.0"]["weight"][0]
        assert grads["dtensor"]["placements"] == ["Shard(0)"] and grads["dtensor"]["global_shape"] == [32, 16]
