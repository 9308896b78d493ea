"""A requested step that never came is named when the debugger closes (``close()``, the end of a
``with`` block, or the process end): ``step=[1, 3]`` in a 2-step run must not end silently."""
import os
import subprocess
import sys

import pytest

from ts_core import PrecisionDebugger

from .models import make

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train(dbg, steps):
    model, x = make("mlp")
    for _ in range(steps):
        dbg.start(model)
        model(x).sum().backward()
        dbg.stop()
        dbg.step()


@pytest.fixture
def loud(monkeypatch):
    monkeypatch.delenv("TSPROBE_QUIET", raising=False)     # the [tsprobe] lines are what is under test


def test_close_names_the_requested_steps_that_never_came(tmp_path, capsys, loud):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", step=[1, 3])
    _train(dbg, 2)
    assert dbg.never_came() == [3]
    dbg.close()
    err = capsys.readouterr().err
    assert "[tsprobe] step 1 dumped to" in err
    assert "[tsprobe] requested step 3 never came (the last step begun was 1): nothing was dumped for it" in err
    assert sorted(os.listdir(tmp_path / "d")) == ["step1"]


def test_a_with_block_says_it_and_a_run_that_reached_every_step_says_nothing(tmp_path, capsys, loud):
    with PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1", step=[0, 4, 5]) as dbg:
        _train(dbg, 2)
    assert "requested steps 4, 5 never came (the last step begun was 1)" in capsys.readouterr().err
    with PrecisionDebugger(dump_path=str(tmp_path / "b"), level="L1", step=[0, 1]) as dbg:
        _train(dbg, 2)
    assert "never came" not in capsys.readouterr().err
    with PrecisionDebugger(dump_path=str(tmp_path / "c"), level="L1") as dbg:     # every step: none missing
        _train(dbg, 1)
    assert "never came" not in capsys.readouterr().err


def test_the_process_end_says_it_for_a_debugger_never_closed(tmp_path):
    script = (f"import sys; sys.path.insert(0, {ROOT!r})\n"
              "from tests.core.models import make\n"
              "from ts_core import PrecisionDebugger\n"
              f"dbg = PrecisionDebugger(dump_path={str(tmp_path / 'd')!r}, level='L1', step=[0, 3])\n"
              "model, x = make('mlp')\n"
              "dbg.start(model); model(x).sum().backward(); dbg.stop(); dbg.step()\n")
    env = {k: v for k, v in os.environ.items() if k != "TSPROBE_QUIET"}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "[tsprobe] requested step 3 never came (the last step begun was 0)" in p.stderr
