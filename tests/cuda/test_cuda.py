"""On a CUDA GPU, the same records and numbers as on the CPU (issue 37, items 1 and 4).

Run with ``pytest -m cuda`` (``benchmarks/gpu_check.sh`` on a lent GPU); without a GPU every test
here skips, saying why (tests/conftest.py). CPU proxies of the same properties run everywhere:
tests/core/test_device_independence.py (threads, the device statistics path, optimizers) and
tests/core/test_wrapped_names.py (FSDP1 on gloo, checkpointing, compile names).
"""
from __future__ import annotations

import itertools
import json
import os
import socket

import pytest

torch = pytest.importorskip("torch")

from ts_core.compare import compare  # noqa: E402

from ..conftest import load_dump, require  # noqa: E402
from ..core.device_program import dump_step  # noqa: E402

pytestmark = pytest.mark.cuda

LEVELS, MODES = ("L0", "L1", "mix"), ("statistics", "md5", "tensor")
# every level x mode once, dropout and deterministic algorithms each on and off across them
CASES = [(lv, md, drop, det) for (lv, md), (drop, det) in
         zip(itertools.product(LEVELS, MODES), itertools.cycle([(0.0, True), (0.1, True), (0.0, False), (0.1, False)]))]


@pytest.fixture(autouse=True)
def _deterministic_cublas(monkeypatch):
    """Deterministic cuBLAS for these tests only (set at import, it leaked into every later test
    of the session: config-check's environment tests then saw it on both sides)."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"))


def _data(root: str) -> dict:
    return load_dump(os.path.join(root, "step1", "rank"))["data"]


@require("transformers")
@pytest.mark.parametrize("level,mode,dropout,det", CASES)
def test_cuda_dump_holds_the_cpu_dumps_records_and_values(tmp_path, level, mode, dropout, det):
    cpu, gpu = str(tmp_path / "cpu"), str(tmp_path / "cuda")
    a = dump_step(cpu, level, mode, dropout, det, device="cpu")
    b = dump_step(gpu, level, mode, dropout, det, device="cuda")
    da, db = _data(cpu), _data(gpu)
    assert [k for k in da if "parameters_grad" not in k] == [k for k in db if "parameters_grad" not in k]
    assert set(da) == set(db)
    if dropout or mode == "md5":
        return           # dropout: the devices draw different random streams; md5: float bits differ
    for k in ("Module.transformer.ln_f.LayerNorm.forward.0", "Functional.layer_norm.4.forward"):
        if k in da and da[k]["output"][0].get("Max") is not None:     # statistics within float tolerance
            assert da[k]["output"][0]["Max"] == pytest.approx(db[k]["output"][0]["Max"], rel=1e-4, abs=1e-5)
    assert torch.allclose(a["loss"], b["loss"], rtol=1e-4, atol=1e-5)
    r = compare(cpu, gpu, verbose=False)
    assert r.verdict == "pass", r.pairs[0].note


@require("transformers")
def test_with_dropout_the_first_divergence_is_a_dropout(tmp_path):
    cpu, gpu = str(tmp_path / "cpu"), str(tmp_path / "cuda")
    dump_step(cpu, "mix", "statistics", 0.1, True, device="cpu")
    dump_step(gpu, "mix", "statistics", 0.1, True, device="cuda")
    fd = compare(cpu, gpu, verbose=False).first_divergence
    assert fd is not None and "dropout" in fd.key.lower(), fd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("orig_params", [False, True])
def test_fsdp1_on_nccl_compares_pass_with_the_plain_run(tmp_path, orig_params):
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from ..core.test_wrapped_names import Block, Net
    from ts_core import PrecisionDebugger

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        losses = {}
        for name in ("plain", "fsdp1"):
            torch.manual_seed(0)
            model = Net().cuda()
            if name == "fsdp1":
                model = FSDP(model, device_id=torch.cuda.current_device(), auto_wrap_policy=ModuleWrapPolicy({Block}),
                             use_orig_params=orig_params)
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).cuda()
            dbg = PrecisionDebugger(dump_path=str(tmp_path / name), level="mix", step=[0])
            dbg.start(model)
            loss = model(x).pow(2).mean()
            loss.backward()
            dbg.stop()
            dbg.step()
            dbg.close()
            losses[name] = loss.detach()
        assert torch.equal(losses["plain"], losses["fsdp1"])
        r = compare(str(tmp_path / "plain"), str(tmp_path / "fsdp1"), verbose=False)
        assert r.verdict == "pass", r.pairs[0].note
    finally:
        dist.destroy_process_group()


def test_a_compiled_model_on_cuda_is_never_dumped_empty_in_silence(tmp_path):
    """torch.compile (inductor, CUDA) of the whole model at L1 in the default mode: the dump says
    why it holds no call of the model, and names the option that records it."""
    from ..core.test_wrapped_names import Net
    from ts_core import PrecisionDebugger

    torch.manual_seed(0)
    model = torch.compile(Net().cuda())
    x = torch.randn(4, 6, device="cuda")
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", step=[0])
    dbg.start(model)
    with pytest.warns(RuntimeWarning, match="compile"):
        model(x).pow(2).mean().backward()
        dbg.stop()
        dbg.step()
    dbg.close()
    head = load_dump(os.path.join(str(tmp_path / "d"), "step0", "rank"))
    assert any("compile_mode" in n for n in head.get("notes", [])), json.dumps(head)[:500]


def test_shadow_mode_keeps_a_compiled_cuda_model_with_dropout_bit_identical(tmp_path):
    """The shadow's eager re-run draws its dropout from forked CUDA streams: the compiled
    training's next random numbers, so its losses, are those of the run without the tool."""
    from ts_core import PrecisionDebugger

    def train(dump):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)).cuda()
        fn = torch.compile(model)
        x = torch.randn(16, 8, device="cuda")
        dbg = PrecisionDebugger(dump_path=dump, level="mix", step=[0, 1, 2], compile_mode="shadow") if dump else None
        losses = []
        for _ in range(3):
            if dbg:
                dbg.start(fn)
            loss = fn(x).pow(2).mean()
            loss.backward()
            losses.append(loss.detach())
            if dbg:
                dbg.stop()
                dbg.step()
        if dbg:
            dbg.close()
        return losses

    ref, got = train(None), train(str(tmp_path / "d"))
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    data = load_dump(os.path.join(str(tmp_path / "d"), "step0", "rank"))["data"]
    assert any(k.startswith("Module.1.Dropout.forward") for k in data)
