"""TroubleShooter save/save_grad (seed 004): numbering, suffixes, gradients, bfloat16."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .isolate import in_child_process, needs_mindspore as _needs_mindspore

HERE = Path(__file__).parent
EXPECTED = ["0_input.npy", "1_dense.npy", "2_dense_backward.npy"]


def _run_example(name, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE.parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, str(HERE / "examples" / name), str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _check_seed004_files(d):
    assert sorted(p.name for p in d.glob("*.npy")) == EXPECTED
    data = np.array([[0.2, 0.5, 0.2]], dtype=np.float32)
    np.testing.assert_array_equal(np.load(d / "0_input.npy"), data)
    # zero weights and bias: logits are 0, softmax is uniform
    np.testing.assert_array_equal(np.load(d / "1_dense.npy"), np.zeros((1, 2), np.float32))
    # d(cross-entropy with soft label [1, 0])/d(logits) = softmax - label
    np.testing.assert_allclose(np.load(d / "2_dense_backward.npy"), [[-0.5, 0.5]], atol=1e-7)


def test_seed004_torch_example(tmp_path):
    out = _run_example("seed004_torch.py", tmp_path)
    assert str(EXPECTED) in out.stdout
    _check_seed004_files(tmp_path / "torch_ts_save")


def test_seed004_mindspore_example(tmp_path):
    _needs_mindspore()
    out = _run_example("seed004_mindspore.py", tmp_path)
    assert str(EXPECTED) in out.stdout
    _check_seed004_files(tmp_path / "ms_ts_save")


def test_seed004_dirs_compare_equal(tmp_path):
    _needs_mindspore()
    _run_example("seed004_torch.py", tmp_path)
    _run_example("seed004_mindspore.py", tmp_path)
    from ts_core.compat import migrator
    rows = migrator.compare_npy_dir(str(tmp_path / "ms_ts_save"), str(tmp_path / "torch_ts_save"))
    assert [(r.orig_name, r.target_name, r.allclose) for r in rows] == [(n, n, True) for n in EXPECTED]


def test_torch_numbering_suffix_containers_and_grad(tmp_path):
    import torch
    from ts_core.compat import save, save_grad
    from ts_core.compat.save import reset_save_counter
    reset_save_counter()
    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, 2)
    save(str(tmp_path / "x"), x, suffix="fw")
    y = save_grad(str(tmp_path / "y"), x @ w)
    save(str(tmp_path / "pair"), (x, "not a tensor", w))
    save(str(tmp_path / "d"), {"a": w})
    (y * y).sum().backward()
    names = sorted(p.name for p in tmp_path.glob("*.npy"))
    assert names == ["0_x_fw.npy", "1_pair_0.npy", "1_pair_2.npy", "2_d_a.npy", "3_y_backward.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "1_pair_2.npy"), w.numpy())
    ref = 2 * (x.detach().numpy() @ w.numpy())        # d(sum(y^2))/dy
    np.testing.assert_allclose(np.load(tmp_path / "3_y_backward.npy"), ref, rtol=1e-5, atol=1e-6)
    # the value passed through is unchanged and the gradient to x is intact
    np.testing.assert_allclose(x.grad.numpy(), ref @ w.numpy().T, rtol=1e-5)


def test_torch_bfloat16_saved_as_float32(tmp_path):
    import torch
    from ts_core.compat import save
    from ts_core.compat.save import reset_save_counter
    reset_save_counter(7)
    x = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    save(str(tmp_path / "b"), x)
    a = np.load(tmp_path / "7_b.npy")
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, [1.5, -2.25, 3.0])


@in_child_process
def test_mindspore_bfloat16_and_grad(tmp_path):
    _needs_mindspore()
    import mindspore as ms
    from ts_core.backends.mindspore._runtime import warm_up
    warm_up()   # numpy-2 quirk of MindSpore 2.10 (ENVIRONMENT.md), for the test's own ops
    from ts_core.compat import save, save_grad
    from ts_core.compat.save import reset_save_counter
    reset_save_counter()
    save(str(tmp_path / "b"), ms.Tensor(np.array([1.5, -2.25], np.float32)).astype(ms.bfloat16))
    np.testing.assert_array_equal(np.load(tmp_path / "0_b.npy"), [1.5, -2.25])
    w = ms.Tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))

    def f(x):
        y = save_grad(str(tmp_path / "y"), ms.ops.matmul(x, w))
        return (y * y).sum()

    xv = np.array([[0.5, -1.0]], np.float32)
    ms.grad(f)(ms.Tensor(xv))
    np.testing.assert_allclose(np.load(tmp_path / "1_y_backward.npy"), 2 * (xv @ w.asnumpy()), rtol=1e-6)


def test_save_rejects_non_tensor(tmp_path):
    from ts_core.compat import save
    with pytest.raises(TypeError):
        save(str(tmp_path / "x"), 3.0)
