"""A model compiled as a whole is localised by default (issue 37): in compile_mode ``boundaries``
the compiled region is recorded at its boundary (``Module.Net``, hooks on the OptimizedModule,
outside dynamo), and a bug planted inside it (LayerNorm eps in ``blocks.1``) is reported as a
first divergence "inside the compiled region Net" naming ``compile_mode: shadow``, which then
names ``blocks.1``'s LayerNorm. Training stays bit-identical with the tool on.

Real torch.compile (inductor, CPU); each run compiles once (``torch._dynamo.reset()`` first:
dynamo does not guard on module hooks), all runs shared by the module's tests.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Dict, List, Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from ts_core import PrecisionDebugger  # noqa: E402
from ts_core.compare import compare  # noqa: E402
from ts_core.compare.report.text import terminal_text  # noqa: E402

from ..conftest import load_dump  # noqa: E402

STEPS = 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.layer_norm = nn.LayerNorm(8)

    def forward(self, x):
        return F.gelu(self.layer_norm(self.fc(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def train(dump: Optional[str], bug: bool = False, mode: str = "", level: str = "mix",
          compiled: bool = True) -> Dict[str, List[torch.Tensor]]:
    """STEPS AdamW steps of ``torch.compile(Net())`` (started as the compiled model; the plain
    model with `compiled` False), the tool at `level` on every step when `dump`; `bug`: LayerNorm
    eps of blocks.1 set to 1e-1."""
    torch.manual_seed(0)
    model = Net()
    if bug:
        model.blocks[1].layer_norm.eps = 1e-1
    x, y = torch.randn(5, 8), torch.randn(5, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch._dynamo.reset()
    fn = torch.compile(model) if compiled else model
    dbg = None
    if dump:
        dbg = PrecisionDebugger(dump_path=dump, level=level, step=list(range(STEPS)),
                                **({"compile_mode": mode} if mode else {}))
    out: Dict[str, List[torch.Tensor]] = {"loss": [], "grads": []}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TSPROBE_COMPILE", raising=False)
        with pytest.warns(RuntimeWarning) if dump and compiled and not mode else contextlib.nullcontext():
            for _ in range(STEPS):
                if dbg:
                    dbg.start(fn)
                loss = F.mse_loss(fn(x), y)
                loss.backward()
                out["loss"].append(loss.detach().clone())
                out["grads"] += [p.grad.clone() for p in model.parameters()]
                opt.step()
                opt.zero_grad()
                if dbg:
                    dbg.stop()
                    dbg.step()
            if dbg:
                dbg.close()
    out["params"] = [p.detach().clone() for p in model.parameters()]
    out["xy"] = [x, y]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("region")
    got = {"ref": (None, train(None))}
    for name, bug, mode, level in (("clean", False, "", "mix"), ("clean2", False, "", "mix"), ("bug", True, "", "mix"),
                                   ("clean-L1", False, "", "L1"), ("bug-L1", True, "", "L1"),
                                   ("shadow", False, "shadow", "mix"), ("shadow-bug", True, "shadow", "mix")):
        path = str(root / name)
        got[name] = (path, train(path, bug, mode, level))
    got["eager"] = (str(root / "eager"), train(str(root / "eager"), compiled=False))
    return got


def _data(path: str, step: int = 0) -> dict:
    return load_dump(os.path.join(path, f"step{step}", "rank"))["data"]


@pytest.mark.parametrize("name", ["clean", "clean-L1", "shadow"])
def test_training_is_bit_identical_with_the_tool_on(runs, name):
    ref, got = runs["ref"][1], runs[name][1]
    for part in ("loss", "grads", "params"):
        assert len(ref[part]) == len(got[part]) > 0
        assert all(torch.equal(a, b) for a, b in zip(ref[part], got[part])), part


def test_the_compiled_region_is_recorded_at_its_boundary(runs):
    path, run = runs["clean"]
    for step in range(STEPS):
        data = _data(path, step)
        assert "Module.Net.forward.0" in data and "Module.Net.backward.0" in data
        # nothing inside the region: no module forward but the boundary's
        assert [k for k in data if k.startswith("Module.") and ".forward." in k] == ["Module.Net.forward.0"]
    # step 0's boundary values against an independent numpy forward of the initial model, and
    # its output gradient against autograd's gradient of mse_loss at that output
    torch.manual_seed(0)
    p = {k: v.detach().double().numpy() for k, v in Net().state_dict().items()}
    x, y = (t.double().numpy() for t in run["xy"])
    h = x
    for i in range(2):
        h = h @ p[f"blocks.{i}.fc.weight"].T + p[f"blocks.{i}.fc.bias"]
        h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
        h = h * p[f"blocks.{i}.layer_norm.weight"] + p[f"blocks.{i}.layer_norm.bias"]
        h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
    out = h @ p["head.weight"].T + p["head.bias"]
    data = _data(path)
    rec = data["Module.Net.forward.0"]
    assert rec["input_args"][0]["shape"] == [5, 8]
    np.testing.assert_allclose(rec["input_args"][0]["Norm"], np.sqrt((x * x).sum()), rtol=1e-6)
    got = rec["output"][0]
    np.testing.assert_allclose([got["Max"], got["Min"], got["Mean"]], [out.max(), out.min(), out.mean()],
                               rtol=1e-4, atol=1e-5)
    grad = data["Module.Net.backward.0"]["input"][0]       # the gradient arriving at the region's output
    want = 2 * (out - y) / out.size
    np.testing.assert_allclose(grad["Norm"], np.sqrt((want * want).sum()), rtol=1e-4)


def test_a_clean_compiled_pair_passes(runs, tmp_path):
    r = compare(runs["clean"][0], runs["clean2"][0], str(tmp_path / "out"), verbose=False)
    assert r.first_divergence is None
    assert r.counts["error"] == r.counts["warning"] == 0
    assert r.counts["unmatched_golden"] == r.counts["unmatched_target"] == 0


@pytest.mark.parametrize("level", ["mix", "L1"])
def test_a_bug_inside_the_region_is_said_to_lie_inside_it_naming_shadow(runs, tmp_path, level):
    suffix = "" if level == "mix" else "-" + level
    r = compare(runs["clean" + suffix][0], runs["bug" + suffix][0], str(tmp_path / "out"), verbose=False)
    fd = r.first_divergence
    assert fd is not None and (fd.key, fd.direction) == ("Module.Net.forward.0", "forward")
    assert "inside the compiled region Net" in fd.cause and "compile_mode: shadow" in fd.cause
    assert "inside the compiled region Net" in terminal_text(r)


def test_with_shadow_the_same_bug_is_named_at_the_layer_norm_of_blocks_1(runs, tmp_path):
    r = compare(runs["shadow"][0], runs["shadow-bug"][0], str(tmp_path / "out"), verbose=False)
    fd = r.first_divergence
    assert fd is not None
    # at mix: the layer_norm API call of blocks.1 (its second), inside that module's record
    assert (fd.key, fd.module) == ("Functional.layer_norm.1.forward", "Module.blocks.1.layer_norm.LayerNorm.forward.0")
    assert "compiled region" not in fd.cause


def test_against_an_eager_run_the_same_bug_is_said_to_lie_inside_the_region(runs, tmp_path):
    """Eager golden (every module recorded, no root record) against the compiled run: the same
    program (the lone boundary record is no foreign module tree), and the eager side's module
    that feeds the differing loss lies inside the region."""
    r = compare(runs["eager"][0], runs["clean"][0], str(tmp_path / "clean"), verbose=False)
    assert r.pairs[0].same_program and r.first_divergence is None and r.counts["error"] == 0
    r = compare(runs["eager"][0], runs["bug"][0], str(tmp_path / "bug"), verbose=False)
    fd = r.first_divergence
    assert fd is not None and fd.target_key is None and fd.key.startswith("Module."), fd.key
    assert "inside the compiled region Net" in fd.cause and "compile_mode: shadow" in fd.cause
