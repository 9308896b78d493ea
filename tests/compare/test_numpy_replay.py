"""The numpy replay (acccheck/numpy_replay.py) gives torch's float64 reference: every call of
real models' tensor dumps that it covers is replayed through both and must agree; what it does
not model (random draws, casts, 16-bit tensors, unknown arguments) it declines, so that the
diagnosis replays through torch instead."""
import json

import numpy as np
import pytest
import torch

from ts_core import PrecisionDebugger
from ts_core.acccheck.numpy_replay import ADAPTER as NUMPY
from ts_core.acccheck.outcome import ReplayError
from ts_core.acccheck.plan import build_plans
from ts_core.acccheck.replay import replay
from ts_core.acccheck.standards import STANDARDS_YAML, load_standards
from ts_core.backends.torch.replay import ADAPTER as TORCH


def _dump(path, model, *inputs, **kwargs):
    dbg = PrecisionDebugger(dump_path=str(path), task="tensor", level="L1", step=[0])
    dbg.start(model)
    out = model(*inputs, **kwargs)
    (out.loss if hasattr(out, "loss") else out.float().sum()).backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    rank = path / "step0" / "rank"
    return json.loads((rank / "dump.json").read_text())["data"], rank / "dump_tensor_data"


def _gpt2(path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    ids = torch.randint(0, 64, (2, 16))
    return _dump(path, GPT2LMHeadModel(cfg), input_ids=ids, labels=ids)


def _llama(path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=64, max_position_embeddings=16)
    ids = torch.randint(0, 64, (2, 16))
    return _dump(path, LlamaForCausalLM(cfg), input_ids=ids, labels=ids)


def _mlp(path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.SiLU(), torch.nn.Linear(16, 4),
                                torch.nn.Softmax(dim=-1))
    return _dump(path, model, torch.randn(5, 8))


@pytest.mark.parametrize("build", [_gpt2, _llama, _mlp])
def test_every_covered_call_gives_torchs_float64_reference(tmp_path, build):
    data, tensors = build(tmp_path)
    plans, _ = build_plans(data, load_standards(STANDARDS_YAML)["random_apis"])

    def load(t):
        return np.load(tensors / t.data_name)
    covered = [p for p in plans if not p.problem and p.key.endswith(".forward") and NUMPY.covers(p)]
    agreed, declined = set(), set()
    for plan in covered:
        try:
            got = replay(NUMPY, plan, NUMPY.resolve(plan, {}), load, backward=False)
        except ReplayError:
            declined.add(plan.name)
            continue
        want = replay(TORCH, plan, TORCH.resolve(plan, {}), load, backward=False)
        assert len(got.reference) == len(want.reference), plan.key
        for a, b in zip(got.reference, want.reference):
            np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=1e-9,
                                       atol=1e-12, err_msg=plan.key)
        agreed.add(plan.name)
        assert got.peer is None and "numpy" in " ".join(got.notes)     # the reference only
    assert len(agreed) >= 4, (agreed, declined)                          # a model's common calls are covered
    assert not declined - {"Functional.dropout"}, declined


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"bool_mask": True}, {"float_mask": True},
                                    {"scale": 0.3}, {"gqa": True}])
def test_attention_variants_match_torch(kwargs):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 5, 8, generator=g, dtype=torch.float64)
    kv_heads = 2 if kwargs.get("gqa") else 4
    k = torch.randn(2, kv_heads, 5, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, kv_heads, 5, 8, generator=g, dtype=torch.float64)
    kw = {}
    if kwargs.get("is_causal"):
        kw["is_causal"] = True
    if kwargs.get("bool_mask"):
        kw["attn_mask"] = torch.rand(5, 5, generator=g) > 0.3
        kw["attn_mask"][:, 0] = True                  # no fully masked row (NaN on both sides)
    if kwargs.get("float_mask"):
        kw["attn_mask"] = torch.randn(5, 5, generator=g, dtype=torch.float64)
    if "scale" in kwargs:
        kw["scale"] = kwargs["scale"]
    if kwargs.get("gqa"):
        kw["enable_gqa"] = True
    from ts_core.acccheck.numpy_replay import FUNCTIONAL
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw).numpy()
    got = FUNCTIONAL["scaled_dot_product_attention"](q.numpy(), k.numpy(), v.numpy(),
                                                     **{n: (x.numpy() if isinstance(x, torch.Tensor) else x)
                                                        for n, x in kw.items()})
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_other_calls_are_declined():
    from ts_core.acccheck.numpy_replay import FUNCTIONAL, TENSOR, TORCH as TORCH_OPS

    x = np.ones((2, 3))
    for fn, args, kw in ((FUNCTIONAL["dropout"], (x, 0.1, True), {}),
                         (FUNCTIONAL["softmax"], (x,), {}),
                         (FUNCTIONAL["embedding"], (np.zeros(2, np.int64), x), {"max_norm": 1.0}),
                         (TORCH_OPS["div"], (x, x), {"rounding_mode": "floor"}),
                         (TORCH_OPS["mean"], (x,), {"dtype": "torch.float32"})):
        with pytest.raises(ReplayError):
            fn(*args, **kw)
    assert FUNCTIONAL["dropout"](x, 0.1, False) is x and TENSOR["view"](x, 3, 2).shape == (3, 2)
    with pytest.raises(ReplayError):                  # a keyword the table does not model
        NUMPY.call(FUNCTIONAL["relu"], [x], {"approximate": "tanh"}, None)
    with pytest.raises(ReplayError):                  # casts and 16-bit values: the peer's job
        NUMPY.tensor(x, "torch.float32", [2, 3], None)


def test_sixteen_bit_calls_are_left_to_torch(tmp_path):
    data, _ = _mlp(tmp_path)
    plans, _ = build_plans(data, load_standards(STANDARDS_YAML)["random_apis"])
    linear = next(p for p in plans if p.name == "Functional.linear" and p.key.endswith(".forward"))
    assert NUMPY.covers(linear)
    linear.args[0].dtype = "torch.bfloat16"
    assert not NUMPY.covers(linear)


def test_zero_dimensional_results_stay_arrays():
    """torch returns 0-d tensors where numpy returns scalars: the replay keeps them arrays, with
    the shape the dump records ([])."""
    from ts_core.acccheck.numpy_replay import TENSOR

    x = np.arange(6.0).reshape(2, 3)
    total = NUMPY.call(TENSOR["sum"], [x], {}, None)
    assert NUMPY.is_tensor(total) and NUMPY.shape(total) == [] and float(total) == 15.0
    t = NUMPY.call(TENSOR["tanh"], [np.asarray(0.5)], {}, None)
    assert NUMPY.is_tensor(t) and float(t) == pytest.approx(np.tanh(0.5), rel=1e-15)


def _t(a):
    return torch.from_numpy(np.asarray(a))


@pytest.mark.parametrize("case", ["gelu", "gelu_tanh", "layer_norm_bare", "layer_norm_affine", "rms_norm",
                                  "log_softmax", "relu", "sigmoid", "addmm", "embedding_padding", "sub_alpha",
                                  "add_alpha", "div", "mean_dims", "sum_keepdim", "permute", "masked_fill",
                                  "rsub", "rtruediv", "unsqueeze"])
def test_each_op_against_torch(case):
    """Every table entry a model above may not reach, against torch's float64 result directly."""
    from ts_core.acccheck.numpy_replay import FUNCTIONAL as F, TENSOR as T, TORCH as O

    rng = np.random.default_rng(5)
    x, w, b = rng.standard_normal((3, 4, 6)), rng.standard_normal(6), rng.standard_normal(6)
    m1, m2, base = rng.standard_normal((4, 5)), rng.standard_normal((5, 3)), rng.standard_normal((4, 3))
    w2 = rng.standard_normal((4, 6))          # a weight over the last two axes
    tf = torch.nn.functional
    got, want = {
        "gelu": lambda: (F["gelu"](x), tf.gelu(_t(x))),
        "gelu_tanh": lambda: (F["gelu"](x, approximate="tanh"), tf.gelu(_t(x), approximate="tanh")),
        "layer_norm_bare": lambda: (F["layer_norm"](x, [6]), tf.layer_norm(_t(x), [6])),
        "layer_norm_affine": lambda: (F["layer_norm"](x, [4, 6], w2, None, 1e-3),
                                      tf.layer_norm(_t(x), [4, 6], _t(w2), None, 1e-3)),
        "rms_norm": lambda: (F["rms_norm"](x, [6], w, 1e-6), tf.rms_norm(_t(x), [6], _t(w), 1e-6)),
        "log_softmax": lambda: (F["log_softmax"](x, 1), tf.log_softmax(_t(x), 1)),
        "relu": lambda: (F["relu"](x), tf.relu(_t(x))),
        "sigmoid": lambda: (O["sigmoid"](x), torch.sigmoid(_t(x))),
        "addmm": lambda: (O["addmm"](base, m1, m2, beta=0.5, alpha=2.0),
                          torch.addmm(_t(base), _t(m1), _t(m2), beta=0.5, alpha=2.0)),
        "embedding_padding": lambda: (F["embedding"](np.array([[0, 2], [1, 0]]), m1, padding_idx=0),
                                      tf.embedding(_t(np.array([[0, 2], [1, 0]])), _t(m1), padding_idx=0)),
        "sub_alpha": lambda: (O["sub"](x, b, alpha=3), torch.sub(_t(x), _t(b), alpha=3)),
        "add_alpha": lambda: (T["add"](x, b, alpha=-2), _t(x).add(_t(b), alpha=-2)),
        "div": lambda: (O["div"](x, b), torch.div(_t(x), _t(b))),
        "mean_dims": lambda: (T["mean"](x, [0, 2]), _t(x).mean([0, 2])),
        "sum_keepdim": lambda: (O["sum"](x, -1, True), torch.sum(_t(x), -1, True)),
        "permute": lambda: (T["permute"](x, 2, 0, 1), _t(x).permute(2, 0, 1)),
        "masked_fill": lambda: (T["masked_fill"](x, x > 0, -1e9), _t(x).masked_fill(_t(x > 0), -1e9)),
        "rsub": lambda: (T["__rsub__"](x, 2.0), _t(x).__rsub__(2.0)),
        "rtruediv": lambda: (T["__rtruediv__"](x, 2.0), _t(x).__rtruediv__(2.0)),
        "unsqueeze": lambda: (T["unsqueeze"](x, -1), _t(x).unsqueeze(-1)),
    }[case]()
    want = want.numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
