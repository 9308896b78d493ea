"""Every family people train, one AdamW step with the tool on (level mix, task tensor): nothing
crashes, loss, gradients and updated parameters are bit-identical to a run without the tool,
every leaf module that ran is recorded (backward included where a gradient reached it), two
tool-on runs compare clean, and close() gives every function and hook back.

All models share this interpreter, so a patch or hook left behind by one model would show up
(and change the numbers of the next one); each test checks it is gone.
"""
from __future__ import annotations

import os

import pytest

from ts_core import PrecisionDebugger
from ts_core.compare import compare
from ts_core.verdicts import PASS

from ..torch_state import hooks_on, surface_changes, torch_surface
from .harness import differences, train_step
from .models import ARCHS
from .records import missing_leaf_records, rank_data


@pytest.mark.parametrize("arch", list(ARCHS))
def test_mix_tensor_step_is_bit_identical_recorded_and_restored(arch, tmp_path):
    ref = train_step(arch)
    before = torch_surface()        # after the model's first run: torch wraps some functions lazily
    runs = []
    for name in ("a", "b"):
        dbg = PrecisionDebugger(dump_path=str(tmp_path / name), task="tensor", level="mix", step=[0])
        got = train_step(arch, dbg, watch_leaves=True)
        dbg.close()
        assert differences(ref, got) == []
        assert hooks_on(got.model) == []
        assert surface_changes(before, torch_surface()) == []
        runs.append(got)

    data = rank_data(str(tmp_path / "a"))
    assert runs[0].calls, "the model has leaf modules"
    assert missing_leaf_records(data, runs[0].model, runs[0].calls) == []
    assert any(k.startswith(("Functional.", "Tensor.", "Torch.")) for k in data)   # mix: APIs too
    assert os.listdir(tmp_path / "a" / "step0" / "rank" / "dump_tensor_data")

    result = compare(tmp_path / "a", tmp_path / "b", verbose=False, html=False, workers=1)
    assert result.first_divergence is None
    assert result.counts.get(PASS, 0) > 0
    assert [r.name for r in result.rows if r.verdict != PASS and not uninitialized(r)] == []


def uninitialized(row) -> bool:
    """The value an in-place op's target held before the op wrote it: MoE routing fills
    ``torch.empty_like`` buffers with ``inv[perm] = arange``, so two runs record different garbage
    there (and the same output)."""
    return row.role == "input" and row.arg == "input.0" and row.direction == "forward" and \
        (row.golden_key or "").startswith("Tensor.__setitem__.")
