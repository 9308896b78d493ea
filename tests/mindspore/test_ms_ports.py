"""PyTorch models and their MindSpore ports with identical weights, dumped by tsprobe on both
sides: every module's forward output matches its Cell's; each injected migration bug shows
first at the module it was put in. (Pairing here is deliberately simple: by module path and
call index, classes checked against torch_mapping.yaml. The compare engine's own alignment is
tested in tests/compare.)"""
import os

import numpy as np
import pytest

from ..conftest import load_dump, require
from . import ports

pytestmark = [require("mindspore"), require("torch")]

RTOL, ATOL = 1e-4, 1e-5


def _pairs(t_dir, m_dir):
    """[(path, index, torch record, ms record)] in torch execution order; asserts a full match."""
    mapping = ports.load_mapping()["modules"]
    t_out, m_out = ports.module_outputs(t_dir), ports.module_outputs(m_dir)
    assert t_out and set(t_out) == set(m_out), (sorted(t_out), sorted(m_out))
    pairs = []
    for (path, n), t_rec in t_out.items():
        m_rec = m_out[(path, n)]
        # a user class (Attention) keeps its name in the port; framework classes map
        assert m_rec["_class"] in mapping.get(t_rec["_class"], [t_rec["_class"]]), (t_rec["_key"], m_rec["_key"])
        pairs.append((path, n, t_rec, m_rec))
    return pairs


def _array(rank, summary):
    return np.load(os.path.join(rank, "dump_tensor_data", summary["data_name"]))


def _close(a, b):
    return a.shape == b.shape and np.allclose(a, b, rtol=RTOL, atol=ATOL)


def _first_divergence(t_dir, m_dir):
    for path, _, t_rec, m_rec in _pairs(t_dir, m_dir):
        if not _close(_array(t_dir, t_rec["output"][0]), _array(m_dir, m_rec["output"][0])):
            return path
    return None


@pytest.mark.parametrize("name", ports.MODELS)
def test_faithful_port_matches_module_by_module(tmp_path, name):
    t_dir, m_dir = ports.dump_pair(name, str(tmp_path), bug=None)
    pairs = _pairs(t_dir, m_dir)
    assert len(pairs) == {"mlp": 5, "cnn": 6, "transformer": 12}[name]
    for path, _, t_rec, m_rec in pairs:
        a, b = _array(t_dir, t_rec["output"][0]), _array(m_dir, m_rec["output"][0])
        assert _close(a, b), (path, float(np.abs(a - b).max()))
        ts, ms_ = t_rec["output"][0], m_rec["output"][0]
        assert ts["Max"] == pytest.approx(ms_["Max"], rel=RTOL, abs=ATOL)
        assert ts["Norm"] == pytest.approx(ms_["Norm"], rel=RTOL, abs=ATOL)
    # parameter gradients match too, under MindSpore's parameter names (weight -> gamma, ...)
    rename = ports.load_mapping()["parameters"]
    t_data, m_data = load_dump(t_dir)["data"], load_dump(m_dir)["data"]
    checked = 0
    for key, t_rec in t_data.items():
        if ".parameters_grad." not in key:
            continue
        path, cls = key.split(".")[1:-3], key.split(".")[-3]
        m_key = next(k for k in m_data if k.startswith("Cell." + ".".join(path) + ".")
                     and k.endswith(".parameters_grad.0") and k.count(".") == key.count("."))
        for pname, summaries in t_rec.items():
            m_name = rename.get(cls, {}).get(pname, pname)
            a = _array(t_dir, summaries[0])
            b = _array(m_dir, m_data[m_key][m_name][0])
            assert _close(a, b), (key, pname)
            checked += 1
    assert checked >= 4


@pytest.mark.parametrize("name,bug", sorted(ports.FIRST_DIVERGENCE))
def test_injected_bug_is_the_first_divergence(tmp_path, name, bug):
    t_dir, m_dir = ports.dump_pair(name, str(tmp_path), bug=bug)
    assert _first_divergence(t_dir, m_dir) == ports.FIRST_DIVERGENCE[name, bug]


def test_bug_names_are_checked():
    with pytest.raises(ValueError):
        ports.ms_model("mlp", bug="gelu_approx")
