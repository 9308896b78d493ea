"""Cross-framework compare: a PyTorch dump against the dump of its MindSpore port (ports.py,
identical weights). The compare engine pairs the calls through torch_mapping.yaml
(Linear <-> Dense, weight <-> gamma, F.linear <-> MatMul + BiasAdd, sigmoid + mul <-> silu)
and names the injected migration bug as the first divergence."""
import json
import os
import subprocess
import sys

import pytest

from ..conftest import require
from ..mindspore import ports

pytestmark = [require("mindspore"), require("torch")]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (model, bug) -> the torch module the bug first shows in (its forward key)
FIRST_KEY = {
    ("mlp", "transposed_weight"): "Module.fc2.Linear.forward.0",
    ("cnn", "transposed_weight"): "Module.conv.Conv2d.forward.0",
    ("cnn", "wrong_eps"): "Module.bn.BatchNorm2d.forward.0",
    ("transformer", "wrong_eps"): "Module.ln1.LayerNorm.forward.0",
    ("transformer", "transposed_weight"): "Module.attn.q.Linear.forward.0",
    # the scale is (or is not) applied in Attention's own code, between q@k and its softmax child
    ("transformer", "missing_scale"): "Module.attn.Attention.forward.0",
    ("transformer", "gelu_approx"): "Module.mlp.act.GELU.forward.0",
}
MS_CLASS = {"Linear": "Dense"}
RECORDS = {"mlp": 13, "cnn": 15, "transformer": 32}   # L0: forward + backward + parameters_grad


def _ms_key(torch_key: str) -> str:
    parts = torch_key.split(".")
    parts[0], parts[-3] = "Cell", MS_CLASS.get(parts[-3], parts[-3])
    return ".".join(parts)


# level mix (what users dump): (bug) -> (torch key, MindSpore key, enclosing torch module)
MIX_KEY = {
    "wrong_eps": ("Functional.layer_norm.0.forward", "Primitive.layer_norm.LayerNorm.0.forward",
                  "Module.ln1.LayerNorm.forward.0"),
    "transposed_weight": ("Functional.linear.0.forward",
                          "Primitive.matmul.MatMul.0.forward+Primitive.bias_add.BiasAdd.0.forward",
                          "Module.attn.q.Linear.forward.0"),
    "missing_scale": ("Tensor.__mul__.0.forward", None, "Module.attn.Attention.forward.0"),   # only torch scales
    "gelu_approx": ("Functional.gelu.0.forward", "Functional.gelu.0.forward", "Module.mlp.act.GELU.forward.0"),
}

SPECS = ([[n, None, "L0"] for n in ports.MODELS] + [[n, b, "L0"] for n, b in sorted(FIRST_KEY)]
         + [["mlp", None, "mix"], ["mlp", "transposed_weight", "mix"], ["silu", "silu", "L1"], ["silu", "sigmoid", "L1"]]
         + [["transformer", b, "mix"] for b in [None] + sorted(MIX_KEY)]
         + [["transformer", None, "L1"], ["transformer", "transposed_weight", "L1"], ["cnn", None, "mix"],
            ["transformer", None, "mix", "statistics"], ["transformer", "wrong_eps", "mix", "statistics"]])


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """All dumps of this module, written once by a child process (MindSpore stays out of pytest)."""
    root = tmp_path_factory.mktemp("xf")
    env = dict(os.environ, TSPROBE_QUIET="1")
    proc = subprocess.run([sys.executable, "-m", "tests.crossframework.dumpgen", str(root), json.dumps(SPECS)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("DUMPS ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    made = json.loads(line[len("DUMPS "):])

    def get(name, bug=None, level="L0", task=None):
        return tuple(made["|".join([name, str(bug), level] + ([task] if task else []))])
    return get


def _compare(g, t, **kw):
    from ts_core.compare import compare
    return compare(g, t, verbose=False, **kw)


def _matched(rows):
    return [r for r in rows if r.golden_key and r.target_key]


@pytest.mark.parametrize("name", ports.MODELS)
def test_faithful_port_every_call_pairs_and_every_row_passes(dumps, name):
    t_dir, m_dir = dumps(name)
    result = _compare(t_dir, m_dir)
    pair = result.pairs[0]
    assert pair.counts["matched"] == RECORDS[name]
    assert pair.counts["unmatched_golden"] == pair.counts["unmatched_target"] == 0
    rows = result.rows
    assert rows and _matched(rows) == rows
    bad = [(r.golden_key, r.arg, r.reason) for r in rows if r.verdict != "pass"]
    assert not bad
    assert all(r.mode == "tensor" for r in rows)
    assert result.first_divergence is None
    assert any("cross-framework" in w for w in pair.warnings)
    # module records pair across class names: Linear <-> Dense
    by_key = {(r.golden_key, r.target_key) for r in rows}
    if name != "cnn":
        assert ("Module.fc2.Linear.forward.0" if name == "mlp" else "Module.mlp.fc2.Linear.forward.0",
                "Cell.fc2.Dense.forward.0" if name == "mlp" else "Cell.mlp.fc2.Dense.forward.0") in by_key


def test_parameter_names_map_weight_to_gamma(dumps):
    t_dir, m_dir = dumps("transformer")
    rows = _compare(t_dir, m_dir).rows
    ln = {r.arg: r for r in rows if r.target_key == "Cell.ln1.LayerNorm.forward.0"}
    assert {"parameters.weight", "parameters.bias"} <= set(ln)
    assert not any("gamma" in a or "beta" in a for a in ln)
    assert ln["parameters.weight"].mode == "tensor" and ln["parameters.weight"].verdict == "pass"
    grads = {r.arg: r for r in rows if r.target_key == "Cell.ln1.LayerNorm.parameters_grad.0"}
    assert set(grads) == {"weight", "bias"}
    assert all(r.golden_key == "Module.ln1.LayerNorm.parameters_grad.0" and r.verdict == "pass"
               for r in grads.values())


@pytest.mark.parametrize("name,bug", sorted(FIRST_KEY))
def test_injected_migration_bug_is_the_first_divergence(dumps, name, bug):
    t_dir, m_dir = dumps(name, bug)
    result = _compare(t_dir, m_dir)
    fd = result.first_divergence
    assert fd is not None
    assert fd.key == FIRST_KEY[name, bug]
    assert fd.target_key == _ms_key(FIRST_KEY[name, bug])
    assert fd.direction == "forward"
    # everything before it in forward order passes, apart from what ran inside the named
    # module (an L0 module record is written when the module returns, after its children's)
    inside = "Module." + ".".join(fd.key.split(".")[1:-3]) + "."
    before = [r for r in result.rows if r.direction == "forward" and r.golden_key != fd.key
              and not (r.golden_key or "").startswith(inside)]
    order = {r.golden_key: r.order for r in result.rows}
    assert all(r.verdict == "pass" for r in before if r.order < order[fd.key])


def test_mindspore_as_golden_side(dumps):
    t_dir, m_dir = dumps("transformer", "wrong_eps")
    fd = _compare(m_dir, t_dir).first_divergence
    assert fd.key == "Cell.ln1.LayerNorm.forward.0"
    assert fd.target_key == "Module.ln1.LayerNorm.forward.0"


def test_same_framework_behaviour_is_unchanged(dumps):
    t_dir, m_dir = dumps("mlp")
    off = _compare(t_dir, m_dir, crossframework=False)
    # without the mapping, Module.* and Cell.* records share no names: no module record pairs
    assert not any(r.golden_key and r.target_key and r.golden_key.startswith("Module.") for r in off.rows)
    assert not any("cross-framework" in w for w in off.pairs[0].warnings)
    same = _compare(t_dir, t_dir).pairs[0]
    assert same.counts["matched"] == RECORDS["mlp"] and same.first_divergence is None
    assert not any("cross-framework" in w for w in same.warnings)


def test_api_level_linear_pairs_with_matmul_plus_biasadd(dumps):
    """mix level: torch's F.linear is one call, MindSpore's Dense runs MatMul then BiasAdd."""
    t_dir, m_dir = dumps("mlp", None, "mix")
    result = _compare(t_dir, m_dir)
    pairs = {r.golden_key: r.target_key for r in _matched(result.rows)}
    assert pairs["Functional.linear.0.forward"] == \
        "Primitive.matmul.MatMul.0.forward+Primitive.bias_add.BiasAdd.0.forward"
    assert pairs["Functional.relu.0.forward"] == "Primitive.relu.ReLU.0.forward"
    assert pairs["Module.fc1.Linear.forward.0"] == "Cell.fc1.Dense.forward.0"
    assert all(r.verdict == "pass" for r in _matched(result.rows)), \
        [(r.golden_key, r.arg, r.reason) for r in _matched(result.rows) if r.verdict != "pass"]
    assert result.first_divergence is None
    assert any("Functional.linear <-> Primitive.*.MatMul + Primitive.*.BiasAdd" in w
               for w in result.pairs[0].warnings)


def test_api_level_bug_names_the_fused_group(dumps):
    t_dir, m_dir = dumps("mlp", "transposed_weight", "mix")
    fd = _compare(t_dir, m_dir).first_divergence
    assert fd.key == "Functional.linear.1.forward"
    assert fd.target_key == "Primitive.matmul.MatMul.1.forward+Primitive.bias_add.BiasAdd.1.forward"


def test_sigmoid_times_x_pairs_with_silu(dumps):
    """torch: sigmoid(x) * x + 1; MindSpore: ops.silu(x) + 1 (tests/crossframework/dumpgen.py)."""
    t_dir, m_dir = dumps("silu", "silu", "L1")
    with open(f"{m_dir}/dump.json") as f:
        ms_keys = list(json.load(f)["data"])
    assert any(k.startswith("Functional.silu.") for k in ms_keys), ms_keys
    result = _compare(t_dir, m_dir)
    pairs = {(r.golden_key, r.target_key) for r in _matched(result.rows)}
    assert ("Torch.sigmoid.0.forward+Tensor.__mul__.0.forward", "Functional.silu.0.forward") in pairs
    assert all(r.verdict == "pass" for r in result.rows)
    assert result.first_divergence is None


def test_silu_ported_as_sigmoid_is_named(dumps):
    """The port calls ops.sigmoid(x) + 1 where torch computes sigmoid(x) * x + 1."""
    t_dir, m_dir = dumps("silu", "sigmoid", "L1")
    fd = _compare(t_dir, m_dir).first_divergence
    # sigmoid pairs with sigmoid (equal); the multiplication runs in torch only and what
    # it produces reaches the "+ 1", which differs: the extra call is named
    assert fd is not None
    assert fd.key == "Tensor.__mul__.0.forward" and fd.target_key is None
    assert "only in golden" in fd.reason


def test_cli_pairs_a_torch_dump_with_a_mindspore_dump(dumps, tmp_path, capsys):
    from ts_core.cli import main

    t_dir, m_dir = dumps("transformer", "gelu_approx")
    rc = main(["compare", t_dir, m_dir, "-o", str(tmp_path / "out"), "--fail-on-divergence"])
    assert rc == 1
    out = capsys.readouterr().out
    assert "Module.mlp.act.GELU.forward.0" in out
    assert (tmp_path / "out" / "report.html").is_file()
    with open(tmp_path / "out" / "summary.json") as f:
        summary = json.load(f)
    assert "Module.mlp.act.GELU.forward.0" in json.dumps(summary)


def test_mindspore_stays_out_of_the_test_process(dumps):
    """Later test folders call start() without a model: that needs one framework loaded only.
    The dumps are written by a child process; importing this module (and ports.py) and comparing
    a torch dump with a MindSpore dump must not load MindSpore. Checked in a fresh interpreter,
    so it holds whatever earlier tests loaded into this one."""
    t_dir, m_dir = dumps("mlp")
    code = ("import sys\n"
            "import tests.crossframework.test_crossframework as t\n"
            f"assert t._compare({t_dir!r}, {m_dir!r}).pairs[0].counts['matched'] == {RECORDS['mlp']}\n"
            "print('mindspore loaded:', 'mindspore' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "mindspore loaded: False"


# ---------------------------------------------------------- level mix / L1 (issue 12)
def _not_passing(result):
    return [(r.golden_key, r.target_key, r.arg, r.reason) for r in result.rows if r.verdict != "pass"]


@pytest.mark.parametrize("level,task", [("mix", None), ("L1", None), ("mix", "statistics")])
def test_faithful_transformer_port_passes_at_api_levels(dumps, level, task):
    """MindSpore's nn.Dense runs Shape + Reshape + MatMul + BiasAdd (+ Reshape) where torch runs
    one linear, its LayerNorm casts gamma/beta with astype and takes (x, gamma, beta): none of it
    is a divergence."""
    t_dir, m_dir = dumps("transformer", None, level, task)
    result = _compare(t_dir, m_dir)
    assert result.first_divergence is None, result.first_divergence
    assert result.verdict == "pass", _not_passing(result)
    harmless = {r.target_key.split(".")[1] for r in result.rows if r.golden_key is None
                and "cannot change a result" in r.reason}
    assert {"reshape", "shape_op", "astype"} <= harmless
    pairs = {(r.golden_key, r.target_key) for r in _matched(result.rows)}
    assert ("Functional.linear.0.forward",
            "Primitive.matmul.MatMul.0.forward+Primitive.bias_add.BiasAdd.0.forward") in pairs
    assert ("Tensor.pow.0.forward", "Tensor.__mul__.1.forward") in pairs      # the loss: x.pow(2) <-> x * x
    # torch layer_norm(x, shape, weight, bias, eps) <-> LayerNorm(x, gamma, beta): weight pairs with gamma
    w = next(r for r in result.rows if r.golden_key == "Functional.layer_norm.0.forward" and r.arg == "input.2")
    assert w.target_key == "Primitive.layer_norm.LayerNorm.0.forward" and "target input.1" in w.reason
    # the backward of linear pairs with BiasAdd's and MatMul's, every gradient compared
    grads = [r for r in result.rows if r.golden_key == "Functional.linear.3.backward" and r.role == "output"]
    assert len(grads) == 3 and "BiasAdd.3.backward" in grads[0].target_key


def test_faithful_cnn_port_passes_at_mix(dumps):
    result = _compare(*dumps("cnn", None, "mix"))
    assert result.first_divergence is None and result.verdict == "pass", _not_passing(result)
    counter = [r for r in result.rows if r.golden_key and r.golden_key.startswith("Tensor.add_.")]
    assert counter and all("integer bookkeeping" in r.reason for r in counter)   # num_batches_tracked += 1


@pytest.mark.parametrize("bug", sorted(MIX_KEY))
def test_port_bugs_are_named_at_their_op_and_module_at_mix(dumps, bug):
    t_dir, m_dir = dumps("transformer", bug, "mix")
    result = _compare(t_dir, m_dir)
    fd = result.first_divergence
    key, target_key, module = MIX_KEY[bug]
    assert (fd.key, fd.target_key, fd.module, fd.direction) == (key, target_key, module, "forward")
    assert all(r.verdict == "pass" for r in result.rows if r.direction == "forward" and r.order < min(
        x.order for x in result.rows if x.golden_key == fd.key))


def test_port_bug_named_from_statistics_at_mix(dumps):
    fd = _compare(*dumps("transformer", "wrong_eps", "mix", "statistics")).first_divergence
    assert (fd.key, fd.module) == MIX_KEY["wrong_eps"][::2] and fd.statistics_based


def test_port_bug_named_at_l1(dumps):
    fd = _compare(*dumps("transformer", "transposed_weight", "L1")).first_divergence
    assert (fd.key, fd.target_key) == MIX_KEY["transposed_weight"][:2]
    assert "input.1 (not produced by any earlier recorded call" in fd.cause     # the weight, at L1


def test_mindspore_as_golden_side_at_mix(dumps):
    t_dir, m_dir = dumps("transformer", "wrong_eps", "mix")
    fd = _compare(m_dir, t_dir).first_divergence
    assert (fd.key, fd.target_key) == MIX_KEY["wrong_eps"][1::-1]
    assert fd.module == "Cell.ln1.LayerNorm.forward.0"
