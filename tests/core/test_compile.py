"""torch.compile (inductor on CPU) with the tool on: no crash at L0/L1/mix, bit-identical numbers,
module-level records checked against numpy, and a compiled run compared with an eager one.

Compiling is the slow part (seconds per compile even with inductor's cache): each run is a
module-scoped fixture, so every configuration compiles once. ``torch._dynamo.reset()`` before
each compiled run: dynamo does not guard on module hooks (``skip_nnmodule_hook_guards``), so code
compiled for one run's hooks would otherwise be reused by the next.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ts_core import PrecisionDebugger
from ts_core.compare import compare

from ..conftest import load_dump

STEPS = 2


class Net(nn.Module):
    def __init__(self, graph_break: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.ln = nn.LayerNorm(16)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(16, 4)
        self.graph_break = graph_break

    def forward(self, x):
        h = self.act(self.ln(self.fc1(x)))
        if self.graph_break:
            torch._dynamo.graph_break()          # the model's own graph break, inside the root
        return self.fc2(h)


@dataclass
class Run:
    losses: List[torch.Tensor]
    grads: List[Dict[str, torch.Tensor]]       # per step, before the optimizer step
    params: Dict[str, torch.Tensor]            # after the last step
    init: Dict[str, torch.Tensor]              # before the first step
    x: torch.Tensor
    dump: Optional[str]


def train(tmp, name: str, level: Optional[str] = None, task: str = "statistics", compiled: Optional[dict] = None,
          graph_break: bool = False, bug: bool = False, summary_mode: Optional[str] = None) -> Run:
    """2 AdamW steps of Net, compiled with `compiled` (torch.compile kwargs) or eager; the tool
    records steps 0 and 1 at `level` (None: no tool)."""
    torch.manual_seed(0)
    model = Net(graph_break)
    if bug:
        model.act.approximate = "tanh"          # a planted bug in one module
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if compiled is not None:
        torch._dynamo.reset()
    fn = torch.compile(model, **compiled) if compiled is not None else model
    dump = None
    dbg = None
    if level is not None:
        dump = str(tmp.mktemp(name))
        kw = {"summary_mode": summary_mode} if summary_mode else {}
        dbg = PrecisionDebugger(dump_path=dump, task=task, level=level, step=list(range(STEPS)), **kw)
    losses, grads = [], []
    for _ in range(STEPS):
        if dbg is not None:
            dbg.start(model)
        loss = F.mse_loss(fn(x), y)
        loss.backward()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().clone())
        if dbg is not None:
            dbg.stop()
            dbg.step()
    if dbg is not None:
        dbg.close()
    return Run(losses, grads, {n: p.detach().clone() for n, p in model.named_parameters()}, init, x, dump)


DEFAULT = {}
FULLGRAPH = {"fullgraph": True}
CASES = {   # name -> (level, task, summary_mode, compile kwargs, model with its own graph break)
    "L0-tensor": ("L0", "tensor", None, DEFAULT, False),
    "L1-statistics": ("L1", "statistics", None, DEFAULT, False),
    "mix-statistics": ("mix", "statistics", None, DEFAULT, False),
    "mix-md5": ("mix", "statistics", "md5", DEFAULT, False),
    "fullgraph-mix": ("mix", "statistics", None, FULLGRAPH, False),
    "graphbreak-mix": ("mix", "statistics", None, DEFAULT, True),
}


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """Runs without the tool: compiled (default, fullgraph, with a graph break) and eager."""
    return {"default": train(tmp_path_factory, "ref", compiled=DEFAULT),
            "fullgraph": train(tmp_path_factory, "ref", compiled=FULLGRAPH),
            "graphbreak": train(tmp_path_factory, "ref", compiled=DEFAULT, graph_break=True)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, (level, task, mode, kw, gb) in CASES.items():
        out[name] = train(tmp_path_factory, name, level, task, compiled=kw, graph_break=gb, summary_mode=mode)
    return out


def _ref_of(name: str) -> str:
    return "fullgraph" if name.startswith("fullgraph") else "graphbreak" if name.startswith("graphbreak") else "default"


def _data(run: Run, step: int = 0) -> dict:
    return load_dump(os.path.join(run.dump, f"step{step}", "rank"))["data"]


@pytest.mark.parametrize("name", list(CASES))
def test_loss_grads_and_updated_parameters_are_bit_identical_with_the_tool_on(refs, runs, name):
    ref, got = refs[_ref_of(name)], runs[name]
    for a, b in zip(ref.losses, got.losses):
        assert torch.equal(a, b)
    for ga, gb in zip(ref.grads, got.grads):
        assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga), name
    assert all(torch.equal(ref.params[k], got.params[k]) for k in ref.params), name


MODULES = ["Module.fc1.Linear", "Module.ln.LayerNorm", "Module.act.GELU", "Module.fc2.Linear"]


@pytest.mark.parametrize("name", ["L0-tensor", "mix-statistics", "mix-md5", "graphbreak-mix"])
def test_compiled_modules_are_recorded_forward_backward_and_parameter_gradients(runs, name):
    for step in range(STEPS):
        data = _data(runs[name], step)
        for m in MODULES:
            assert f"{m}.forward.0" in data and f"{m}.backward.0" in data, (name, step, m)
        for m in ("Module.fc1.Linear", "Module.ln.LayerNorm", "Module.fc2.Linear"):
            assert set(data[f"{m}.parameters_grad.0"]) == {"weight", "bias"}
    if name == "mix-md5":
        assert all("md5" in o for o in data["Module.fc2.Linear.forward.0"]["output"])


def test_inside_a_compiled_region_api_calls_are_not_recorded_but_the_eager_ones_are(runs):
    data = _data(runs["mix-statistics"])
    assert not any(k.startswith(("Functional.linear", "Functional.layer_norm", "Functional.gelu")) for k in data)
    assert "Functional.mse_loss.0.forward" in data and "Functional.mse_loss.0.backward" in data
    # torch.compile's own runtime calls (AOTAutograd's backward prologue calls Tensor.stride)
    assert not any(k.startswith("Tensor.stride") for k in data)
    l1 = _data(runs["L1-statistics"])
    assert "Functional.mse_loss.0.forward" in l1 and not any(k.startswith("Module.") for k in l1)


def test_fullgraph_records_parameter_gradients_and_no_module_inside_the_graph(runs):
    data = _data(runs["fullgraph-mix"])
    assert not any(".forward." in k and k.startswith("Module.") for k in data)
    assert {k for k in data if k.endswith("parameters_grad.0")} == {
        "Module.fc1.Linear.parameters_grad.0", "Module.ln.LayerNorm.parameters_grad.0",
        "Module.fc2.Linear.parameters_grad.0"}
    assert "Functional.mse_loss.0.forward" in data


def _stats(a: np.ndarray) -> List[float]:
    a = a.astype(np.float64)
    return [a.max(), a.min(), a.mean(), float(np.sqrt((a * a).sum()))]


def _recorded(summary: dict) -> List[float]:
    return [summary["Max"], summary["Min"], summary["Mean"], summary["Norm"]]


def test_module_statistics_equal_an_independent_numpy_forward(runs):
    run = runs["mix-statistics"]
    data = _data(run)
    p = {k: v.double().numpy() for k, v in run.init.items()}
    x = run.x.double().numpy()
    h1 = x @ p["fc1.weight"].T + p["fc1.bias"]
    mu, var = h1.mean(-1, keepdims=True), h1.var(-1, keepdims=True)
    ln = (h1 - mu) / np.sqrt(var + 1e-5) * p["ln.weight"] + p["ln.bias"]
    act = 0.5 * ln * (1 + np.vectorize(math.erf)(ln / math.sqrt(2)))
    out = act @ p["fc2.weight"].T + p["fc2.bias"]
    for key, inp, outp in [("Module.fc1.Linear", x, h1), ("Module.ln.LayerNorm", h1, ln),
                           ("Module.act.GELU", ln, act), ("Module.fc2.Linear", act, out)]:
        rec = data[f"{key}.forward.0"]
        np.testing.assert_allclose(_recorded(rec["input_args"][0]), _stats(inp), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_recorded(rec["output"][0]), _stats(outp), rtol=1e-5, atol=1e-6)
    for key, prefix in [("Module.fc1.Linear", "fc1"), ("Module.ln.LayerNorm", "ln"), ("Module.fc2.Linear", "fc2")]:
        rec = data[f"{key}.parameters_grad.0"]
        for pname in ("weight", "bias"):
            want = _stats(run.grads[0][f"{prefix}.{pname}"].numpy())
            np.testing.assert_allclose(_recorded(rec[pname][0]), want, rtol=1e-6, atol=1e-9)


@pytest.fixture(scope="module")
def eager_l0(tmp_path_factory):
    return train(tmp_path_factory, "eager", "L0", "tensor")


def test_compiled_run_compares_clean_with_the_eager_run(runs, eager_l0, tmp_path):
    r = compare(eager_l0.dump, runs["L0-tensor"].dump, str(tmp_path / "out"), verbose=False)
    assert r.first_divergence is None
    assert r.counts["error"] == r.counts["warning"] == 0
    assert r.counts["unmatched_golden"] == r.counts["unmatched_target"] == 0
    assert r.counts["matched"] >= 2 * (len(MODULES) * 2 + 3)


def test_a_bug_in_one_module_of_the_compiled_run_is_named_at_that_module(eager_l0, tmp_path_factory, tmp_path):
    buggy = train(tmp_path_factory, "bug", "L0", "tensor", compiled=DEFAULT, bug=True)
    fd = compare(eager_l0.dump, buggy.dump, str(tmp_path / "out"), verbose=False).first_divergence
    assert fd is not None
    assert (fd.key, fd.direction) == ("Module.act.GELU.forward.0", "forward")
