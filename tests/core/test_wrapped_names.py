"""A model wrapped by FSDP1, activation checkpointing or torch.compile is recorded, and compared,
under the plain model's names (issue 37: ``compare plain fsdp1`` said "different programs").

The wrappers are real: FSDP1 (``FullyShardedDataParallel``) runs on CPU with gloo and world size
1 when given ``device_id=torch.device("cpu")`` (its "needs a non-CPU accelerator" check only
runs when it must guess the device; world size 1 makes it NO_SHARD, as on one GPU), with its flat
parameters (``use_orig_params=False``) and without; ``checkpoint_wrapper`` (non-reentrant, the
default); ``torch.compile`` (backend "eager": dynamo's OptimizedModule and ``_orig_mod`` without
inductor's compile time). tsprobe now names modules as the plain model has them; dumps named
by raw module paths (what msprobe and tsprobe before this change wrote) are made by hooking with
``named_modules`` paths, and compare must pair them with the plain run too.
"""
from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

from ts_core import PrecisionDebugger  # noqa: E402
from ts_core.backends.torch import access as torch_access  # noqa: E402
from ts_core.compare import compare  # noqa: E402

from ..conftest import load_dump  # noqa: E402


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.ln = nn.LayerNorm(6)

    def forward(self, x):
        return x + self.ln(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


@pytest.fixture(scope="module")
def gloo():
    """A one-process gloo group (FSDP1 needs one), torn down after this module's tests."""
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def wrap(model: Net, kind: str) -> nn.Module:
    if kind.startswith("fsdp1"):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FSDP(model, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({Block}),
                    use_orig_params=kind == "fsdp1_orig")
    if kind == "checkpoint":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing, checkpoint_wrapper)

        apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                       check_fn=lambda m: isinstance(m, Block))
        return model
    if kind == "compiled":
        model.blocks[1] = torch.compile(model.blocks[1], backend="eager")
        return model
    return model


def run(path, kind: str, level: str, compile_mode: str = ""):
    """One SGD step dumped at `level`; returns the loss, the gradients and the rank folder."""
    torch.manual_seed(0)
    model = wrap(Net(), kind)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    dbg = PrecisionDebugger(dump_path=str(path), level=level, step=[0],
                            **({"compile_mode": compile_mode} if compile_mode else {}))
    dbg.start(model)
    loss = model(x).pow(2).mean()
    loss.backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    grads = {n.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", ""): p.grad.clone()
             for n, p in model.named_parameters()}
    return loss.detach(), grads, os.path.join(str(path), "step0", "rank0")


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("kind", ["fsdp1_flat", "fsdp1_orig", "checkpoint"])
def test_wrapped_model_records_the_plain_models_records_and_compares_pass(gloo, tmp_path, kind, level):
    loss0, grads0, plain = run(tmp_path / "plain", "plain", level)
    loss1, grads1, wrapped = run(tmp_path / kind, kind, level)
    assert torch.equal(loss0, loss1)                       # the wrapper changed no number
    a, b = load_dump(plain)["data"], load_dump(wrapped)["data"]
    calls = [k for k in a if "parameters_grad" not in k]   # parameters_grad: in the order gradients came
    assert calls == [k for k in b if "parameters_grad" not in k] and set(a) == set(b)
    assert a == b                                          # values too, parameters and their gradients
    if level != "L1":
        assert set(b["Module.blocks.0.fc.Linear.parameters_grad.0"]) == {"weight", "bias"}
        assert set(b["Module.head.Linear.forward.0"]["parameters"]) == {"weight", "bias"}
        # against autograd's own gradient of the plain model (flat slices included)
        g = grads0["blocks.0.fc.weight"]
        assert b["Module.blocks.0.fc.Linear.parameters_grad.0"]["weight"][0]["Max"] == pytest.approx(g.max().item())
        assert b["Module.head.Linear.parameters_grad.0"]["bias"][0]["Norm"] == \
            pytest.approx(grads0["head.bias"].norm().item(), rel=1e-6)
    r = compare(str(tmp_path / "plain"), str(tmp_path / kind), verbose=False)
    assert r.verdict == "pass", r.pairs[0].note


@pytest.fixture
def raw_paths(monkeypatch):
    """Hook modules under their raw ``named_modules`` paths (wrapper segments and wrappers'
    own records kept), as msprobe and tsprobe before issue 37 named them."""
    monkeypatch.setattr(torch_access.TorchAccess, "submodules",
                        lambda self, model: ((p, m) for p, m in model.named_modules() if p))


@pytest.mark.parametrize("kind,level", [("fsdp1_orig", "mix"), ("checkpoint", "mix"), ("checkpoint", "L0"),
                                        ("compiled", "L0")])
def test_compare_pairs_raw_wrapper_names_with_the_plain_run(gloo, tmp_path, raw_paths, kind, level):
    # compiled: graph breaks at modules record the modules inside it (its API calls never are: L0)
    mode = "modules" if kind == "compiled" else ""
    run(tmp_path / "plain", "plain", level, mode)
    _, _, wrapped = run(tmp_path / kind, kind, level, mode)
    keys = list(load_dump(wrapped)["data"])
    segment = {"fsdp1_orig": "_fsdp_wrapped_module", "checkpoint": "_checkpoint_wrapped_module",
               "compiled": "_orig_mod"}[kind]
    assert any(f".{segment}." in k for k in keys)             # the raw names are there
    r = compare(str(tmp_path / "plain"), str(tmp_path / kind), verbose=False)
    assert r.verdict == "pass", r.pairs[0].note
    assert r.pairs[0].counts["unmatched_golden"] == r.pairs[0].counts["unmatched_target"] == 0


def test_raw_flat_parameters_are_reported_not_passed(gloo, tmp_path, raw_paths):
    """An old dump of FSDP1's flat parameters holds one flattened gradient per block: it cannot
    be split offline, and compare says those records have no partner (a warning), never pass."""
    run(tmp_path / "plain", "plain", "mix")
    _, _, wrapped = run(tmp_path / "flat", "fsdp1_flat", "mix")
    assert any("_flat_param" in rec for k, rec in load_dump(wrapped)["data"].items() if "parameters_grad" in k)
    r = compare(str(tmp_path / "plain"), str(tmp_path / "flat"), verbose=False)
    assert r.verdict == "warning"
    unmatched = {row.golden_key for row in r.rows if row.mode == "unmatched" and row.golden_key}
    assert "Module.blocks.0.fc.Linear.parameters_grad.0" in unmatched
