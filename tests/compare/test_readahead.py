"""The judge's read-ahead (judge/readahead.py) changes no result: every row, the first
divergence and the summary are those of the same compare with the read-ahead off, on a real
model's tensor dump and on value pairs built to take every path of the judge (kernel parts,
the numpy path, masks in two encodings, squeezed shapes, missing and cut files, a size
that differs from the record). It takes the pairs it planned, drops the ones the judge passes
over, computes an unplanned read where it is asked for, and keeps its window. A pair of files
linked under several names is read once per tolerance."""
import json
import os

import numpy as np
import pytest

from ts_core.verdicts import PASS
from ts_core.compare import api, pipeline
from ts_core.compare.judge import metrics, readahead
from ts_core.compare.judge.readahead import PlannedRead, ReadAhead
from ts_core.compare.load.loader import Dump, find_dumps

from compare_dumpgen import DumpWriter
from compare_models import dump_mix


def _tool_dump(path, **bug):
    return dump_mix(path, task="tensor", **bug)


def _edge_dumps(root):
    """Value pairs built for each path of the judge; the target breaks some on purpose."""
    rng = np.random.default_rng(1)
    big = rng.standard_normal(300_000).astype(np.float32)                 # several kernel parts
    spread = (big * 10.0 ** rng.uniform(-8, -2, big.size)).astype(np.float32)   # errors across the tolerance
    ties = np.ones(200_000, np.float32)                                   # the same error in every part
    vals = {
        "big": (big, big + spread),
        "ties": (ties, ties + np.float32(1e-2)),
        "f64": (rng.standard_normal((30, 40)), None),
        "f16": (rng.standard_normal(500).astype(np.float16), None),        # the numpy path
        "i64": (rng.integers(0, 9, (6, 7)), None),
        "squeezed": (rng.standard_normal((4, 1, 8)).astype(np.float32), "squeeze"),
        "missing": (rng.standard_normal(64).astype(np.float32), None),
        "cut": (rng.standard_normal(50_000).astype(np.float32), None),
        "resized": (rng.standard_normal(64).astype(np.float32), None),
    }
    mask = np.triu(np.ones((8, 8), dtype=bool), 1)
    dirs = []
    for side in ("golden", "target"):
        d = DumpWriter(root / side)
        for i, (name, (g, t)) in enumerate(vals.items()):
            if side == "golden" or t is None:
                out = g
            elif isinstance(t, str):
                out = g.reshape(4, 8)
            else:
                out = t
            d.forward(f"Functional.{name}.{i}.forward", [g], [out])
        m = mask if side == "golden" else np.where(mask, np.float32(-1e9), np.float32(0))
        d.forward("Functional.scaled_dot_product_attention.0.forward", [], [], kwargs={"attn_mask": m})
        dirs.append(d.close())
    data = dirs[1] / "dump_tensor_data"
    (data / "Functional.missing.6.forward.output.0.npy").unlink()
    cut = data / "Functional.cut.7.forward.output.0.npy"
    cut.write_bytes(cut.read_bytes()[:-1000])
    np.save(data / "Functional.resized.8.forward.output.0.npy", np.zeros(65, np.float32))
    return str(root / "golden"), str(root / "target")


def _compare(golden, target, monkeypatch, ahead_on: bool):
    made = []
    real = pipeline.reading_ahead

    def recording(plan, **kw):
        ctx = real(plan, **kw)
        made.append(ctx)
        return ctx
    monkeypatch.setattr(pipeline, "reading_ahead", recording)
    monkeypatch.setattr(readahead, "WINDOW_PAIRS", readahead.WINDOW_PAIRS if ahead_on else 0)
    res = api.compare(golden, target, workers=1, verbose=False, html=False)
    rows = [r.to_dict() for p in res.pairs for r in p.rows]
    summary = json.dumps(res.summary(), sort_keys=True)
    return rows, summary, made


@pytest.mark.parametrize("case", ["tool", "edges"])
def test_rows_are_those_of_the_compare_without_read_ahead(tmp_path, monkeypatch, case):
    if case == "tool":
        golden, target = _tool_dump(tmp_path / "g"), _tool_dump(tmp_path / "t", perturb=True)
    else:
        monkeypatch.setattr(metrics, "CHUNK", 1 << 14)      # kernel parts of 64k elements: several a tensor
        monkeypatch.setattr(metrics, "SEGMENT", 1 << 16)
        golden, target = _edge_dumps(tmp_path)
    on_rows, on_summary, _ = _compare(golden, target, monkeypatch, True)
    off_rows, off_summary, _ = _compare(golden, target, monkeypatch, False)
    assert on_rows == off_rows and on_summary == off_summary
    tensor_rows = [r for r in on_rows if r["mode"] == "tensor"]
    assert tensor_rows and any(r["verdict"] != PASS for r in tensor_rows)      # the planted difference shows
    if case == "edges":
        reasons = " | ".join(r["reason"] for r in on_rows)
        for expected in ("tensor file missing", "header says", "size differs", "the same mask in two encodings",
                         "differ only in size-1 dimensions"):
            assert expected in reasons


def test_the_read_ahead_takes_what_it_planned(tmp_path, monkeypatch):
    golden, target = _tool_dump(tmp_path / "g"), _tool_dump(tmp_path / "t", perturb=True)
    seen = []
    real_take = ReadAhead.take

    def take(self, read):
        got = real_take(self, read)
        seen.append(self)
        return got
    monkeypatch.setattr(ReadAhead, "take", take)
    opened = []
    real_open = readahead.Ahead._open
    monkeypatch.setattr(readahead.Ahead, "_open", lambda self: opened.append(self.read) or real_open(self))
    rows, _, _ = _compare(golden, target, monkeypatch, True)
    ahead = seen[-1]
    reads = sum(1 for r in rows if r["mode"] == "tensor")
    assert ahead.taken == reads > 10 and ahead.missed == 0 and ahead.dropped == 0
    # the writer links a tensor recorded under two names (an output that is the next call's input):
    # such a pair of files is read once
    pairs = {readahead.identity(r) for r in opened}
    assert 0 < ahead.repeats == reads - len(opened) and len(pairs) == len(opened)


def _dumps_of(root, n, elems):
    """Two one-call-per-tensor dumps of `n` float32 tensors; the rank Dumps."""
    rng = np.random.default_rng(0)
    for side in ("golden", "target"):
        d = DumpWriter(root / side)
        for i in range(n):
            d.forward(f"Functional.linear.{i}.forward", [], [rng.standard_normal(elems).astype(np.float32)])
        d.close()
    (g,), (t,) = find_dumps(root / "golden"), find_dumps(root / "target")
    return Dump(g), Dump(t)


def _read(gd, td, i):
    name = f"Functional.linear.{i}.forward.output.0.npy"
    return PlannedRead(gd, name, td, name, 1e-4, 1e-5, True)


def test_passed_over_pairs_are_dropped_and_unplanned_reads_computed_here(tmp_path):
    gd, td = _dumps_of(tmp_path, 6, 1000)
    ahead = ReadAhead(iter([_read(gd, td, i) for i in (0, 1, 2, 3)]))
    first = ahead.take(_read(gd, td, 0))
    assert ahead.taken == 1 and ahead.dropped == 0
    want = metrics.compare_arrays(*(d.load_tensor(_read(gd, td, 0).g_name) for d in (gd, td)), 1e-4, 1e-5)
    assert first.metrics() == want                                   # the metrics compare_arrays gives
    assert ahead.take(_read(gd, td, 3)) is not None and ahead.dropped == 2      # 1 and 2 passed over
    assert ahead.take(_read(gd, td, 5)) is None and ahead.missed == 1           # never planned
    other_tol = PlannedRead(gd, _read(gd, td, 4).g_name, td, _read(gd, td, 4).t_name, 1e-3, 1e-5, True)
    assert ahead.take(other_tol) is None                             # planned at another tolerance: not this read
    ahead.close()


def test_the_window_bounds_the_bytes_opened_ahead(tmp_path):
    elems = 4096
    gd, td = _dumps_of(tmp_path, 40, elems)
    pair = 2 * 4 * elems
    ahead = ReadAhead(iter([_read(gd, td, i) for i in range(40)]), window_bytes=5 * pair)
    for i in range(40):
        assert ahead.take(_read(gd, td, i)) is not None
        assert ahead.bytes <= 5 * pair and len(ahead.pending) <= 5 and ahead.started_bytes <= 5 * pair
    assert ahead.taken == 40 and not ahead.pending


def test_a_taken_pair_gives_its_room_to_the_next_at_once(tmp_path):
    """The kernel threads get the next pair while the judge still works on the one it took, not
    when it asks for another (they sat idle in between: 7.0 -> 8.8-9.5 GB/s on 2 GB, 2 cores)."""
    elems = 4096
    gd, td = _dumps_of(tmp_path, 8, elems)
    pair = 2 * 4 * elems
    ahead = ReadAhead(iter([_read(gd, td, i) for i in range(8)]), window_bytes=3 * pair)
    for i in range(5):                  # three pairs after it remain to be planned
        got = ahead.take(_read(gd, td, i))
        started = [a.read.g_name for a in ahead.pending.values() if a.started]
        assert got.started and started == [_read(gd, td, j).g_name for j in range(i + 1, i + 4)]
        assert ahead.started_bytes == 3 * pair
    ahead.close()


def test_pairs_the_head_start_computed_take_no_room(tmp_path, monkeypatch):
    """A pair whose metrics the head start computed reads nothing: the window reaches past it to
    the pairs the threads must compute (a window of computed pairs left them idle), and its
    metrics are still compare_arrays'."""
    from ts_core import headstart

    elems = 4096
    gd, td = _dumps_of(tmp_path, 8, elems)
    pair = 2 * 4 * elems
    monkeypatch.setattr(headstart, "MIN_BYTES", 1)
    headstart.begin(str(tmp_path / "golden"), str(tmp_path / "target"), 1e-4, 1e-5, True)
    headstart.stop(finish=True)
    keep = {readahead.identity(_read(gd, td, i))[:2] for i in (1, 2, 3)}
    for key in [k for k in headstart._results if k[:2] not in keep]:
        del headstart._results[key]                     # as if it had stopped after pairs 1-3
    try:
        ahead = ReadAhead(iter([_read(gd, td, i) for i in range(8)]), window_bytes=2 * pair)
        got = ahead.take(_read(gd, td, 0))
        started = sorted(int(a.read.g_name.split(".")[2]) for a in ahead.pending.values() if a.started)
        assert started == [1, 2, 3, 4, 5] and ahead.started_bytes == 2 * pair and not headstart.pending()
        for i in range(8):
            got = got if i == 0 else ahead.take(_read(gd, td, i))
            assert got.metrics() == metrics.compare_arrays(*got.arrays(), 1e-4, 1e-5)
    finally:
        headstart.end()


def test_a_pair_larger_than_the_window_is_read_only_when_taken(tmp_path):
    elems = 4096
    gd, td = _dumps_of(tmp_path, 6, elems)
    pair = 2 * 4 * elems
    ahead = ReadAhead(iter([_read(gd, td, i) for i in range(6)]), window_bytes=pair // 2)
    for i in range(6):
        got = ahead.take(_read(gd, td, i))
        assert not got.started                                  # nothing read ahead of the judge
        assert all(not a.started for a in ahead.pending.values()) and ahead.started_bytes == 0
        assert got.metrics() == metrics.compare_arrays(*got.arrays(), 1e-4, 1e-5)


def test_linked_files_are_read_once_per_tolerance(tmp_path):
    """A tensor recorded under two names is one file with two links, on each side. The second
    name takes the first one's metrics at the same tolerance; at another tolerance, or when the
    judge passed over the first, it is read and judged itself. Every result is compare_arrays'."""
    gd, td = _dumps_of(tmp_path, 4, 5000)
    name = [_read(gd, td, i).g_name for i in range(4)]
    for d in (gd, td):                      # tensor 2 and 3 become second names of tensor 0
        first = d.locate(name[0])[0]
        for i in (2, 3):
            os.unlink(d.locate(name[i])[0])
            os.link(first, os.path.join(os.path.dirname(first), name[i]))
    loose = PlannedRead(gd, name[2], td, name[2], 1e-2, 1e-3, True)
    reads = [_read(gd, td, 0), _read(gd, td, 1), _read(gd, td, 2), loose, _read(gd, td, 3)]

    def judged(ahead, read):
        got = ahead.take(read)
        return got.judged_before() or got.metrics()

    def want(read):
        return metrics.compare_arrays(gd.load_tensor(read.g_name), td.load_tensor(read.t_name), read.rtol, read.atol)
    ahead = ReadAhead(iter(reads))
    got = [judged(ahead, r) for r in reads]
    assert ahead.repeats == 2                               # reads[2] and reads[4]; `loose` is read
    assert got == [want(r) for r in reads] and got[2] is got[0] is got[4] and got[3].rtol == 1e-2
    assert got[0].allclose_ratio < 1 and got[3].allclose_ratio > got[0].allclose_ratio   # the tolerance shows

    passed_over = ReadAhead(iter(reads))
    assert judged(passed_over, reads[2]) == want(reads[0])   # the first name never judged: read here
    assert passed_over.dropped == 2
