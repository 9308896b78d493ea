"""The public API beyond start/stop/step: nesting, real-model coverage, distributed collectives,
custom APIs, debug-level save, seed_all."""
import os
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ts_core import ConfigError, PrecisionDebugger, seed_all

from ..conftest import load_dump, require


def _data(dump_root, rank="rank", step=0):
    return load_dump(os.path.join(dump_root, f"step{step}", rank))["data"]


def test_api_called_inside_another_api_is_recorded_once_at_the_outer_call(dump_root):
    x = torch.randn(3, 4, requires_grad=True)
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0])
    dbg.start()
    F.layer_norm(x, (4,)).sum().backward()    # F.layer_norm calls torch.layer_norm inside
    dbg.stop()
    dbg.close()
    assert set(_data(dump_root)) == {"Functional.layer_norm.0.forward", "Functional.layer_norm.0.backward",
                                     "Tensor.sum.0.forward", "Tensor.sum.0.backward"}


@require("transformers")
def test_default_api_list_covers_llama(dump_root):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=50, max_position_embeddings=64,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 50, (2, 8))
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0])
    dbg.start(model)
    model(input_ids=ids, labels=ids).loss.backward()
    dbg.stop()
    dbg.close()
    data = _data(dump_root)
    apis = {k.rsplit(".", 2)[0] for k in data if not k.startswith("Module.")}
    for expected in ("Functional.embedding", "Functional.linear", "Functional.silu", "Torch.rsqrt",
                     "Functional.scaled_dot_product_attention", "Tensor.__neg__", "Torch.cat",
                     "Functional.cross_entropy"):
        assert expected in apis
    assert "Module.model.layers.0.mlp.down_proj.Linear.backward.0" in data
    assert "Functional.silu.0.backward" in data


def test_distributed_collectives_and_rank_folder(dump_root, tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0])
        t = torch.arange(4.0)
        out = torch.zeros(4)
        dbg.start()
        dist.all_reduce(t)
        torch.add(out, 1)                   # out's statistics are now known (zeros) ...
        dist.all_to_all_single(out, torch.arange(4.0) + 5)
        assert out._version == 0            # ... and the collective rewrote it without a version bump
        torch.add(out, 1)
        dbg.stop()
        dbg.close()
    finally:
        dist.destroy_process_group()
    data = _data(dump_root, rank="rank0")
    rec = data["Distributed.all_reduce.0.forward"]
    assert rec["input_args"][0]["Max"] == 3.0
    before, after = (data[f"Torch.add.{i}.forward"]["input_args"][0] for i in (0, 1))
    assert (before["Max"], before["Min"]) == (0.0, 0.0)
    assert (after["Max"], after["Min"], after["Mean"]) == (8.0, 5.0, 6.5)     # not the cached zeros


def test_record_param_grads_reads_gradients_written_without_a_version_bump(dump_root):
    """DDP's reducer (gradient_as_bucket_view) and in-place collectives write .grad without moving
    its version counter: record_param_grads() must summarise what .grad holds now."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    dbg = PrecisionDebugger(dump_path=dump_root, level="L0", step=[0])
    dbg.start(model)
    model(torch.ones(1, 3)).sum().backward()
    grad = model[0].weight.grad
    version = grad._version
    grad.numpy()[...] = 7.0                 # written behind autograd's back, as a collective does
    assert grad._version == version
    dbg.record_param_grads()
    dbg.stop()
    dbg.close()
    data = _data(dump_root)
    (weight,) = data["Module.0.Linear.parameters_grad.0"]["weight"]
    assert (weight["Max"], weight["Min"], weight["Mean"]) == (7.0, 7.0, 7.0)


def test_register_and_restore_custom_api(dump_root):
    import types

    lib = types.ModuleType("mylib")
    lib.__name__ = "mylib"
    lib.scale = lambda t, k: t * k
    original = lib.scale
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0, 1])
    dbg.register_custom_api(lib, "scale", "MyLib")
    dbg.start()
    lib.scale(torch.ones(2), 3)
    dbg.stop()
    dbg.step()
    dbg.restore_custom_api(lib, "scale")
    assert lib.scale is original
    dbg.start()
    lib.scale(torch.ones(2), 3)
    dbg.stop()
    dbg.close()
    assert "MyLib.scale.0.forward" in _data(dump_root, step=0)
    assert "MyLib.scale.0.forward" not in _data(dump_root, step=1)
    with pytest.raises(AttributeError, match="no callable 'nope'"):
        PrecisionDebugger(dump_path=dump_root).register_custom_api(lib, "nope")


def test_debug_level_save_forward_and_gradient(dump_root):
    w = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    dbg = PrecisionDebugger(dump_path=dump_root, level="debug", step=[0])
    dbg.start()
    h = w * 2
    dbg.save(h, "hidden")
    dbg.save({"w": w, "n": 7}, "state", save_backward=False)
    (h ** 2).sum().backward()
    dbg.stop()
    dbg.close()
    data = _data(dump_root)
    assert set(data) == {"hidden.0.debug", "hidden_grad.0.debug", "state.0.debug"}
    assert data["hidden.0.debug"]["Max"] == 6.0
    assert data["hidden_grad.0.debug"]["Max"] == pytest.approx(12.0)   # d/dh sum(h^2) = 2h
    assert data["state.0.debug"]["n"] == {"type": "int", "value": 7}


@pytest.mark.parametrize("with_start", [True, False])
def test_debug_save_numbering_restarts_every_step(dump_root, with_start):
    """Each step folder numbers its saves from 0, also when start() opened the folder."""
    lin = torch.nn.Linear(2, 2)
    dbg = PrecisionDebugger(dump_path=dump_root, level="debug", step=[0, 1, 2])
    values = {}
    for step in range(3):
        if with_start:
            dbg.start(lin)
        x = torch.full((2, 2), float(step + 1), requires_grad=True)
        dbg.save(x, "x")
        dbg.save(x * 3, "x", save_backward=False)
        lin(x).sum().backward()
        if with_start:
            dbg.stop()
        dbg.step()
        values[step] = float(step + 1)
    dbg.close()
    for step, v in values.items():
        data = _data(dump_root, step=step)
        assert set(data) == {"x.0.debug", "x.1.debug", "x_grad.0.debug"}, (step, sorted(data))
        assert data["x.0.debug"]["Max"] == v and data["x.1.debug"]["Max"] == 3 * v
        # d/dx sum(lin(x)) = column sums of the weight, the same every step
        np.testing.assert_allclose(data["x_grad.0.debug"]["Max"], lin.weight.sum(0).max().item(), rtol=1e-6)


def test_save_outside_debug_level_warns_and_records_nothing(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0])
    with pytest.warns(UserWarning, match="level 'debug'"):
        dbg.save(torch.ones(1), "x")
    dbg.close()


def test_token_range_counts_root_forward_calls(dump_root):
    lin = torch.nn.Sequential(torch.nn.Linear(3, 3))
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0])
    dbg.start(lin, token_range=[1, 2])
    with torch.no_grad():
        for _ in range(5):
            lin(torch.ones(1, 3))
    dbg.stop()
    dbg.close()
    fwd = sorted(k for k in _data(dump_root) if k.startswith("Module.") and k.endswith(("0", "1", "2", "3")))
    # iterations 1 and 2 only: the module's calls are numbered within the collected window
    assert fwd == ["Module.0.Linear.forward.0", "Module.0.Linear.forward.1"]
    with pytest.raises(ValueError, match="needs the model"):
        PrecisionDebugger(dump_path=dump_root).start(token_range=[0, 1])


def test_seed_all_repeats_random_streams_and_removes_dropout():
    seed_all(7)
    a = (random.random(), np.random.rand(), torch.rand(3))
    seed_all(7)
    b = (random.random(), np.random.rand(), torch.rand(3))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])
    assert os.environ["PYTHONHASHSEED"] == "7"
    drop = torch.nn.Dropout(p=0.9).train()
    x = torch.ones(1000)
    from ts_core.backends.torch.seed import restore_dropout

    try:
        seed_all(7, rm_dropout=True)
        assert torch.equal(drop(x), x)
        assert torch.equal(F.dropout2d(torch.ones(1, 2, 3, 3), 0.9), torch.ones(1, 2, 3, 3))
    finally:
        restore_dropout()
    assert not torch.equal(drop(x), x)
    with pytest.raises(ValueError, match="seed must be an int"):
        seed_all(-1)


def test_closed_debugger_refuses_to_start(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root)
    dbg.close()
    with pytest.raises(RuntimeError, match="closed"):
        dbg.start()
    with pytest.raises(ConfigError):
        dbg.set_init_step(-1)
