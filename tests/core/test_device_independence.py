"""A dump holds the same records whichever device and thread runs the program (issue 37).

The cause of the CUDA dump's missing records: inside the dumped step, torch's AdamW ran 9 tensor
methods per parameter on CPU (its for-loop implementation, recorded) and ``torch._foreach_*``
kernels on CUDA (its default there, not recorded): 468 calls for GPT-2 4x256. torch's optimizers
and gradient clipping are now machinery, recorded on no device (``backends/callers.py``).

CPU proxies for what else differs on CUDA: autograd runs ``backward`` on a device thread of its
own (hooks then run off the caller's thread: per-thread state such as the nesting depth or
autograd's sequence numbers), and statistics take the device path (``TSPROBE_NATIVE=0``: small
tensors resolved at flush, not host rows). The same program dumped with backward on the
caller's thread and on another thread must give the same records, value for value, at L0, L1
and mix, for statistics, md5 and tensor, with dropout (seeded alike) on and off and
deterministic algorithms on and off.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ..conftest import load_dump, require

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LEVELS, MODES = ("L0", "L1", "mix"), ("statistics", "md5", "tensor")


def _dumps(root, configs, native=True):
    """Dump each configuration in one subprocess (``TSPROBE_NATIVE`` is read at import)."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", TSPROBE_QUIET="1",
               TSPROBE_NATIVE="1" if native else "0")
    proc = subprocess.run([sys.executable, "-m", "tests.core.device_program", str(root), json.dumps(configs)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _data(root, name):
    return load_dump(os.path.join(str(root), name, "step1", "rank"))["data"]


def _tensor_files(root, name):
    folder = os.path.join(str(root), name, "step1", "rank", "dump_tensor_data")
    return {f: np.load(os.path.join(folder, f)) for f in sorted(os.listdir(folder))} if os.path.isdir(folder) else {}


# every level x mode; dropout and deterministic algorithms each on and off for every level and mode
_CASES = [(lv, md, drop, det) for (lv, md), (drop, det) in
          zip(itertools.product(LEVELS, MODES), itertools.cycle([(0.1, True), (0.0, False), (0.1, False), (0.0, True)]))]
_CASES += [(lv, md, 0.0 if drop else 0.1, not det) for lv, md, drop, det in _CASES]


@require("transformers")
@pytest.mark.slow
def test_backward_on_another_thread_on_the_device_path_records_the_same(tmp_path):
    configs = []
    for lv, md, drop, det in _CASES:
        name = f"{lv}-{md}-{drop}-{int(det)}"
        configs += [[name + "-same", lv, md, drop, det, False, "cpu", None],
                    [name + "-thread", lv, md, drop, det, True, "cpu", None]]
    losses = _dumps(tmp_path, configs, native=False)
    for lv, md, drop, det in _CASES:
        name = f"{lv}-{md}-{drop}-{int(det)}"
        assert losses[name + "-same"]["loss"] == losses[name + "-thread"]["loss"]
        same, thread = _data(tmp_path, name + "-same"), _data(tmp_path, name + "-thread")
        assert list(same) == list(thread), (name, set(same) ^ set(thread))
        assert same == thread, name
        backward = [k for k in same if ".backward" in k or "parameters_grad" in k]
        assert len(backward) > 10, name          # backward was recorded at all
        files = _tensor_files(tmp_path, name + "-same")
        assert (len(files) > 50) == (md == "tensor"), name
        other = _tensor_files(tmp_path, name + "-thread")
        assert list(files) == list(other) and all(np.array_equal(files[f], other[f]) for f in files), name


@require("transformers")
def test_records_equal_an_independent_computation_of_the_gradients(tmp_path):
    """The device path's statistics of the threaded backward against numpy of autograd's own
    gradients (the run's ``p.grad`` before clipping, when the dump's hook read it)."""
    from .device_program import dump_step

    got = dump_step(str(tmp_path / "d"), "mix", "statistics", 0.1, True, threaded=True)
    data = _data(tmp_path, "d")
    rec = data["Module.transformer.ln_f.LayerNorm.parameters_grad.0"]
    g = got["grads"]["transformer.ln_f.weight"].numpy().astype(np.float64)
    assert rec["weight"][0]["Max"] == pytest.approx(g.max(), rel=1e-6)
    assert rec["weight"][0]["Min"] == pytest.approx(g.min(), rel=1e-6)
    assert rec["weight"][0]["Norm"] == pytest.approx(np.linalg.norm(g), rel=1e-5)


@require("transformers")
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_optimizer_and_clipping_implementations_torch_picks_per_device_record_the_same(tmp_path, level):
    """CPU's default AdamW (for-loop) and CUDA's default (foreach): the same records; before the
    fix the for-loop dump held 9 calls per parameter more."""
    from .device_program import dump_step

    loop = dump_step(str(tmp_path / "loop"), level, "statistics", 0.0, False, foreach=False)
    fe = dump_step(str(tmp_path / "foreach"), level, "statistics", 0.0, False, foreach=True)
    a, b = _data(tmp_path, "loop"), _data(tmp_path, "foreach")
    assert list(a) == list(b)
    assert a == b               # step 1's parameters agree bit for bit after step 0's update
    assert not [k for k in a if k.split(".")[1] in ("lerp_", "addcdiv_", "addcmul_", "_foreach_norm")]
    for name, g in loop["grads"].items():
        assert torch.equal(g, fe["grads"][name])
