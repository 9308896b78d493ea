"""seed_all covers MindSpore: seeds, deterministic mode, and rm_dropout."""
import random
import sys

import numpy as np
import pytest

import ts_core

from ..conftest import require
from .lazy import Lazy, helpers, mint, ms, nn, ops

_seed = Lazy("ts_core.backends.mindspore.seed")


def seed_all(*args, **kwargs):
    return _seed.seed_all(*args, **kwargs)


def restore_dropout():
    return _seed.restore_dropout()

pytestmark = require("mindspore")


@pytest.fixture
def no_dropout_restored():
    yield
    restore_dropout()
    if "torch" in sys.modules:        # ts_core.seed_all(rm_dropout=True) also patches torch's dropouts
        from ts_core.backends.torch.seed import restore_dropout as restore_torch_dropout

        restore_torch_dropout()


def _draws():
    return (random.random(), float(np.random.rand()), ops.standard_normal((4,)).asnumpy().tolist(),
            ops.uniform((3,), ms.Tensor(0.0), ms.Tensor(1.0)).asnumpy().tolist())


def test_seed_all_makes_random_draws_repeat():
    seed_all(7)
    first = _draws()
    seed_all(7)
    assert _draws() == first
    seed_all(8)
    assert _draws() != first


def _dropouts(x):
    """Every dropout seed 003 names, in training mode, with p=0.5."""
    x5 = x.reshape(2, 3, 1, 4, 4)
    return {
        "ops.Dropout": ops.Dropout(keep_prob=0.5)(x)[0],
        "ops.Dropout2D": ops.Dropout2D(keep_prob=0.5)(x)[0],
        "ops.Dropout3D": ops.Dropout3D(keep_prob=0.5)(x5)[0].reshape(x.shape),
        "nn.Dropout": nn.Dropout(p=0.5).set_train(True)(x),
        "ops.dropout": ops.dropout(x, p=0.5, training=True),
    }


def test_rm_dropout_makes_every_dropout_an_identity(no_dropout_restored):
    x = helpers.tensor((2, 3, 4, 4), seed=1)
    before = _dropouts(x)
    assert all(not np.array_equal(v.asnumpy(), x.asnumpy()) for v in before.values())   # they do drop
    early = nn.Dropout(p=0.5).set_train(True)         # created before seed_all: covered too
    seed_all(1234, rm_dropout=True)
    after = _dropouts(x)
    after["early nn.Dropout"] = early(x)
    # mint's dropouts have no CPU kernel: without rm_dropout they cannot run here at all
    after["mint.nn.Dropout"] = mint.nn.Dropout(p=0.5).set_train(True)(x)
    after["mint.nn.functional.dropout"] = mint.nn.functional.dropout(x, p=0.5, training=True)
    for name, v in after.items():
        assert np.array_equal(v.asnumpy(), x.asnumpy()), name
    mask = ops.Dropout(keep_prob=0.5)(x)[1]
    assert mask.shape == x.shape
    # gradients pass through unchanged
    g = ms.grad(lambda v: (ops.Dropout(keep_prob=0.5)(v)[0] * 3.0).sum())(x)
    assert np.all(g.asnumpy() == 3.0)


def test_restore_dropout_undoes_it(no_dropout_restored):
    x = helpers.tensor((2, 3, 4, 4), seed=2)
    seed_all(rm_dropout=True)
    restore_dropout()
    assert not np.array_equal(nn.Dropout(p=0.5).set_train(True)(x).asnumpy(), x.asnumpy())
    assert not np.array_equal(ops.dropout(x, p=0.5).asnumpy(), x.asnumpy())


def test_ts_core_seed_all_routes_to_mindspore(no_dropout_restored):
    x = helpers.tensor((2, 3, 4, 4), seed=3)
    ts_core.seed_all(11, rm_dropout=True)
    assert np.array_equal(ops.dropout(x, p=0.5).asnumpy(), x.asnumpy())
    a = ops.standard_normal((3,)).asnumpy()
    ts_core.seed_all(11)
    assert np.array_equal(ops.standard_normal((3,)).asnumpy(), a)


def test_deterministic_mode_and_validation():
    seed_all(3, mode=True)
    assert ms.get_context("deterministic") == "ON"
    seed_all(3, mode=False)
    assert ms.get_context("deterministic") == "OFF"
    for bad in (-1, 2**32, 1.5, True):
        with pytest.raises(ValueError):
            seed_all(bad)
    with pytest.raises(ValueError):
        seed_all(1, mode="yes")
