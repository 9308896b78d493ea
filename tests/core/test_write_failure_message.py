"""Issue 25: after a dump that could not be written, the step line must not say it was dumped."""
import pytest

from ts_core import PrecisionDebugger

from .models import make


def _one_step(dump_path: str, capsys, block=None) -> str:
    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=dump_path, level="L1", step=[0])
    if block is not None:                 # after the dump_path check at construction: the write fails
        block.write_text("not a folder")
    dbg.start(model)
    model(x).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    return capsys.readouterr().err


def test_an_unwritable_dump_path_is_not_reported_as_dumped(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TSPROBE_QUIET")             # the step line is what is under test
    blocker = tmp_path / "file"
    with pytest.warns(RuntimeWarning, match="marked incomplete"):
        err = _one_step(str(blocker / "dump"), capsys, block=blocker)
    assert "dumped to" not in err
    assert f"[tsprobe] step 0: writing the dump to {blocker / 'dump' / 'step0' / 'rank'} failed" in err


def test_a_written_dump_is_reported_as_dumped(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TSPROBE_QUIET")
    err = _one_step(str(tmp_path / "dump"), capsys)
    assert f"[tsprobe] step 0 dumped to {tmp_path / 'dump' / 'step0' / 'rank'}" in err
