"""Lossless calls (views, reshapes) on one side only, and the backward records of calls whose
forward was re-paired (issue 12): a clean pair raises nothing, and a backward record pairs with
the backward record of the call its forward call paired with."""
import importlib.util
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from ts_core import PrecisionDebugger  # noqa: E402
from ts_core.compare import compare  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Heads(nn.Module):
    """A projection split into heads; ``extra``: the projection's output is first reshaped to
    ``[10, 16]`` and back, as MindSpore's ``Dense`` does, so the target runs two more reshapes."""

    def __init__(self, extra: bool):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(16, 16)
        self.extra = extra

    def forward(self, x):
        h = self.fc(x)
        if self.extra:
            h = h.reshape(10, 16).reshape(2, 5, 16)
        q = h.reshape(2, 5, 2, 8).transpose(1, 2)
        return (q * q.sigmoid()).sum()


def _dump(extra: bool, path, level: str):
    model = Heads(extra)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    dbg = PrecisionDebugger(dump_path=str(path), task="tensor", level=level, step=[0])
    dbg.start(model)
    model(x).backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    return path


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_reshapes_of_other_shapes_never_pair(tmp_path, level):
    result = compare(_dump(False, tmp_path / "g", level), _dump(True, tmp_path / "t", level), verbose=False)
    assert result.first_divergence is None
    assert not [r for r in result.rows if r.verdict == "error"]
    # the head split pairs with the target's head split, forward and backward, and the two
    # extra reshapes are alone on the target side
    split = {(r.golden_key, r.target_key) for r in result.rows if r.golden_key and "reshape" in r.golden_key}
    assert split == {("Tensor.reshape.0.forward", "Tensor.reshape.2.forward"),
                     ("Tensor.reshape.0.backward", "Tensor.reshape.2.backward")}
    alone = {r.target_key for r in result.rows if r.golden_key is None and "reshape" in r.target_key}
    assert alone == {f"Tensor.reshape.{i}.{d}" for i in (0, 1) for d in ("forward", "backward")}


@pytest.mark.skipif(importlib.util.find_spec("mindspore") is None, reason="needs mindspore installed")
@pytest.mark.parametrize("family,variant", [("gpt_block", "clean_noop"), ("llama_block", "clean_port")])
def test_backward_records_follow_their_forward_partners_across_frameworks(tmp_path, family, variant):
    """torch's ``view`` head split against a MindSpore port whose ``Dense`` reshapes before it:
    the name alignment pairs ``view.0.backward`` with the Dense's ``reshape.0.backward``; the
    backward pairs as its forward did (``view.0`` with ``reshape.1``). The MindSpore side is
    dumped by the localisation benchmark's child process."""
    keep = tmp_path / "loc"
    env = dict(os.environ, PYTHONPATH=REPO, TSPROBE_QUIET="1")
    subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "localisation.py"), "--families", family,
                    "--bugs", variant, "--pairs", "torch-ms", "--levels", "L1", "--keep", str(keep), "--quiet"],
                   check=True, env=env, cwd=REPO, capture_output=True, timeout=600)
    golden = next((keep / "torch" / family).glob("clean_same/L1_tensor*/step0/rank"))
    target = next((keep / "ms" / family / variant).glob("L1_tensor*/step0/rank"))
    result = compare(golden, target, verbose=False)
    assert result.first_divergence is None and result.verdict != "error"
    pairs = {(r.golden_key, r.target_key) for r in result.rows if r.golden_key and r.target_key}
    forward = {g: t for g, t in pairs if g.endswith(".forward") and "+" not in t and g.startswith("Tensor.view")}
    assert forward, "no view call paired"
    for g, t in forward.items():
        gb, tb = g[:-len("forward")] + "backward", t[:-len("forward")] + "backward"
        assert {p for p in pairs if p[0] == gb} == {(gb, tb)}


class Pool(nn.Module):
    """A global average pool as one mean over two axes, or (``split``) as two means."""

    def __init__(self, split: bool):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.fc, self.split = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 4), split

    def forward(self, x):
        h = self.conv(x)
        h = h.mean(3).mean(2) if self.split else h.mean((2, 3))
        return self.fc(h).pow(2).mean()


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_backward_record_moves_to_its_forward_partner_only_when_they_fit(tmp_path, level):
    """golden ``mean.0`` pairs with the second of target's two means; their backward records
    receive gradients of [2, 8] and give [2, 8, 8, 8] vs [2, 8, 8]: they are not one call's."""
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    paths = []
    for name, split in (("g", False), ("t", True)):
        model = Pool(split)
        dbg = PrecisionDebugger(dump_path=str(tmp_path / name), task="tensor", level=level, step=[0])
        dbg.start(model)
        model(x).backward()
        dbg.stop()
        dbg.step()
        dbg.close()
        paths.append(tmp_path / name)
    result = compare(*paths, verbose=False)
    assert result.first_divergence is None and result.verdict != "error"
    assert not [r for r in result.rows if r.verdict == "error"]
