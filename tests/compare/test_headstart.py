"""Compare's head start (ts_core/headstart.py) changes no result: the judge takes its kernel
results only for exactly the files, dtypes and tolerance they were computed for, and computes
everything else itself. Checked against the same compare without a head start, in both tensor
layouts, after a file changed under it, at a tolerance it did not guess, and through the CLI.
The head start runs in a forked child (so the tests below that patch the kernel patch the child's
copy too)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ts_core.verdicts import ERROR, PASS
from ts_core import headstart
from ts_core.compare import api, pick_tolerance
from ts_core.writer.tensor_files import TensorPackWriter

from compare_dumpgen import DumpWriter

N = 40_000          # elements a tensor: 80 kB of float16, above the head start's floor below


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(headstart, "MIN_BYTES", 1 << 16)
    headstart.stop()
    headstart._results.clear()
    yield
    headstart.stop()
    headstart._results.clear()


def _dumps(root, packed=False):
    rng = np.random.default_rng(3)
    golden = [rng.standard_normal(N).astype((np.float64, np.float32, np.float16)[i % 3]) for i in range(6)]
    for side in ("golden", "target"):
        d = DumpWriter(root / side)
        for i, g in enumerate(golden):         # target: errors from far within to far beyond tolerance
            noise = (g * 10.0 ** rng.uniform(-9, -2, N)).astype(g.dtype) if side == "target" else 0
            d.forward(f"Functional.linear.{i}.forward", [], [g + noise])
        d.forward("Functional.small.0.forward", [], [np.arange(10, dtype=np.float32)])      # under the floor
        folder = d.close()
        if packed:
            _pack(folder)
    return str(root / "golden"), str(root / "target")


def _pack(folder):
    """The rank folder in the packed layout, written by the tool's own pack writer."""
    tensors, errors = folder / "dump_tensor_data", []
    writer = TensorPackWriter(str(folder), lambda a: a, errors.append)
    for name in sorted(os.listdir(tensors)):
        writer.submit(name, np.load(tensors / name))
    writer.close()
    assert not errors
    shutil.rmtree(tensors)
    doc = json.loads((folder / "dump.json").read_text())
    doc.update(dump_data_dir=str(folder / "dump_tensor_data.tar"), tensor_format="packed")
    (folder / "dump.json").write_text(json.dumps(doc))


def _rows(golden, target, **kw):
    res = api.compare(golden, target, workers=1, verbose=False, html=False, **kw)
    return [r.to_dict() for p in res.pairs for r in p.rows]


def _head_start(golden, target, rtol=None, atol=None):
    headstart.begin(golden, target, rtol, atol, True)
    headstart.stop(finish=True)     # let it finish every pair (in the CLI the judge stops it)


def test_default_tolerances_are_the_judges():
    from ts_core import native

    dtypes = {native.F32: "torch.float32", native.F64: "torch.float64", native.F16: "torch.float16"}
    assert set(headstart.DEFAULT_TOLERANCE) == set(dtypes)
    for gc, g_dtype in dtypes.items():
        for tc, t_dtype in dtypes.items():      # a pair of two dtypes: the stricter, as the judge takes
            tol = pick_tolerance(g_dtype, t_dtype)
            assert headstart.default_tolerance(gc, tc) == (tol.rtol, tol.atol)


@pytest.mark.parametrize("packed", [False, True])
def test_results_taken_are_those_the_judge_computes(tmp_path, monkeypatch, packed):
    golden, target = _dumps(tmp_path, packed)
    want = _rows(golden, target)
    _head_start(golden, target)
    assert len(headstart._results) == 6                     # the six large pairs, not the small one
    taken = []
    real = headstart.take
    monkeypatch.setattr(headstart, "take", lambda *a: taken.append(real(*a)) or taken[-1])
    assert _rows(golden, target) == want
    assert sum(t is not None for t in taken) == 6 and not headstart.pending()
    assert any(r["verdict"] != PASS for r in want)          # a compare that finds something


def test_a_file_changed_after_the_head_start_is_read_again(tmp_path):
    golden, target = _dumps(tmp_path)
    _head_start(golden, target)
    path = os.path.join(target, "step0", "rank0", "dump_tensor_data", "Functional.linear.1.forward.output.0.npy")
    arr, before = np.load(path), os.stat(path).st_mtime_ns
    np.save(path, arr + np.float32(1.0))                    # the same file, size and inode: new bytes
    os.utime(path, ns=(before + 1000, before + 1000))       # a later time, whatever the clock's tick
    got = _rows(golden, target)
    headstart._results.clear()
    assert got == _rows(golden, target)
    row = next(r for r in got if r["name"] == "Functional.linear.1.forward.output.0")
    g = np.load(path.replace(target, golden)).astype(np.float64)
    assert row["verdict"] == ERROR and row["max_abs_err"] == pytest.approx(np.abs(arr + np.float32(1.0) - g).max())


def test_a_tensor_linked_under_two_names_is_compared_once(tmp_path):
    """As the writer stores a tensor recorded twice (an output that is the next call's input): the
    head start compares the pair of files once, and the judge gives both names that result."""
    golden, target = _dumps(tmp_path)
    for side in (golden, target):
        folder = os.path.join(side, "step0", "rank0", "dump_tensor_data")
        second = os.path.join(folder, "Functional.linear.4.forward.output.0.npy")
        os.unlink(second)
        os.link(os.path.join(folder, "Functional.linear.1.forward.output.0.npy"), second)
    _head_start(golden, target)
    assert len(headstart._results) == 5                     # six names, five pairs of files
    got = _rows(golden, target)
    assert not headstart.pending()
    headstart._results.clear()
    assert got == _rows(golden, target)
    one, four = (next(r for r in got if r["name"] == f"Functional.linear.{i}.forward.output.0") for i in (1, 4))
    assert one["max_abs_err"] == four["max_abs_err"] > 0 and one["cosine"] == four["cosine"]


def test_a_tolerance_it_did_not_guess_is_computed_by_the_judge(tmp_path):
    golden, target = _dumps(tmp_path)
    _head_start(golden, target)                             # at the dtype defaults
    got = _rows(golden, target, rtol=1e-3, atol=1e-6)
    assert len(headstart._results) == 6                     # none of them was this compare's
    headstart._results.clear()
    assert got == _rows(golden, target, rtol=1e-3, atol=1e-6)


def test_stop_ends_the_child_and_keeps_only_whole_pairs(tmp_path, monkeypatch):
    """The judge starts while the child is in its first pair's first part: stop() sets the flag,
    the child drops that pair and ends, and nothing reaches the results."""
    import time

    golden, target = _dumps(tmp_path)
    from ts_core import native

    real, record = native.compare_range, tmp_path / "parts"
    started_r, started_w = os.pipe()
    flags = []
    real_mmap = headstart.mmap.mmap

    class FlagMap:                       # the anonymous one-byte flag begin() makes, kept at hand
        def __new__(cls, fileno, length, *a, **kw):
            m = real_mmap(fileno, length, *a, **kw)
            if fileno == -1:
                flags.append(m)
            return m

    def first_part(*a):                  # in the child: say so, then wait for the parent's stop
        with open(record, "a") as f:
            f.write("part\n")
        if len(record.read_text()) == len("part\n"):
            os.write(started_w, b"x")
            deadline = time.monotonic() + 30
            while not flags[0][0] and time.monotonic() < deadline:
                time.sleep(0.001)
        return real(*a)

    monkeypatch.setattr(headstart.mmap, "mmap", FlagMap)
    monkeypatch.setattr(native, "COMPARE_SEGMENT", N // 4)
    monkeypatch.setattr(native, "COMPARE_CHUNK", N // 8)
    monkeypatch.setattr(native, "compare_range", first_part)
    headstart.begin(golden, target, None, None, True)
    pid = headstart._child[0]
    assert os.read(started_r, 1) == b"x"
    headstart.stop()
    for fd in (started_r, started_w):
        os.close(fd)
    assert record.read_text() == "part\n" and headstart._results == {} and headstart._child is None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)      # reaped: no child left behind


def test_a_child_killed_while_sending_gives_no_results(tmp_path, monkeypatch):
    """Half its results in the pipe, then SIGKILL (the OOM killer, a user's kill): the parent
    takes nothing from it, reaps it, and the judge computes every pair itself."""
    import marshal
    import signal

    golden, target = _dumps(tmp_path)
    want = _rows(golden, target)

    def half_then_killed(fd, results):
        data = marshal.dumps(results)
        os.write(fd, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    monkeypatch.setattr(headstart, "_send", half_then_killed)
    headstart.begin(golden, target, None, None, True)
    pid = headstart._child[0]
    headstart.stop(finish=True)
    assert headstart._results == {} and headstart._child is None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)      # reaped
    assert _rows(golden, target) == want


def test_the_cli_compare_with_its_head_start_writes_what_the_api_does(tmp_path):
    """The `tsprobe` program, in a process of its own (the head start runs only in a fresh one):
    the judge takes the head start's results, and compare.csv is the API's."""
    golden, target = _dumps(tmp_path)
    out = tmp_path / "out"
    driver = (
        "import sys\n"
        "from ts_core import cli, headstart\n"
        "headstart.MIN_BYTES = 1 << 16\n"
        "real, taken = headstart.take, []\n"
        "headstart.take = lambda *a: taken.append(real(*a)) or taken[-1]\n"
        "import atexit\n"
        "atexit.register(lambda: print('taken', sum(t is not None for t in taken), headstart._child is None))\n"
        "sys.argv = ['tsprobe'] + sys.argv[1:]\n"
        "cli.entry()\n")
    proc = subprocess.run([sys.executable, "-c", driver, "compare", golden, target, "-o", str(out), "--no-html",
                           "--workers", "1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines()[-1] == "taken 6 True"      # every large pair, the child reaped
    api_out = tmp_path / "api"
    api.compare(golden, target, str(api_out), workers=1, verbose=False, html=False)
    assert (out / "compare.csv").read_bytes() == (api_out / "compare.csv").read_bytes()


def test_the_cli_starts_no_child_in_a_process_that_has_numpy(tmp_path, monkeypatch):
    from ts_core.cli import main

    golden, target = _dumps(tmp_path)
    begun = []
    monkeypatch.setattr(headstart, "begin", lambda *a: begun.append(a))
    assert main(["compare", golden, target, "-o", str(tmp_path / "out"), "--no-html", "--workers", "1"]) == 1
    assert begun == []
