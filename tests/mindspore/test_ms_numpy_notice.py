"""MindSpore 2.10 under NumPy 2: its one-time numpy init prints NumPy's "compiled using NumPy 1.x"
message with a stack trace and logs "Numpy init failed."; the recipes run that init through
recipes/mindspore_numpy.py, which keeps exactly that out of the output. Each run is a fresh
process: the init happens once per process."""
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = os.path.join(ROOT, "recipes")
sys.path.insert(0, RECIPES)

from mindspore_numpy import without_numpy_init_noise  # noqa: E402

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
from mindspore_numpy import init_mindspore_numpy
ms.set_device("CPU")
init_mindspore_numpy()
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
