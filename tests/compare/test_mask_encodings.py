"""One attention mask passed as an additive float on one side and as a boolean on the other
(transformers' eager vs sdpa attention, issue 12): a clean pair, no error row; a mask that
differs is still an error."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ts_core import PrecisionDebugger  # noqa: E402
from ts_core.compare import compare  # noqa: E402
from ts_core.compare.judge.masks import same_mask  # noqa: E402


class Attn(nn.Module):
    def forward(self, x, mask):
        return F.scaled_dot_product_attention(x, x, x, attn_mask=mask)


class Net(nn.Module):
    """Padding mask built as a boolean (True = attend), handed to the attention module either
    as it is or as an additive float mask (0 / finfo.min)."""

    def __init__(self, additive: bool, pad: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.attn, self.additive, self.pad = nn.Linear(8, 8), Attn(), additive, pad

    def forward(self, x):
        keep = torch.ones(2, 1, 1, 6, dtype=torch.bool)
        keep[1, ..., 6 - self.pad:] = False
        mask = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min) if self.additive \
            else keep
        return self.attn(self.fc(x)[:, None], mask).sum(1)


def _run(model, path, level, task):
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(1))
    dbg = PrecisionDebugger(dump_path=str(path), task=task, level=level, step=[0])
    dbg.start(model)
    model(x).pow(2).mean().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    return path


def _mask_rows(result):
    return [r for r in result.rows if r.golden_key and r.golden_key.startswith("Module.attn") and r.arg == "input.1"]


@pytest.mark.parametrize("task", ["tensor", "statistics"])
@pytest.mark.parametrize("level", ["L0", "mix"])
def test_additive_and_boolean_encodings_of_one_mask_agree(tmp_path, level, task):
    r = compare(_run(Net(True), tmp_path / "g", level, task), _run(Net(False), tmp_path / "t", level, task),
                verbose=False)
    rows = _mask_rows(r)
    assert rows and rows[0].golden_dtype == "torch.float32" and rows[0].target_dtype == "torch.bool"
    assert all(x.verdict == "pass" and "same mask in two encodings" in x.reason for x in rows)
    assert r.first_divergence is None and r.verdict != "error"


def test_a_mask_that_differs_is_still_an_error(tmp_path):
    r = compare(_run(Net(True, pad=2), tmp_path / "g", "L0", "tensor"),
                _run(Net(False, pad=3), tmp_path / "t", "L0", "tensor"), verbose=False)
    assert all(x.verdict == "error" for x in _mask_rows(r))
    assert r.first_divergence is not None


def test_same_mask_checks_positions_and_values():
    keep = np.array([[True, True, False], [True, False, False]])
    additive = np.where(keep, 0.0, np.finfo(np.float32).min)
    assert same_mask(keep, additive) == "True = attend"
    assert same_mask(~keep, additive) == "True = masked"
    assert same_mask(keep, np.where(keep, 0.0, -0.5)) is None            # -0.5 is a bias, not "masked"
    assert same_mask(keep[::-1], additive) is None
