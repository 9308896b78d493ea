"""Run a MindSpore-using test in a child pytest process.

Importing MindSpore into the main test process makes later tests that start a debugger
without a model ambiguous (both frameworks imported), so these tests keep it out."""
import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_FLAG = "TSPROBE_COMPAT_CHILD"


def needs_mindspore() -> None:
    """Skip without importing MindSpore (importorskip would import it into this process)."""
    import pytest
    if importlib.util.find_spec("mindspore") is None:
        pytest.skip("needs mindspore installed")


def in_child_process(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if os.environ.get(_FLAG) == "1":
            return fn(*args, **kwargs)
        node = f"{Path(sys.modules[fn.__module__].__file__).resolve().relative_to(ROOT)}::{fn.__name__}"
        env = dict(os.environ, **{_FLAG: "1"})
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", node],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
        if " passed" not in out.stdout:
            import pytest
            pytest.skip("skipped in the child process: " + out.stdout.strip().splitlines()[-1])
    return wrapper
