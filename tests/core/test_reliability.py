"""Write failures warn once and keep training alive; a killed run keeps what it collected."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from ts_core import DumpWriteError, PrecisionDebugger
from ts_core.errors import ConfigError
from ts_core.dumpfmt.rankdir import read_construct, read_stacks
from ts_core.writer import recover

from ..conftest import load_dump
from .models import make

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_unwritable_dump_path_warns_once_and_training_goes_on(tmp_path):
    blocker = tmp_path / "file"
    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=str(blocker / "dump"), level="mix", step=[0, 1])
    blocker.write_text("not a folder")           # after the check at construction: a write fails
    with pytest.warns(RuntimeWarning, match="marked incomplete") as record:
        for _ in range(2):
            dbg.start(model)
            loss = model(x).sum()
            loss.backward()
            dbg.stop()
            dbg.step()
    dbg.close()
    ours = [w for w in record if "tsprobe" in str(w.message)]
    assert len(ours) == 1 and torch.isfinite(loss)
    assert ours[0].filename == __file__           # the warning points at the user's line, not ours


def test_an_unwritable_dump_path_is_an_error_at_construction(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    for path, why in ((blocker / "dump", f"{blocker} is a file"), (blocker, "it is a file, not a folder")):
        with pytest.raises(ConfigError) as info:
            PrecisionDebugger(dump_path=str(path), level="L1", step=[0])
        assert f"config field 'dump_path': got {str(path)!r}" in str(info.value) and why in str(info.value)
    assert PrecisionDebugger.current() is None


def test_on_write_error_raise_stops_instead(tmp_path):
    blocker = tmp_path / "file"
    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=str(blocker / "dump"), level="L1", step=[0], on_write_error="raise")
    blocker.write_text("x")
    with pytest.raises(DumpWriteError, match="could not write"):
        dbg.start(model)


def test_no_half_written_json_when_the_disk_fills(tmp_path, monkeypatch):
    """dump.json is written atomically: a failure leaves the previous complete file."""
    import ts_core.dumpfmt.jsonio as atomic

    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", step=[0])
    dbg.start(model)
    model(x).sum().backward()
    dbg.stop()                                    # first complete dump.json
    rank_dir = tmp_path / "d" / "step0" / "rank"
    first = load_dump(str(rank_dir))
    class FillsUp:              # the temp file gets half of the text, then the disk is full
        def __init__(self, f):
            self.f = f

        def write(self, text):
            self.f.write(text[:len(text) // 2])
            self.f.flush()
            raise OSError(28, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(atomic, "open", lambda *a, **k: FillsUp(open(*a, **k)), raising=False)
    dbg.start(model)
    model(x).sum().backward()
    with pytest.warns(RuntimeWarning, match="No space left"):
        dbg.stop()
    monkeypatch.delattr(atomic, "open")
    assert load_dump(str(rank_dir)) == first      # old complete file, not a torn one
    assert not list(rank_dir.glob("*.tmp*"))
    dbg.close()
    final = load_dump(str(rank_dir))
    assert final.get("incomplete") is True and len(final["data"]) > len(first["data"])


KILLED = """
import time, torch
from ts_core import PrecisionDebugger
from ts_core.errors import ConfigError
d = PrecisionDebugger(dump_path={dump!r}, level="L1", step=[0])
d.start()
x = torch.ones(4)
for i in range(50):
    x = torch.sin(x)
time.sleep(1.5)
print("ready", flush=True)
time.sleep(60)
"""


def test_kill_9_mid_step_keeps_records_and_recover_rebuilds_dump_json(tmp_path):
    dump = str(tmp_path / "d")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-c", KILLED.format(dump=dump)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        # records collected > 1 s ago must be on disk: one more call triggers nothing here, so
        # the time-based flush must already have happened at the last call or at the next one.
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    rank_dir = os.path.join(dump, "step0", "rank")
    assert not os.path.exists(os.path.join(rank_dir, "dump.json"))
    n = recover(rank_dir)
    data = load_dump(rank_dir)["data"]
    assert n == len(data)
    assert "Torch.sin.0.forward" in data
    assert data["Torch.sin.0.forward"]["input_args"][0]["Max"] == 1.0


def test_torn_journal_line_is_ignored(tmp_path):
    from ts_core.dumpfmt import JOURNAL as JOURNAL_NAME

    rank_dir = tmp_path / "r"
    rank_dir.mkdir()
    good = {"t": "data", "k": "Torch.sin.0.forward", "v": {"output": []}}
    (rank_dir / JOURNAL_NAME).write_text(json.dumps(good) + "\n" + '{"t": "data", "k": "Torch.co')
    assert recover(str(rank_dir)) == 1


FSIZE = """
import resource, torch
from ts_core import PrecisionDebugger
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
d = PrecisionDebugger(dump_path={dump!r}, task="tensor", level="L1", step=[0])
d.start()
x = torch.ones(128, 128)
for i in range(5):
    x = torch.sin(x)            # 64 KiB per tensor file: over the 20 kB per-file limit
d.stop()
d.close()
print("training went on:", float(x.sum()) > 0, flush=True)
"""


def test_file_size_limit_warns_and_training_goes_on(tmp_path):
    dump = str(tmp_path / "d")
    env = dict(os.environ, PYTHONPATH=ROOT, TSPROBE_QUIET="1")
    proc = subprocess.run([sys.executable, "-c", FSIZE.format(dump=dump)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "training went on: True" in proc.stdout
    assert proc.stderr.count("marked incomplete") == 1
    # the tensor files hit the limit; dump.json (five small records) fits under it and says so
    assert load_dump(os.path.join(dump, "step0", "rank")).get("incomplete") is True


TENSOR_DIR_LOST = """
import os, shutil, torch
from ts_core import DumpWriteError, PrecisionDebugger
from ts_core.errors import ConfigError
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
x = torch.randn(32, 64)
linear = torch.nn.functional.linear
d = PrecisionDebugger(dump_path={dump!r}, task="tensor", level="L1", step=[0], on_write_error="raise")
d.start(model)
model(x)
d.stop()                                  # the first forward's files are written
tensor_dir = os.path.join({dump!r}, "step0", "rank", "dump_tensor_data")
shutil.rmtree(tensor_dir)
open(tensor_dir, "w").close()             # the folder becomes a file: every later write fails
d.start(model)
try:
    for _ in range(3):
        model(x)
    d.stop()
    print("no error", flush=True)
except DumpWriteError as exc:
    print("DumpWriteError on the training thread:", exc, flush=True)
d.close()
print("closed; linear restored:", torch.nn.functional.linear is linear, flush=True)
"""


def test_tensor_write_failure_reaches_the_training_thread_and_nothing_hangs(tmp_path):
    """on_write_error: raise with task tensor: a write that fails on the writer thread is raised
    at the next forward or at stop(), once; close() then returns and restores everything."""
    dump = str(tmp_path / "d")
    env = dict(os.environ, PYTHONPATH=ROOT, TSPROBE_QUIET="1")
    proc = subprocess.run([sys.executable, "-c", TENSOR_DIR_LOST.format(dump=dump)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    assert lines[0].startswith("DumpWriteError on the training thread: tsprobe could not write the dump in "
                               f"{os.path.join(dump, 'step0', 'rank')}") and "Not a directory" in lines[0]
    assert lines[1] == "closed; linear restored: True"
    final = load_dump(os.path.join(dump, "step0", "rank"))
    assert final.get("incomplete") is True
    assert {"Functional.linear.0.forward", "Functional.linear.1.forward"} <= set(final["data"])


def test_tensor_writer_reports_its_first_failure_once_on_the_calling_thread(tmp_path):
    """Writes queued behind a failed one fail too; one report, on the thread that calls in."""
    from ts_core.writer.tensor_files import TensorFileWriter

    reported = []
    writer = TensorFileWriter(lambda t: t.numpy(), lambda exc: reported.append((exc, threading.get_ident())))
    for i in range(5):
        writer.submit(str(tmp_path / "missing" / f"t{i}.npy"), torch.ones(2))
    writer.drain()
    writer.submit(str(tmp_path / f"ok.npy"), torch.full((2,), 3.0))
    writer.close()
    assert [type(e) for e, _ in reported] == [FileNotFoundError]
    assert reported[0][1] == threading.get_ident()
    assert np.load(tmp_path / "ok.npy").tolist() == [3.0, 3.0]


def test_tensor_writer_bounds_the_bytes_waiting_for_the_disk(tmp_path):
    """Past the first snapshot, at most max_bytes wait for the writer: the next submit blocks
    until the disk has taken enough; one snapshot larger than the bound still goes alone."""
    from ts_core.writer.tensor_files import TensorFileWriter

    disk_free = threading.Event()

    def slow_disk(t):                   # runs on the writer thread
        disk_free.wait(10)
        return t.numpy()

    writer = TensorFileWriter(slow_disk, lambda exc: None, max_bytes=1000)
    writer.submit(str(tmp_path / "big.npy"), torch.ones(400))          # 1600 bytes: goes alone
    second = threading.Thread(target=writer.submit, args=(str(tmp_path / "b.npy"), torch.full((100,), 2.0)))
    second.start()
    second.join(0.5)
    assert second.is_alive()            # 1600 + 400 bytes > 1000: waits for the first write
    disk_free.set()
    second.join(10)
    assert not second.is_alive()
    writer.close()
    assert np.load(tmp_path / "big.npy").sum() == 400
    assert np.load(tmp_path / "b.npy").tolist() == [2.0] * 100
    assert writer._in_flight == 0


def test_record_keys_cannot_escape_the_dump_folder(tmp_path):
    import types

    lib = types.ModuleType("evil")
    lib.f = lambda t: t + 1
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="tensor", level="debug", step=[0])
    dbg.start()
    dbg.save(torch.ones(2), "../../escape")
    dbg.stop()
    dbg.close()
    assert not list(tmp_path.glob("**/escape*.npy")) or all(
        "dump_tensor_data" in str(p) for p in tmp_path.glob("**/escape*.npy"))
    rec = load_dump(str(tmp_path / "d" / "step0" / "rank"))["data"]["../../escape.0.debug"]
    assert "/" not in rec["data_name"]
    assert os.path.isfile(tmp_path / "d" / "step0" / "rank" / "dump_tensor_data" / rec["data_name"])


def test_a_short_step_creates_no_journal_and_a_later_one_holds_the_whole_step(tmp_path, monkeypatch):
    """The journal is made by the first flush with lines dump.json does not hold: none for a
    step that ends before the flush interval; when records come after a stop() of the same
    step and are flushed, the journal is created with every line of the step, so recover alone
    rebuilds all of it."""
    from ts_core.dumpfmt import JOURNAL as JOURNAL_NAME
    from ts_core.record import collector as collector_mod
    from ts_core.writer import journal as journal_mod

    monkeypatch.setattr(collector_mod, "FLUSH_SECONDS", 3600.0)      # no flush by time in this test
    created = []
    real_open = os.open
    monkeypatch.setattr(journal_mod.os, "open", lambda path, *a: created.append(path) or real_open(path, *a))
    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", step=[0, 1])
    rank = tmp_path / "d" / "step0" / "rank"
    dbg.start(model)
    model(x).sum().backward()
    dbg.stop()
    first = load_dump(str(rank))["data"]
    assert created == [] and not (rank / JOURNAL_NAME).exists() and len(first) > 5
    dbg.start(model)                    # the same step again (a second micro-batch)
    model(x * 2).sum().backward()
    dbg._collector.flush()              # what the interval or the idle flusher does
    assert created == [str(rank / JOURNAL_NAME)]
    shutil.copy(rank / JOURNAL_NAME, tmp_path / "journal.copy")
    dbg.stop()
    final = load_dump(str(rank))["data"]
    assert set(first) < set(final)
    dbg.step()
    dbg.close()
    assert not (rank / JOURNAL_NAME).exists()       # complete: removed
    alone = tmp_path / "alone" / "step0" / "rank"
    alone.mkdir(parents=True)
    shutil.copy(tmp_path / "journal.copy", alone / JOURNAL_NAME)
    assert recover(str(alone)) == len(final)
    rebuilt = load_dump(str(alone))["data"]
    assert set(rebuilt) == set(final)
    # parameters_grad records are re-taken at stop(), after the journal was copied
    assert {k: v for k, v in rebuilt.items() if "parameters_grad" not in k} == \
        {k: v for k, v in final.items() if "parameters_grad" not in k}
    # the journal's stack and construct lines rebuild stack.json and construct.json too
    stacks = {k: frames for keys, frames in read_stacks(str(rank)) for k in keys}
    rebuilt_stacks = {k: frames for keys, frames in read_stacks(str(alone)) for k in keys}
    assert rebuilt_stacks and rebuilt_stacks == {k: stacks[k] for k in rebuilt_stacks}
    assert set(rebuilt_stacks) == {k for k in rebuilt if ".forward" in k}       # every forward record
    construct, rebuilt_construct = read_construct(str(rank)), read_construct(str(alone))
    assert rebuilt_construct and rebuilt_construct == {k: construct[k] for k in rebuilt_construct}
    assert any(v is not None for v in rebuilt_construct.values())     # mix: modules nest


def test_tsprobe_recover_cli(tmp_path, capsys):
    from ts_core.cli import main
    from ts_core.dumpfmt import JOURNAL as JOURNAL_NAME

    rank_dir = tmp_path / "step0" / "rank"
    rank_dir.mkdir(parents=True)
    rec = {"t": "data", "k": "Torch.sin.0.forward", "v": {"output": []}}
    (rank_dir / JOURNAL_NAME).write_text(json.dumps(rec) + "\n")
    assert main(["recover", str(tmp_path)]) == 0
    assert "1 records recovered" in capsys.readouterr().out
    assert main(["recover", str(tmp_path / "nothing")]) == 2


class _Tied(torch.nn.Module):
    """An input embedding and an output head sharing one weight (GPT-2, Llama, BERT do this)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))


def test_tied_weight_gradient_is_recorded_under_both_modules_with_autograds_values(tmp_path):
    torch.manual_seed(0)
    model = _Tied()
    ids = torch.tensor([[1, 2, 3, 4]])
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="tensor", level="L0", step=[0],
                            on_write_error="raise")
    dbg.start(model)
    model(ids).square().mean().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    rank = tmp_path / "step0" / "rank"
    dump = load_dump(str(rank))
    grads = [v for k, v in dump["data"].items() if ".parameters_grad" in k]
    names = {g["weight"][0]["data_name"] for g in grads}
    assert len(grads) == 2 and all((rank / "dump_tensor_data" / n).is_file() for n in names)
    for n in names:      # the file holds the shared weight's whole gradient (autograd's)
        np.testing.assert_array_equal(np.load(rank / "dump_tensor_data" / n), model.emb.weight.grad.numpy())
    assert "incomplete" not in dump
