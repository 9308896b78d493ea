"""The mindtorch pieces that need no mindtorch: compare pairing, config, errors, imports."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ts_core.compare.crossframework import is_cross
from ts_core.config import build_config
from ts_core.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_mindtorch_dumps_compare_in_torch_vocabulary():
    assert not is_cross("mindtorch", "pytorch") and not is_cross("pytorch", "mindtorch")
    assert not is_cross("mindtorch", "mindtorch")
    assert is_cross("mindtorch", "mindspore") and is_cross("mindspore", "mindtorch")


def test_config_accepts_mindtorch_and_names_it_in_errors():
    assert build_config(None, framework="mindtorch").framework == "mindtorch"
    with pytest.raises(ConfigError, match="mindtorch"):
        build_config(None, framework="mindtorh")


def _fresh(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_without_mindtorch_the_error_says_what_to_install():
    """This venv has no mindtorch: asking for it fails clearly, before MindSpore is loaded."""
    proc = _fresh("import sys\n"
                  "from ts_core import PrecisionDebugger\n"
                  "try:\n"
                  "    PrecisionDebugger(dump_path='unused', framework='mindtorch').start()\n"
                  "except ImportError as e:\n"
                  "    print('ERR', e)\n"
                  "print('mindspore loaded:', 'mindspore' in sys.modules)\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ERR framework 'mindtorch' needs mindnlp's mindtorch package" in proc.stdout
    assert "docs/mindtorch.md" in proc.stdout
    assert "mindspore loaded: False" in proc.stdout


def test_import_ts_core_loads_no_framework():
    proc = _fresh("import sys, ts_core, ts_core.backends, ts_core.compare\n"
                  "print(sorted(m for m in ('torch', 'mindspore', 'mindtorch') if m in sys.modules))\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
