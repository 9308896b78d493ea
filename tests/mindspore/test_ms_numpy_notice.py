"""MindSpore 2.10 under NumPy 2: its one-time numpy init prints NumPy's "compiled using NumPy 1.x"
message with a stack trace and logs "Numpy init failed."; tsprobe (and the recipes) run that init
through ts_core/backends/mindspore/numpy_init.py, which keeps exactly that out of the output. Each run is a fresh
process: the init happens once per process."""
import os
import subprocess
import sys

import numpy as np

import importlib.util

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = os.path.join(ROOT, "recipes")


def _numpy_init_module():
    """numpy_init.py loaded by path: importing its package would load MindSpore into this
    (torch) test process, which the suite keeps out."""
    path = os.path.join(ROOT, "ts_core", "backends", "mindspore", "numpy_init.py")
    spec = importlib.util.spec_from_file_location("tsprobe_numpy_init_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


without_numpy_init_noise = _numpy_init_module().without_numpy_init_noise

RAW = """
import numpy as np, mindspore as ms
ms.set_device("CPU")
try:
    (ms.Tensor(np.ones((1,), np.float32)) * 1.5).asnumpy()
except SystemError:
    print("SystemError")
"""
QUIET = """
import sys
sys.path.insert(0, {recipes!r})
import numpy as np, mindspore as ms
from ts_core.backends.mindspore.numpy_init import init_numpy_quietly
ms.set_device("CPU")
init_numpy_quietly()
print((ms.Tensor(np.ones((2,), np.float32)) * 2.0).asnumpy().tolist())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_the_notice_is_recognised_line_by_line_and_nothing_else_is_dropped():
    raw = _run(RAW)
    numpy2 = int(np.__version__.split(".")[0]) >= 2
    assert ("A module that was compiled using NumPy 1.x" in raw.stderr) is numpy2
    assert ("Numpy init failed." in raw.stderr) is numpy2
    assert (raw.stdout.strip() == "SystemError") is numpy2
    assert without_numpy_init_noise(raw.stderr) == ""
    other = "RuntimeError: an unrelated failure\n[ERROR] ME(1):2026 [kernel.cc:10] no kernel\n"
    assert without_numpy_init_noise(raw.stderr + other) == other


def test_init_mindspore_numpy_is_quiet_and_ops_work_after_it():
    quiet = _run(QUIET.format(recipes=RECIPES))
    assert quiet.stdout.splitlines()[-1] == "[2.0, 2.0]"
    assert "NumPy" not in quiet.stderr and "Numpy" not in quiet.stderr and "Traceback" not in quiet.stderr


USER_SCRIPT = """
import numpy as np, mindspore as ms
from mindspore import nn
ms.set_device("CPU")
from ts_core import PrecisionDebugger
net = nn.Dense(3, 2)
dbg = PrecisionDebugger(dump_path={dump!r}, level="L1", framework="mindspore", step=[0])
dbg.start(net)
out = net(ms.Tensor(np.ones((1, 3), np.float32)))
dbg.stop()
dbg.close()
print("ok", out.shape)
"""


def test_a_users_script_never_sees_the_notice(tmp_path):
    """tsprobe's own warm-up is the first MindSpore op: the user sees no NumPy-1.x traceback
    pointing into tsprobe, and the dump is written."""
    proc = _run(USER_SCRIPT.format(dump=str(tmp_path / "d")))
    assert proc.stdout.splitlines()[-1] == "ok (1, 2)"
    assert "NumPy 1.x" not in proc.stderr and "Numpy init failed" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "d" / "step0" / "rank" / "dump.json").is_file()
