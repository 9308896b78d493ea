"""torch.compile (inductor on CPU) with the tool on: no crash at L0/L1/mix, bit-identical numbers,
module-level records checked against numpy, and a compiled run compared with an eager one, in
the three modes (``TSPROBE_COMPILE``): ``boundaries`` (default: nothing inside a compiled region
is hooked; a compiled submodule is recorded at its boundary), ``modules`` (graph breaks at every
hooked module) and ``shadow`` (an eager re-run of the compiled root records its modules).

Compiling is the slow part (seconds per compile even with inductor's cache): each run is a
module-scoped fixture, so every configuration compiles once. ``torch._dynamo.reset()`` before
each compiled run: dynamo does not guard on module hooks (``skip_nnmodule_hook_guards``), so code
compiled for one run's hooks would otherwise be reused by the next.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ts_core import PrecisionDebugger
from ts_core.backends.torch.compiled import COMPILE_ENV
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
          kind: str = "plain", bug: bool = False, summary_mode: Optional[str] = None,
          mode: str = "boundaries") -> Run:
    """2 AdamW steps of Net, compiled with `compiled` (torch.compile kwargs) or eager. `kind`:
    "partial" compiles only its LayerNorm, "inplace" calls ``model.ln.compile()``, "bf16" runs
    under bf16 autocast. The tool records steps 0 and 1 at `level` (None: no tool) in compile
    `mode`. `bug`: a planted bug (GELU's tanh approximation; with "partial", the compiled
    LayerNorm's eps)."""
    torch.manual_seed(0)
    model = Net(graph_break=kind == "graphbreak")
    if bug and kind == "partial":
        model.ln.eps = 1e-2
    elif bug:
        model.act.approximate = "tanh"
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fn = model
    if compiled is not None:
        torch._dynamo.reset()
        if kind == "partial":
            model.ln = torch.compile(model.ln, **compiled)
        elif kind == "inplace":
            model.ln.compile(**compiled)          # a torch module compiled in place
        else:
            fn = torch.compile(model, **compiled)
    dump = None
    dbg = None
    before = os.environ.get(COMPILE_ENV)
    os.environ[COMPILE_ENV] = mode         # read when the hooks are made (start)
    try:
        if level is not None:
            dump = str(tmp.mktemp(name))
            if level == "monitor":
                dbg = PrecisionDebugger(dump_path=dump, monitor={"backward": True})
            else:
                kw = {"summary_mode": summary_mode} if summary_mode else {}
                dbg = PrecisionDebugger(dump_path=dump, task=task, level=level, step=list(range(STEPS)), **kw)
        losses, grads = [], []
        for _ in range(STEPS):
            if dbg is not None:
                dbg.start(model)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "bf16"):
                out = fn(x)
            loss = F.mse_loss(out.float(), y)
            loss.backward()
            grads.append({_plain(n): p.grad.detach().clone() for n, p in model.named_parameters()})
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().clone())
            if dbg is not None:
                dbg.stop()
                dbg.step(loss=loss) if level == "monitor" else dbg.step()
        if dbg is not None:
            dbg.close()
    finally:
        if before is None:
            os.environ.pop(COMPILE_ENV, None)
        else:
            os.environ[COMPILE_ENV] = before
    params = {_plain(n): p.detach().clone() for n, p in model.named_parameters()}
    return Run(losses, grads, params, {_plain(n): v for n, v in init.items()}, x, dump)


def _plain(name: str) -> str:
    return name.replace("._orig_mod", "")


DEFAULT = {}
FULLGRAPH = {"fullgraph": True}
CASES = {   # name -> (mode, level, task, summary_mode, compile kwargs, model kind)
    "L0-tensor": ("boundaries", "L0", "tensor", None, DEFAULT, "plain"),
    "L1-statistics": ("boundaries", "L1", "statistics", None, DEFAULT, "plain"),
    "mix-md5": ("boundaries", "mix", "statistics", "md5", DEFAULT, "plain"),
    "graphbreak-mix": ("boundaries", "mix", "statistics", None, DEFAULT, "graphbreak"),
    "partial-L0": ("boundaries", "L0", "tensor", None, DEFAULT, "partial"),
    "modules-mix": ("modules", "mix", "statistics", None, DEFAULT, "plain"),
    "modules-L0-tensor": ("modules", "L0", "tensor", None, DEFAULT, "plain"),
    "modules-fullgraph-mix": ("modules", "mix", "statistics", None, FULLGRAPH, "plain"),
    "modules-graphbreak-L1": ("modules", "L1", "statistics", None, DEFAULT, "graphbreak"),
    "inplace-L1": ("boundaries", "L1", "statistics", None, DEFAULT, "inplace"),
    "bf16-mix": ("boundaries", "mix", "statistics", None, DEFAULT, "bf16"),    # modules mode moves these
    "monitor": ("boundaries", "monitor", "statistics", None, DEFAULT, "plain"),
    "modules-monitor": ("modules", "monitor", "statistics", None, DEFAULT, "plain"),
    "shadow-L0-tensor": ("shadow", "L0", "tensor", None, DEFAULT, "plain"),
    "shadow-bf16-mix": ("shadow", "mix", "statistics", None, DEFAULT, "bf16"),
    "shadow-fullgraph-mix": ("shadow", "mix", "statistics", None, FULLGRAPH, "plain"),
}


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """Runs without the tool: compiled (default, fullgraph, with a graph break, LayerNorm only)."""
    return {kind: train(tmp_path_factory, "ref", compiled=kw, kind=kind.split("-")[0])
            for kind, kw in (("plain", DEFAULT), ("plain-fullgraph", FULLGRAPH), ("graphbreak", DEFAULT),
                             ("partial", DEFAULT), ("inplace", DEFAULT), ("bf16", DEFAULT))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {name: train(tmp_path_factory, name, level, task, compiled=kw, kind=kind, summary_mode=sm, mode=mode)
            for name, (mode, level, task, sm, kw, kind) in CASES.items()}


def _ref_of(name: str) -> str:
    _, _, _, _, kw, kind = CASES[name]
    return "plain-fullgraph" if kw is FULLGRAPH else kind


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
PARAM_GRADS = {"Module.fc1.Linear.parameters_grad.0", "Module.ln.LayerNorm.parameters_grad.0",
               "Module.fc2.Linear.parameters_grad.0"}


@pytest.mark.parametrize("name", ["partial-L0", "modules-mix", "modules-L0-tensor", "shadow-L0-tensor",
                                  "shadow-bf16-mix", "shadow-fullgraph-mix"])
def test_modules_are_recorded_forward_backward_and_parameter_gradients(runs, name):
    for step in range(STEPS):
        data = _data(runs[name], step)
        for m in MODULES:
            assert f"{m}.forward.0" in data and f"{m}.backward.0" in data, (name, step, m)
        assert PARAM_GRADS <= set(data)
        for key in PARAM_GRADS:
            assert set(data[key]) == {"weight", "bias"}


@pytest.mark.parametrize("name", ["L0-tensor", "mix-md5", "graphbreak-mix", "modules-fullgraph-mix"])
def test_by_default_nothing_inside_a_compiled_region_is_hooked_parameter_gradients_are_recorded(runs, name):
    for step in range(STEPS):
        data = _data(runs[name], step)
        assert not any(k.startswith("Module.") and ".forward." in k for k in data), name
        assert {k for k in data if k.endswith("parameters_grad.0")} == PARAM_GRADS
    if name == "mix-md5":
        assert all("md5" in s for rec in data[min(PARAM_GRADS)].values() for s in rec)


def test_inside_a_compiled_region_api_calls_are_not_recorded_but_the_eager_ones_are(runs):
    for name in ("modules-mix", "mix-md5", "modules-graphbreak-L1"):
        data = _data(runs[name])
        assert not any(k.startswith(("Functional.linear", "Functional.layer_norm", "Functional.gelu"))
                       for k in data), name
        assert "Functional.mse_loss.0.forward" in data and "Functional.mse_loss.0.backward" in data
        # torch.compile's own runtime calls (AOTAutograd's backward prologue calls Tensor.stride)
        assert not any(k.startswith("Tensor.stride") for k in data)
    assert not any(k.startswith("Module.") for k in _data(runs["L1-statistics"]))


def _stats(a: np.ndarray) -> List[float]:
    a = a.astype(np.float64)
    return [a.max(), a.min(), a.mean(), float(np.sqrt((a * a).sum()))]


def _recorded(summary: dict) -> List[float]:
    return [summary["Max"], summary["Min"], summary["Mean"], summary["Norm"]]


def test_module_statistics_equal_an_independent_numpy_forward(runs):
    run = runs["modules-mix"]
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
            np.testing.assert_allclose(_recorded(rec[pname][0]), want, rtol=1e-6, atol=1e-7)   # a mean of ~0 from float32 sums


@pytest.fixture(scope="module")
def eager_l0(tmp_path_factory):
    return train(tmp_path_factory, "eager", "L0", "tensor")


@pytest.mark.parametrize("name", ["partial-L0", "modules-L0-tensor", "shadow-L0-tensor"])
def test_compiled_run_compares_clean_with_the_eager_run(runs, eager_l0, tmp_path, name):
    r = compare(eager_l0.dump, runs[name].dump, str(tmp_path / "out"), verbose=False)
    assert r.first_divergence is None
    assert r.counts["error"] == r.counts["warning"] == 0
    assert r.counts["unmatched_golden"] == r.counts["unmatched_target"] == 0
    assert r.counts["matched"] >= STEPS * (len(MODULES) * 2 + len(PARAM_GRADS))


@pytest.mark.parametrize("kind,mode,key", [("partial", "boundaries", "Module.ln.LayerNorm.forward.0"),
                                           ("plain", "modules", "Module.act.GELU.forward.0"),
                                           ("plain", "shadow", "Module.act.GELU.forward.0")])
def test_a_bug_in_one_module_of_the_compiled_run_is_named_at_that_module(eager_l0, tmp_path_factory, tmp_path,
                                                                           kind, mode, key):
    buggy = train(tmp_path_factory, "bug", "L0", "tensor", compiled=DEFAULT, kind=kind, bug=True, mode=mode)
    fd = compare(eager_l0.dump, buggy.dump, str(tmp_path / "out"), verbose=False).first_divergence
    assert fd is not None
    assert (fd.key, fd.direction) == (key, "forward")


@pytest.mark.parametrize("name", ["monitor", "modules-monitor"])
def test_monitor_mode_runs_every_step_of_a_compiled_model(runs, name):
    with open(os.path.join(runs[name].dump, "monitor.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == STEPS
    assert all(r["nonfinite"]["parameters_grad"] == 0 for r in rows)


def test_an_eager_run_never_imports_dynamo_and_a_later_compile_records_no_compiler_calls(tmp_path):
    """Importing torch._dynamo costs seconds: tsprobe leaves it to torch.compile. A model compiled
    after start() (in a fresh process, so inductor is imported while the API wrappers are
    installed and its generated code calls them) records no call of torch.compile's own."""
    code = f"""
import sys, json, torch
from ts_core import PrecisionDebugger
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
dbg = PrecisionDebugger(dump_path={str(tmp_path)!r}, level="L1", step=[0, 1])
dbg.start(m); m(torch.randn(2, 4)).sum().backward(); dbg.stop(); dbg.step()
print("torch._dynamo" in sys.modules)
dbg.start(m); torch.compile(m)(torch.randn(2, 4)).sum().backward(); dbg.stop(); dbg.step(); dbg.close()
print(sorted(json.load(open({str(tmp_path / "step1" / "rank" / "dump.json")!r}))["data"]))
"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TSPROBE_QUIET="1", PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == "False", out.stdout + out.stderr
    assert lines[-1] == str(["Tensor.sum.0.backward", "Tensor.sum.0.forward"]), out.stdout + out.stderr


class BNDropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.drop(F.gelu(self.bn(self.fc1(x)))))


def test_shadow_leaves_buffers_and_random_numbers_as_they_were(tmp_path):
    """The eager re-run must not touch BatchNorm's running statistics (values or version
    counters, which the compiled graph saved) nor the RNG stream (dropout)."""
    def run(dump):
        torch.manual_seed(0)
        model = BNDropNet()
        x, y = torch.randn(6, 8), torch.randn(6, 4)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        torch._dynamo.reset()
        fn = torch.compile(model)
        dbg = PrecisionDebugger(dump_path=dump, task="statistics", level="L0", step=[0, 1, 2],
                                compile_mode="shadow") if dump else None      # the config field, not the env
        out = []
        for _ in range(3):
            if dbg:
                dbg.start(model)
            loss = F.mse_loss(fn(x), y)
            loss.backward()
            out += [loss.detach()] + [p.grad.clone() for p in model.parameters()]
            opt.step()
            opt.zero_grad()
            if dbg:
                dbg.stop()
                dbg.step()
        if dbg:
            dbg.close()
        return out + [b.clone() for b in model.buffers()] + [torch.rand(3)]

    ref = run(None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(COMPILE_ENV, "boundaries")     # the config's compile_mode wins over the environment
        got = run(str(tmp_path / "dump"))
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    data = load_dump(str(tmp_path / "dump" / "step2" / "rank"))["data"]
    assert "Module.bn.BatchNorm1d.forward.0" in data and "Module.bn.BatchNorm1d.backward.0" in data
