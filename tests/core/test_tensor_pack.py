"""The packed tensor layout (tensor_format: packed): one tar per step and rank that unpacks to
msprobe's layout byte for byte, survives a kill -9, and is read in place by compare and summary."""
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import torch

from ts_core import PrecisionDebugger
from ts_core.cli import main as cli_main
from ts_core.compare import compare, summarize
from ts_core.config import build_config
from ts_core.dumpfmt import DumpFormatError
from ts_core.dumpfmt.tensor_pack import PACK_INDEX, PACK_TAR, PackReader, npy_parts, scan
from ts_core.dumpfmt.unpack import unpack
from ts_core.errors import ConfigError
from ts_core.writer import recover

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Tied(torch.nn.Module):
    """Tied embedding/head: the same tensor is recorded under many names (links)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight
        self.mix = torch.nn.Linear(11, 11)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mix(torch.tanh(self.head(self.emb(ids))))


def _run(path: str, tensor_format: str, scale: float = 1.0) -> None:
    torch.manual_seed(0)
    model = _Tied()
    with torch.no_grad():
        model.mix.weight.mul_(scale)
    dbg = PrecisionDebugger(dump_path=path, task="tensor", level="mix", step=[0], tensor_format=tensor_format,
                            on_write_error="raise")
    dbg.start(model)
    model(torch.tensor([[1, 2, 3, 4]])).square().mean().backward()
    dbg.stop()
    dbg.step()
    dbg.close()


def _tree(root: str) -> dict:
    """relative path -> (bytes, group of names sharing the inode)."""
    out, inodes = {}, {}
    for r, _, files in os.walk(root):
        for f in files:
            p = os.path.join(r, f)
            st = os.stat(p)
            inodes.setdefault((st.st_dev, st.st_ino), []).append(os.path.relpath(p, root))
    for names in inodes.values():
        for n in names:
            with open(os.path.join(root, n), "rb") as fh:
                out[n] = (fh.read(), tuple(sorted(names)))
    return out


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """The same step written in both layouts, the packed one's files dump under its future name."""
    base = tmp_path_factory.mktemp("pack")
    files, packed = str(base / "files"), str(base / "packed")
    for path, tensor_format in ((files, "files"), (packed, "packed")):    # one call site: the same stacks
        _run(path, tensor_format)
    return base, files, packed


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
    np.arange(24, dtype=np.int64).reshape(2, 3, 4)[:, ::2, 1:],      # not contiguous
    np.array(3.5, dtype=np.float16),
    np.zeros((0, 5), dtype=np.int8),
    np.array([True, False]),
    np.arange(6, dtype=np.complex64),
])
def test_member_bytes_are_what_np_save_writes(array):
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    head, data = npy_parts(array)
    assert head + data.tobytes() == buf.getvalue()


def test_packed_run_writes_one_tar_and_no_tensor_files(dumps):
    _, _, packed = dumps
    rank = os.path.join(packed, "step0", "rank")
    files_rank = os.path.join(dumps[1], "step0", "rank")
    want = set(os.listdir(files_rank)) - {"dump_tensor_data"} | {PACK_INDEX, PACK_TAR}
    assert set(os.listdir(rank)) == want
    header = json.load(open(os.path.join(rank, "dump.json")))
    assert header["tensor_format"] == "packed" and header["dump_data_dir"].endswith(PACK_TAR)


def test_tar_x_gives_back_the_default_layout_byte_for_byte(dumps, tmp_path):
    _, files, packed = dumps
    with tarfile.open(os.path.join(packed, "step0", "rank", PACK_TAR)) as tar:   # python's own tar reader
        assert all(m.name.startswith("dump_tensor_data/") for m in tar.getmembers())
        tar.extractall(tmp_path, filter="data")
    want = _tree(os.path.join(files, "step0", "rank", "dump_tensor_data"))
    got = _tree(str(tmp_path / "dump_tensor_data"))
    assert got == want
    assert any(len(group) > 1 for _, group in want.values())       # repeated tensors are hard links in both


def test_unpack_gives_the_default_modes_tree_byte_for_byte(dumps, tmp_path):
    """The files run moved aside, the packed run unpacked where it was: every file, dump.json
    included, has the same bytes and the same hard links. fingerprint.json records the config each
    run was given (its dump_path and tensor_format), so it differs by design."""
    base, files, packed = dumps
    want = _tree(files)
    aside = str(tmp_path / "aside")
    shutil.move(files, aside)
    try:
        assert cli_main(["unpack", packed, "--out", files]) == 0
        got = _tree(files)
    finally:
        shutil.rmtree(files, ignore_errors=True)
        shutil.move(aside, files)
    fingerprint = os.path.join("step0", "rank", "fingerprint.json")
    assert got.pop(fingerprint) != want.pop(fingerprint)
    assert got == want and len(got) > 20
    assert os.path.isfile(os.path.join(packed, "step0", "rank", PACK_TAR))    # --out leaves the pack


def test_unpack_in_place_replaces_the_pack(dumps, tmp_path):
    _, files, packed = dumps
    copy = str(tmp_path / "p")
    shutil.copytree(packed, copy)
    unpack(copy)
    rank = os.path.join(copy, "step0", "rank")
    assert not os.path.exists(os.path.join(rank, PACK_TAR)) and not os.path.exists(os.path.join(rank, PACK_INDEX))
    head = json.load(open(os.path.join(rank, "dump.json")))
    ran_at = os.path.join(packed, "step0", "rank", "dump_tensor_data")     # as the default mode names it
    assert head["dump_data_dir"] == ran_at and "tensor_format" not in head
    assert _tree(os.path.join(rank, "dump_tensor_data")) == _tree(os.path.join(files, "step0", "rank",
                                                                               "dump_tensor_data"))


def test_compare_reads_the_pack_in_place_with_the_same_result(dumps, tmp_path):
    base, files, packed = dumps
    files_t, packed_t = str(base / "files_t"), str(base / "packed_t")
    _run(files_t, "files", scale=1.01)
    _run(packed_t, "packed", scale=1.01)
    a = compare(files, files_t, workers=1, verbose=False, html=False)
    b = compare(packed, packed_t, workers=1, verbose=False, html=False)
    c = compare(files, packed_t, workers=1, verbose=False, html=False)       # one of each layout
    def text(res, golden, target):          # the summary without the two paths it names
        return json.dumps(res.summary(), sort_keys=True).replace(target, "TARGET").replace(golden, "GOLDEN")

    assert text(a, files, files_t) == text(b, packed, packed_t) == text(c, files, packed_t)
    assert a.first_divergence is not None and a.first_divergence.key == b.first_divergence.key
    rows = [[r.to_dict() for r in res.rows] for res in (a, b, c)]
    assert rows[0] == rows[1] == rows[2] and any(r["mode"] == "tensor" for r in rows[0])
    assert not list((base / "packed").rglob("dump_tensor_data/*"))       # nothing was extracted


def test_pack_loads_are_mapped_views_with_the_files_values(dumps):
    _, files, packed = dumps
    reader = PackReader(os.path.join(packed, "step0", "rank"))
    folder = os.path.join(files, "step0", "rank", "dump_tensor_data")
    assert sorted(reader.names()) == sorted(os.listdir(folder))
    for name in reader.names():
        got, want = reader.load(name), np.load(os.path.join(folder, name))
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert not got.flags.writeable


def test_summary_reads_the_pack(dumps, capsys):
    _, files, packed = dumps
    f, p = summarize(files)[0], summarize(packed)[0]
    assert p["tensor_format"] == "packed" and f["tensor_format"] == "files"
    assert p["tensor_files"] == f["tensor_files"] > 0
    assert p["tensors_stored"] == f["tensors_stored"] == len(os.listdir(os.path.join(files, "step0", "rank",
                                                                                      "dump_tensor_data")))
    assert cli_main(["summary", packed]) == 0
    assert "packed" in capsys.readouterr().out


def test_missing_index_is_rebuilt_from_the_tar(dumps, tmp_path):
    _, _, packed = dumps
    copy = tmp_path / "p"
    shutil.copytree(packed, copy)
    rank = copy / "step0" / "rank"
    with open(rank / PACK_INDEX) as f:
        want = json.load(f)
    os.unlink(rank / PACK_INDEX)
    index = scan(str(rank / PACK_TAR))
    assert {k: list(v) for k, v in index.members.items()} == want["members"] and index.links == want["links"]
    assert compare(packed, str(copy), workers=1, verbose=False, html=False).first_divergence is None


def test_corrupt_tar_gives_a_clear_error(dumps, tmp_path, capsys):
    _, _, packed = dumps
    copy = tmp_path / "p"
    shutil.copytree(packed, copy)
    rank = copy / "step0" / "rank"
    os.unlink(rank / PACK_INDEX)
    with open(rank / PACK_TAR, "r+b") as f:
        f.seek(1024 + 512 * 3)
        f.write(b"garbage!" * 64)                       # over a header block in the middle
    with pytest.raises(DumpFormatError, match="not a tar archive: bad header"):
        scan(str(rank / PACK_TAR))
    assert cli_main(["compare", packed, str(copy), "--no-html"]) == 2
    assert "not a tar archive" in capsys.readouterr().err


def test_index_longer_than_the_tar_names_recover(dumps, tmp_path):
    _, _, packed = dumps
    copy = tmp_path / "p"
    shutil.copytree(packed, copy)
    rank = copy / "step0" / "rank"
    with open(rank / PACK_TAR, "r+b") as f:
        f.truncate(2048)
    with pytest.raises(DumpFormatError, match="tsprobe recover"):
        PackReader(rank)


def test_tensor_format_is_validated_and_read_from_an_msprobe_config(tmp_path):
    with pytest.raises(ConfigError, match="tensor_format"):
        build_config(task="tensor", tensor_format="tar")
    with pytest.raises(ConfigError, match="structure"):
        build_config(task="structure", level="mix", tensor_format="packed")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "tensor", "dump_path": str(tmp_path), "level": "L1",
                                "tensor": {"scope": [], "list": [], "data_mode": ["all"], "tensor_format": "packed"}}))
    assert build_config(str(path)).tensor_format == "packed"
    assert build_config(task="tensor").tensor_format == "files"


KILLED = """
import time, torch
from ts_core import PrecisionDebugger
d = PrecisionDebugger(dump_path={dump!r}, task="tensor", level="L1", step=[0], tensor_format="packed")
d.start()
x = torch.linspace(-1, 1, 1000)
for i in range(40):
    x = torch.sin(x)
time.sleep(1.5)                 # the writer thread has every member on disk by now
print("ready", flush=True)
time.sleep(60)
"""


def test_killed_packed_run_keeps_every_member_and_recover_cuts_a_torn_tail(tmp_path):
    dump = str(tmp_path / "d")
    proc = subprocess.Popen([sys.executable, "-c", KILLED.format(dump=dump)], env=dict(os.environ, PYTHONPATH=ROOT),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    rank = os.path.join(dump, "step0", "rank")
    tar = os.path.join(rank, PACK_TAR)
    assert not os.path.exists(os.path.join(rank, PACK_INDEX))          # the step never ended
    whole = os.path.getsize(tar)
    with open(tar, "ab") as f:                      # a member the kill cut: its header and half its data
        f.write(open(tar, "rb").read()[:512 + 1000])
    assert recover(rank) == 41                      # linspace and 40 sins
    with tarfile.open(tar) as t:                    # a valid tar again, with every completed member
        names = {m.name for m in t.getmembers()}
    assert os.path.getsize(tar) == whole + 1024     # the torn member cut, the end marker written
    data = json.load(open(os.path.join(rank, "dump.json")))["data"]
    named = {"dump_tensor_data/" + leaf["data_name"] for rec in data.values() for v in rec.values()
             if isinstance(v, list) for leaf in v if isinstance(leaf, dict) and "data_name" in leaf}
    assert len(names) == 81 and names == named      # each sin's input is a link to the previous output
    x = torch.linspace(-1, 1, 1000)
    reader = PackReader(rank)
    for i in range(40):
        rec = data[f"Torch.sin.{i}.forward"]
        np.testing.assert_array_equal(reader.load(rec["input_args"][0]["data_name"]), x.numpy())
        x = torch.sin(x)
        np.testing.assert_array_equal(reader.load(rec["output"][0]["data_name"]), x.numpy())


FSIZE = """
import resource, torch
from ts_core import PrecisionDebugger
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
d = PrecisionDebugger(dump_path={dump!r}, task="tensor", level="L1", step=[0], tensor_format="packed")
d.start()
x = torch.ones(64, 64)
for i in range(20):
    x = torch.sin(x)            # 16 KiB a member: the tar meets the file-size limit mid-member
d.stop()
d.close()
print("training went on:", float(x.sum()) > 0, flush=True)
"""


def test_a_write_that_fails_mid_member_is_cut_so_the_tar_holds_only_whole_members(tmp_path):
    dump = str(tmp_path / "d")
    proc = subprocess.run([sys.executable, "-c", FSIZE.format(dump=dump)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT, TSPROBE_QUIET="1"), timeout=120)
    assert proc.returncode == 0 and "training went on: True" in proc.stdout, proc.stderr[-2000:]
    rank = os.path.join(dump, "step0", "rank")
    assert json.load(open(os.path.join(rank, "dump.json"))).get("incomplete") is True
    index = scan(os.path.join(rank, PACK_TAR))
    assert 3 <= len(index.members) < 40
    # the half member was cut: the tar ends at its last whole member (+ the end marker if it fit)
    assert os.path.getsize(os.path.join(rank, PACK_TAR)) in (index.end, index.end + 1024)
    reader = PackReader(rank)
    x = torch.ones(64, 64)
    values = {}
    for i in range(20):
        values[f"Torch.sin.{i}.forward.input.0.npy"] = x.numpy()
        x = torch.sin(x)
        values[f"Torch.sin.{i}.forward.output.0.npy"] = x.numpy()
    for name in reader.names():                 # every member kept is whole and right
        np.testing.assert_array_equal(reader.load(name), values[name])
