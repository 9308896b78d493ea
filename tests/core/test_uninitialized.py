"""Values read from memory nothing has written yet are recorded as ``"uninitialized": true``
(no statistics) and never compared (ts_core/backends/torch/uninit.py, issue 40).

transformers' DeepSeek-V3 attention fills ``key_states = kv.new_empty(...)`` in two halves,
each through a ``__getitem__`` slice and ``copy_``: the slices recorded before their copy read
whatever the allocator left there. Before this, two runs of one program "diverged" at that
``__getitem__`` and planted bugs were reported there too.
"""
from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from ts_core import PrecisionDebugger, seed_all  # noqa: E402
from ts_core.backends.torch import uninit  # noqa: E402
from ts_core.compare import compare  # noqa: E402

STATS = ("Max", "Min", "Mean", "Norm")


class Halves(torch.nn.Module):
    """The DeepSeek-V3 pattern, small: a buffer from new_empty filled half by half through
    slices, then read whole; plus a buffer filled by __setitem__ with a basic index."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        k = a.new_empty(*a.shape[:-1], 8)
        k[..., :4].copy_(a)
        k[..., 4:].copy_(b)
        s = torch.empty(x.shape[0], 8)
        s[:, :4] = a.detach()
        s[:, 4:] = b.detach()
        return (k * 2).sum() + s.sum()


def _dump(path, model, x, level="mix"):
    dbg = PrecisionDebugger(dump_path=str(path), task="statistics", level=level, step=[0])
    dbg.start(model)
    out = model(x)
    if out.requires_grad:
        out.backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    with open(os.path.join(str(path), "step0", "rank", "dump.json")) as f:
        return json.load(f)["data"]


def test_slices_of_a_buffer_read_before_their_copy_are_uninitialized_and_the_filled_buffer_is_not(tmp_path):
    torch.manual_seed(0)
    model, x = Halves(), torch.randn(2, 4)
    data = _dump(tmp_path / "d", model, x)
    first, second = data["Tensor.__getitem__.0.forward"], data["Tensor.__getitem__.1.forward"]
    for value in (first["input_args"][0], first["output"][0], second["input_args"][0], second["output"][0]):
        assert value["uninitialized"] is True and not set(STATS) & set(value), value
    assert value["shape"] == [2, 4] and value["dtype"] == "torch.float32"
    # read whole once both halves are written: real statistics, as numpy computes them
    mul = data["Tensor.__mul__.0.forward"]["input_args"][0]
    whole = torch.cat([model.a(x), model.b(x)], -1).detach().numpy()
    assert "uninitialized" not in mul and mul["Max"] == pytest.approx(float(whole.max()))
    assert mul["Norm"] == pytest.approx(float((whole.astype("float64") ** 2).sum() ** 0.5), rel=1e-6)
    # __setitem__ with a basic index: its target before the first write is unwritten, before the
    # second half-written (still unwritten), and the buffer afterwards (Tensor.sum's input) is not
    sets = [data[k]["input_args"][0] for k in ("Tensor.__setitem__.0.forward", "Tensor.__setitem__.1.forward")]
    assert all(v.get("uninitialized") for v in sets)
    summed = data["Tensor.sum.1.forward"]["input_args"][0]
    assert "uninitialized" not in summed and summed["Max"] == pytest.approx(float(whole.max()))
    assert not uninit.TRACKED                   # every buffer was written through, or let go at close


def test_a_write_tsprobe_does_not_see_counts_as_written(tmp_path):
    """An op writing through out= moves the version counter: the buffer is let go, never left out."""
    class OutWrite(torch.nn.Module):
        def forward(self, x):
            buf = torch.empty(x.shape)
            torch.mul(x, 3.0, out=buf)
            return buf[0].sum()

    x = torch.randn(3, 4)
    data = _dump(tmp_path / "d", OutWrite(), x)
    read = data["Tensor.__getitem__.0.forward"]["output"][0]
    assert "uninitialized" not in read and read["Max"] == pytest.approx(float((x[0] * 3).max()))


def test_the_wrappers_come_off_at_close(tmp_path):
    before = {name: getattr(owner, name) for owner, name in uninit.ALLOCATORS + uninit.WRITERS}
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics", level="L1", step=[0])
    model = torch.nn.Linear(2, 2)
    dbg.start(model)
    assert torch.Tensor.new_empty is not before["new_empty"] and torch.empty is not before["empty"]
    dbg.stop()
    dbg.close()
    assert {name: getattr(owner, name) for owner, name in uninit.ALLOCATORS + uninit.WRITERS} == before


def _summary(stats=None, uninitialized=False):
    out = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 4]}
    if uninitialized:
        out["uninitialized"] = True
    else:
        out.update(zip(STATS, stats))
    return dict(out, requires_grad=False)


def _hand_dump(root, slice_value, tanh_out):
    folder = root / "step0" / "rank"
    folder.mkdir(parents=True)
    data = {"Tensor.__getitem__.0.forward": {"input_args": [slice_value], "input_kwargs": {},
                                              "output": [slice_value]},
            "Torch.tanh.0.forward": {"input_args": [_summary((1.0, -1.0, 0.1, 2.0))], "input_kwargs": {},
                                     "output": [_summary(tanh_out)]}}
    (folder / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                                  "dump_data_dir": None, "data": data}))
    return root


def test_compare_never_judges_an_uninitialized_value(tmp_path):
    good = (0.76, -0.76, 0.1, 1.5)
    golden = _hand_dump(tmp_path / "g", _summary(uninitialized=True), good)
    garbage = _summary((3.0e35, -7.0e-33, 1.9e33, float("inf")))       # what the other run happened to read
    same = _hand_dump(tmp_path / "t", garbage, good)
    r = compare(golden, same, verbose=False)
    rows = [row for row in r.rows if row.golden_key == "Tensor.__getitem__.0.forward"]
    assert rows and all(row.mode == "uninitialized" and row.verdict == "pass" for row in rows)
    assert "nothing had written" in rows[0].reason and r.verdict == "pass" and r.first_divergence is None
    # a real difference after it is still found, at its own call
    bug = _hand_dump(tmp_path / "b", garbage, (0.9, -0.76, 0.2, 1.9))
    assert compare(golden, bug, verbose=False).first_divergence.key == "Torch.tanh.0.forward"


# ------------------------------------------------------------------ DeepSeek-V3 (transformers)

def _deepseek_config(bug=None):
    from transformers import DeepseekV3Config

    cfg = DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, n_shared_experts=1,
                           n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                           first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                           v_head_dim=16, qk_nope_head_dim=16, max_position_embeddings=32,
                           attn_implementation="eager", use_cache=False)
    if bug == "eps":
        cfg.rms_norm_eps = 1e-2
    return cfg


def _deepseek_step(path=None, bug=None):
    """One AdamW step of a 2-layer DeepSeek-V3 (one dense layer, one MoE layer), the tool on when
    `path` is given; returns (loss, parameters after the step)."""
    from transformers import DeepseekV3ForCausalLM

    seed_all(0, rm_dropout=True)
    model = DeepseekV3ForCausalLM(_deepseek_config(bug))
    if bug == "weight":
        with torch.no_grad():
            model.model.layers[1].self_attn.kv_a_proj_with_mqa.weight[0, 0] += 0.1
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 64, (2, 8))
    dbg = PrecisionDebugger(dump_path=str(path), task="statistics", level="mix", step=[0]) if path else None
    if dbg:
        dbg.start(model)
    loss = model(input_ids=data, labels=data).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    if dbg:
        dbg.stop()
        dbg.step()
        dbg.close()
    return loss.detach(), [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("deepseek")
    runs = {name: root / name for name in ("clean", "again", "eps", "weight")}
    results = {name: _deepseek_step(path, bug=name if name in ("eps", "weight") else None)
               for name, path in runs.items()}
    return runs, results


@pytest.mark.slow
def test_deepseek_v3_against_itself_is_pass(deepseek):
    runs, _ = deepseek
    with open(runs["clean"] / "step0" / "rank" / "dump.json") as f:
        data = json.load(f)["data"]
    flagged = {k for k, v in data.items() if "uninitialized" in json.dumps(v)}
    # key_states' two slices in each layer's attention, read before their copy_
    assert {k for k in flagged if k.startswith("Tensor.__getitem__")} and len(flagged) >= 4
    r = compare(runs["clean"], runs["again"], verbose=False)
    assert r.verdict == "pass" and r.first_divergence is None, str(r)[:2000]
    assert any(row.mode == "uninitialized" and row.verdict == "pass" for row in r.rows)


@pytest.mark.slow
def test_deepseek_v3_planted_bugs_are_named_where_they_are(deepseek):
    runs, _ = deepseek
    eps = compare(runs["clean"], runs["eps"], verbose=False).first_divergence
    assert eps.module == "Module.model.layers.0.input_layernorm.DeepseekV3RMSNorm.forward.0", eps.describe()
    weight = compare(runs["clean"], runs["weight"], verbose=False).first_divergence
    assert weight.module == "Module.model.layers.1.self_attn.kv_a_proj_with_mqa.Linear.forward.0", weight.describe()
    assert weight.key.startswith("Functional.linear.")


@pytest.mark.slow
def test_deepseek_v3_trains_bit_identically_with_the_tool_on(deepseek):
    _, results = deepseek
    loss, params = results["clean"]
    plain_loss, plain_params = _deepseek_step(None)
    assert torch.equal(loss, plain_loss)
    assert len(params) == len(plain_params) and all(torch.equal(a, b) for a, b in zip(params, plain_params))
