"""The pieces of ts_core.rl that need no engine: fused-name mapping, the mismatch numbers, the
config diff, the verdict's order of causes, and that importing the package loads no torch."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np

from ts_core.rl import diagnose
from ts_core.rl.logprobs import mismatch
from ts_core.rl.weights import split_plan

from .conftest import ROOT


def test_fused_engine_parameters_are_cut_into_the_trainers_pieces():
    trainer = {"m.layers.0.self_attn.q_proj.weight": [64, 64], "m.layers.0.self_attn.k_proj.weight": [32, 64],
               "m.layers.0.self_attn.v_proj.weight": [32, 64], "m.layers.0.mlp.gate_proj.weight": [128, 64],
               "m.layers.0.mlp.up_proj.weight": [128, 64], "m.norm.weight": [64]}
    engine = {"m.layers.0.self_attn.qkv_proj.weight": [128, 64], "m.layers.0.mlp.gate_up_proj.weight": [256, 64],
              "m.norm.weight": [64], "m.layers.0.mlp.gate_up_proj.weight_scale": [2], "extra.weight": [3]}
    plan, unmapped = split_plan(engine, trainer)
    assert plan["m.layers.0.self_attn.qkv_proj.weight"] == [("m.layers.0.self_attn.q_proj.weight", 0, 64),
                                                            ("m.layers.0.self_attn.k_proj.weight", 64, 96),
                                                            ("m.layers.0.self_attn.v_proj.weight", 96, 128)]
    assert plan["m.layers.0.mlp.gate_up_proj.weight"][1] == ("m.layers.0.mlp.up_proj.weight", 128, 256)
    assert plan["m.norm.weight"] == [("m.norm.weight", 0, 64)]
    assert sorted(unmapped) == ["extra.weight", "m.layers.0.mlp.gate_up_proj.weight_scale"]


def test_a_tensor_parallel_shard_of_a_fused_parameter_is_left_unmapped():
    trainer = {"a.qkv_proj.weight".replace("qkv", q): [8, 4] for q in ("q", "k", "v")}
    plan, unmapped = split_plan({"a.qkv_proj.weight": [12, 4]}, trainer)       # a half: 12 rows of 24
    assert plan == {} and unmapped == ["a.qkv_proj.weight"]


def test_mismatch_numbers_match_numpy():
    rng = np.random.default_rng(0)
    lr = rng.normal(-4, 1, 50)
    lt = lr + rng.normal(0, 0.05, 50)
    rows = [{"request": 0, "position": i, "logp_rollout": a, "logp_train": b, "diff": b - a}
            for i, (a, b) in enumerate(zip(lr, lt))]
    m = mismatch(rows, worst=3)
    r = lt - lr
    assert math.isclose(m["max_abs"], np.abs(r).max()) and math.isclose(m["mean_abs"], np.abs(r).mean())
    assert math.isclose(m["kl_k3"], np.mean(np.exp(r) - 1 - r)) and m["kl_k3"] > 0
    assert [w["position"] for w in m["worst"]] == list(np.argsort(-np.abs(r))[:3])


class _Cfg:
    def __init__(self, **kw):
        self.d = kw

    def to_dict(self):
        return self.d


def test_config_diff_flattens_rope_parameters_and_ignores_unrelated_fields():
    a = _Cfg(rope_parameters={"rope_theta": 1e4, "rope_type": "default"}, rms_norm_eps=1e-6, name_or_path="x")
    b = _Cfg(rope_parameters={"rope_theta": 5e5, "rope_type": "default"}, rms_norm_eps=1e-6, name_or_path="y")
    assert diagnose.config_diff(a, b) == [{"key": "rope_parameters.rope_theta", "trainer": 1e4, "engine": 5e5}]


def test_verdict_names_tokenisation_before_weights_and_weights_before_numbers():
    w = {"differ": [{"name": "model.layers.1.mlp.up_proj.weight"}], "checked": 21, "trainer_dtype": "float32",
         "engine_dtype": "float32"}
    tok = [{"request": 0, "text": "hi", "first_diff": 0, "engine_piece": "h", "trainer_piece": "hi",
            "engine_ids": [1, 2], "trainer_ids": [3]}]
    loc = {"first": {"stage": "model.layers.1.mlp", "op": "mlp", "layer": 1, "rel": 1e-2, "ratio": 1e3,
                     "points_at": "MLP"}}
    mm = {"max_abs": 0.1}
    assert diagnose.verdict(diagnose.findings(tok, w, [], mm, 1e-5, loc))["cause"] == "tokenisation"
    v = diagnose.verdict(diagnose.findings([], w, [], mm, 1e-5, loc))
    assert v["cause"] == "weights" and "layer 1" in v["message"] and "model.layers.1.mlp" in v["message"]
    ok = dict(w, differ=[])
    assert diagnose.verdict(diagnose.findings([], ok, [], {"max_abs": 1e-7}, 1e-5, {"first": None}))["status"] == "PASS"
    assert diagnose.verdict(diagnose.findings([], ok, [], mm, 1e-5, loc))["cause"] == "numeric"


def test_importing_ts_core_rl_loads_neither_torch_nor_vllm():
    code = "import sys, ts_core.rl, ts_core.rl.consistency, ts_core.rl.cli; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_checks_rng_guard_gives_the_loop_the_numbers_it_would_have_drawn():
    import random

    import torch

    from ts_core.rl.consistency import _RngState

    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    want = (torch.rand(4), np.random.rand(2), random.random())
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    guard = _RngState()
    torch.rand(100), np.random.rand(7), random.random()          # what an in-process engine might draw
    guard.restore()
    got = (torch.rand(4), np.random.rand(2), random.random())
    assert torch.equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]


def test_rl_check_command_says_what_to_change_on_bad_input(tmp_path, capsys):
    from ts_core.cli import main

    assert main(["rl-check", "--model", str(tmp_path / "nowhere"), "--prompt", "hi"]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["rl-check", "--model", str(tmp_path)]) == 2
    assert "--prompt TEXT" in capsys.readouterr().err
    assert main(["rl-check", "--model", str(tmp_path), "--prompt", "hi", "--max-tokens", "0"]) == 2
    assert "--max-tokens must be >= 1" in capsys.readouterr().err
