"""The diagnosis on real torch models (issues 37, 38, 40): tiny models dumped by tsprobe at mix,
as tensors and as statistics, each bug planted in one run of a pair. Every expected number
(the eps, the shift, the block order) is the planted one, read from the models built here.
"""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ts_core.compare import compare
from ts_core.compare.explain import diagnosis as diag
from ts_core.compare.explain.patterns import difference_is, permutation

D, HEADS = 16, 2
HD = D // HEADS
TASKS = ("tensor", "statistics")


def dump(path, model: nn.Module, x: torch.Tensor, task: str, seed: int = 0) -> str:
    """One training step of `model` on `x` dumped by tsprobe at mix."""
    from ts_core import PrecisionDebugger

    dbg = PrecisionDebugger(dump_path=str(path), task=task, level="mix", step=[0])
    dbg.start(model)
    torch.manual_seed(seed)
    model(x).pow(2).mean().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    return str(path)


def run(tmp_path, make, task, seeds=(0, 0)):
    """Dump golden = make("golden") and target = make("target") (same weights) and compare."""
    dirs = []
    for side, seed in zip(("golden", "target"), seeds):
        torch.manual_seed(0)
        model = make(side)
        x = torch.randn(4, 5, D, generator=torch.Generator().manual_seed(1))
        dirs.append(dump(tmp_path / side, model, x, task, seed))
    return compare(dirs[0], dirs[1], None, verbose=False, html=False)


def checked(result):
    """The diagnosis, after asserting that none of its checks failed (a failure fails the test)."""
    failed = [h for h in result.diagnosis if h["cause"] == diag.CHECK_FAILED]
    assert not failed, failed
    return result.diagnosis


def top(result):
    hyps = checked(result)
    assert hyps, f"no diagnosis; first divergence {result.first_divergence}"
    return hyps[0]


# ------------------------------------------------------------------- a changed eps upstream
class RMSNorm(nn.Module):
    """Written out by hand, as Llama's: x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(D))

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * self.weight


class NormNet(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.fc, self.norm, self.head = nn.Linear(D, D), RMSNorm(eps), nn.Linear(D, 4)

    def forward(self, x):
        return self.head(self.norm(self.fc(x) * 0.02))     # a small variance: eps shows


@pytest.mark.parametrize("task", TASKS)
def test_a_changed_eps_is_followed_to_the_add_that_holds_it(tmp_path, task):
    r = run(tmp_path, lambda side: NormNet(1e-6 if side == "golden" else 1e-5), task)
    fd = r.first_divergence
    assert fd is not None and ".__add__." in fd.key, fd
    assert "1e-06" in fd.cause and "1e-05" in fd.cause
    hyp = top(r)
    assert hyp["cause"] == "norm_eps" and hyp["confidence"] >= 0.8
    # no line contradicts the place: the add's tensor input is the same on both sides
    assert not any(h["cause"] == "inherited" and h["confidence"] >= 0.5 for h in r.diagnosis)


# ------------------------------------------------------------------ gelu_new written out
class GeluNew(nn.Module):
    """GPT-2's gelu_new, as transformers writes it."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class ActNet(nn.Module):
    def __init__(self, act: nn.Module):
        super().__init__()
        self.fc, self.act, self.head = nn.Linear(D, 4 * D), act, nn.Linear(4 * D, 4)

    def forward(self, x):
        return self.head(self.act(self.fc(x) * 3))


def test_gelu_new_written_out_is_fitted_against_nn_gelu(tmp_path):
    r = run(tmp_path, lambda side: ActNet(nn.GELU() if side == "golden" else GeluNew()), "tensor")
    hyp = top(r)
    assert hyp["cause"] == "activation_approx" and hyp["confidence"] >= 0.9, r.diagnosis
    assert "tanh" in hyp["title"] and "erf" in hyp["title"]
    # nothing asserted from counting calls (the formula holds one add of two tensors)
    assert not any(h["cause"] == "dropped_residual" and h["confidence"] >= 0.8 for h in r.diagnosis)


# ---------------------------------------------------------- qkv interleaved per head
def megatron_order(heads: int, hd: int) -> np.ndarray:
    """Row order of a fused [3*D, D] qkv weight in Megatron's layout ([q0 k0 v0 q1 k1 v1]),
    from the grouped one ([q0 q1 k0 k1 v0 v1])."""
    return np.concatenate([np.arange(hd) + (part * heads + h) * hd for h in range(heads) for part in range(3)])


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(x).split(D, dim=2)
        q, k, v = (a.view(b, t, HEADS, HD).transpose(1, 2) for a in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HD))
        y = att.softmax(-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, D))


def qkv_model(side: str) -> Attn:
    m = Attn()
    if side == "target":            # loaded from a Megatron checkpoint without converting the layout
        order = torch.as_tensor(megatron_order(HEADS, HD))
        with torch.no_grad():
            m.c_attn.weight.copy_(m.c_attn.weight[order])
            m.c_attn.bias.copy_(m.c_attn.bias[order])
    return m


def test_qkv_interleaved_per_head_is_a_block_permutation(tmp_path):
    r = run(tmp_path, qkv_model, "tensor")
    hyp = top(r)
    assert hyp["cause"] == "transposed_weight" and hyp["confidence"] >= 0.9, r.diagnosis
    assert "6 blocks of 8" in hyp["evidence"] and "grid" in hyp["evidence"]


def test_qkv_interleaved_with_statistics_is_not_placed_on_the_split(tmp_path):
    r = run(tmp_path, qkv_model, "statistics")
    fd = r.first_divergence
    assert fd is not None and "split" not in fd.key and "c_attn" in (fd.key + str(fd.module)), fd
    checked(r)


def test_block_permutation_names_the_grid():
    w = np.random.default_rng(0).standard_normal((3 * 4 * 5, 7))
    order = megatron_order(4, 5)
    text = permutation(w, w[order])
    assert "12 blocks of 5" in text and "3 x 4 grid" in text, text
    assert permutation(w, w[::-1].copy()) is not None           # 60 rows reversed: a block order too
    noisy = w[order] + 1e-3
    assert permutation(w, noisy) is None


# ----------------------------------------------------------------- a bias shifted by a constant
def shifted_bias(side: str) -> nn.Module:
    m = ActNet(nn.Tanh())
    if side == "target":
        with torch.no_grad():
            m.fc.bias += 0.1
    return m


@pytest.mark.parametrize("task", TASKS)
def test_a_shifted_bias_is_said_to_be_shifted_by_a_constant(tmp_path, task):
    r = run(tmp_path, shifted_bias, task)
    hyp = top(r)
    assert hyp["cause"] == "parameter_differs" and hyp["confidence"] >= 0.8
    assert "shifted by a constant +0.1" in hyp["title"] + hyp["evidence"], hyp


# ------------------------------------------------------------- a module class renamed
class MatLinear(nn.Linear):
    """The same computation under another class name."""


class FuncLN(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, 1e-5)


class Renamed(nn.Module):
    def __init__(self, renamed: bool):
        super().__init__()
        lin, ln = (MatLinear, FuncLN) if renamed else (nn.Linear, nn.LayerNorm)
        self.fc1, self.ln, self.fc2 = lin(D, D), ln(D), lin(D, 4)

    def forward(self, x):
        return self.fc2(self.ln(self.fc1(x)))


@pytest.mark.parametrize("task", TASKS)
def test_gradients_pair_across_a_renamed_module_class(tmp_path, task):
    r = run(tmp_path, lambda side: Renamed(side == "target"), task)
    grads = [row for row in r.rows if ".parameters_grad." in (row.golden_key or row.target_key or "")]
    assert len(grads) == 6 and all(row.golden_key and row.target_key for row in grads), \
        [(row.golden_key, row.target_key) for row in grads]
    assert all(row.verdict == "pass" for row in grads)
    assert r.first_divergence is None and r.verdict == "pass", r.first_divergence


# ---------------------------------------------------- a random op, two generators (CPU vs CUDA)
class DropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.drop, self.head = nn.Linear(D, D), nn.Dropout(0.3), nn.Linear(D, 4)

    def forward(self, x):
        return self.head(self.drop(self.fc(x)))


@pytest.mark.parametrize("task", TASKS)
def test_dropout_fed_by_two_streams_is_named_a_random_op(tmp_path, task):
    """Two seeds stand for the two devices' generators (CPU and CUDA draw differently)."""
    r = run(tmp_path, lambda side: DropNet(), task, seeds=(1, 2))
    fd = r.first_divergence
    assert fd is not None and "dropout" in fd.key.lower(), fd
    hyp = top(r)
    assert hyp["cause"] == "random_stream" and "different generators/streams" in hyp["title"]
    assert hyp["confidence"] >= (0.9 if task == "tensor" else 0.8)


def _device_args(path: str, value) -> int:
    """Rewrite every recorded device argument of the dump at `path` to `value`; how many."""
    import glob

    (js,) = glob.glob(f"{path}/step0/rank/dump.json")
    doc = json.load(open(js))
    n = 0

    def walk(x):
        nonlocal n
        if isinstance(x, dict):
            if x.get("type") in ("torch.device", "str") and x.get("value") == "cpu":
                x.update(value)
                n += 1
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(doc["data"])
    json.dump(doc, open(js, "w"))
    return n


class DeviceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        h = self.fc(x.to("cpu"))
        return h.to(h.device) * h.to(device=torch.device("cpu"))


def test_device_arguments_are_no_findings(tmp_path):
    torch.manual_seed(0)
    model, x = DeviceNet(), torch.randn(4, D)
    g = dump(tmp_path / "cpu", model, x, "statistics")
    model.zero_grad()
    t = dump(tmp_path / "cuda", model, x, "statistics")
    assert _device_args(t, {"type": "torch.device", "value": "cuda:0"}) >= 2
    r = compare(g, t, None, verbose=False, html=False)
    assert not [row for row in r.rows if row.mode == "value"], [(row.name, row.reason) for row in r.rows
                                                                   if row.mode == "value"]
    assert r.verdict == "pass"


# ------------------------------------------------------------- masked scores, failing checks
def test_masked_minus_inf_scores_raise_no_warning():
    rng = np.random.default_rng(3)
    g = rng.standard_normal((2, 5, 5))
    mask = np.triu(np.ones((5, 5), bool), 1)
    g[:, mask] = -np.inf
    r = rng.standard_normal((2, 5, 5))
    t = g - r
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert difference_is(g, t, [("r", r)]) == ("r", "golden - target")
        assert difference_is(g, g + 1, [("r", r)]) is None


@pytest.mark.filterwarnings("error")
def test_a_diagnosis_of_masked_attention_warns_nothing(tmp_path):
    class Masked(Attn):
        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.c_attn(x).split(D, dim=2)
            s = (q @ k.transpose(-2, -1)) / math.sqrt(D)
            s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
            return self.c_proj(s.softmax(-1) @ v)

    def make(side):
        m = Masked()
        if side == "target":
            with torch.no_grad():
                m.c_attn.weight[:D] *= 2           # q scaled: the scores differ, masked ones stay -inf
        return m
    r = run(tmp_path, make, "tensor")
    assert r.first_divergence is not None
    checked(r)


def test_a_failing_check_is_reported_in_the_output(tmp_path, monkeypatch):
    def _check_broken(ctx):
        raise ZeroDivisionError("planted")
    monkeypatch.setattr(diag, "CHECKS", diag.CHECKS + (_check_broken,))
    r = run(tmp_path, shifted_bias, "statistics")
    failed = [h for h in r.diagnosis if h["cause"] == diag.CHECK_FAILED]
    assert failed and "ZeroDivisionError: planted" in failed[0]["evidence"]
    assert "test_diagnosis_models.py" in failed[0]["evidence"]        # where it failed
    assert any("broken check failed" in w for p in r.pairs for w in p.warnings)
    assert "broken check failed" in str(r)
    with pytest.raises(AssertionError):
        checked(r)


def test_inputs_within_tolerance_are_amplified_not_inherited(tmp_path):
    """rsqrt of a tiny variance: its inputs differ by 1e-7 (within atol), its outputs far more.
    The walk says "computed here"; the replay must not contradict it with "inherited"."""
    from compare_dumpgen import DumpWriter

    var = np.random.default_rng(5).random((6, 1)).astype(np.float32) * 1e-4 + 1e-6
    dirs = []
    for side, shift in (("golden", 0.0), ("target", 1e-7)):
        d = DumpWriter(tmp_path / side, task="tensor")
        v = (var + np.float32(shift)).astype(np.float32)
        d.forward("Torch.rsqrt.0.forward", [v], [(1 / np.sqrt(v.astype(np.float64))).astype(np.float32)])
        dirs.append(d.close())
    r = compare(dirs[0], dirs[1], None, verbose=False, html=False)
    assert r.first_divergence is not None and "computed here" in r.first_divergence.cause
    causes = {h["cause"]: h for h in checked(r)}
    assert "inherited" not in causes and "amplified" in causes, r.diagnosis


class LNNet(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.fc, self.ln, self.head = nn.Linear(D, D), nn.LayerNorm(D, eps=eps), nn.Linear(D, 4)

    def forward(self, x):
        return self.head(self.ln(self.fc(x) * 0.1))


def test_a_recorded_eps_difference_is_evidence_without_tensors(tmp_path):
    """Issue 40: eps 1e-05 against 0.01, recorded by the call, was 75% and "needs tensors"."""
    r = run(tmp_path, lambda side: LNNet(1e-5 if side == "golden" else 0.01), "statistics")
    hyp = top(r)
    assert hyp["cause"] == "norm_eps" and hyp["confidence"] >= 0.9 and not hyp["needs_tensors"], r.diagnosis
    assert "1e-05" in hyp["evidence"] and "0.01" in hyp["evidence"]
    assert not any(h["cause"] == "inherited" for h in r.diagnosis)     # no "inherited or born here?" line


def test_no_framework_is_imported_for_a_replay_that_cannot_run(tmp_path):
    """A tensor dump whose calls recorded no inputs: the diagnosis must not import torch (seconds)
    to find that out."""
    import subprocess
    import sys

    from compare_dumpgen import DumpWriter

    y = np.random.default_rng(2).standard_normal((64, 8)).astype(np.float32)
    dirs = []
    for side, noise in (("golden", 0.0), ("target", 0.05)):
        d = DumpWriter(tmp_path / side, task="tensor")
        d.forward("Functional.linear.0.forward", [], [(y + noise).astype(np.float32)])
        dirs.append(str(d.close()))
    code = ("import sys; from ts_core.compare import compare; "
            f"r = compare({dirs[0]!r}, {dirs[1]!r}, None, verbose=False, html=False); "
            "assert r.first_divergence is not None and r.diagnosis; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
