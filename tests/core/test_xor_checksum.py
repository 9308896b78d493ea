"""summary_mode "xor": msprobe's 64-bit XOR checksum in the ``md5`` field instead of the statistics,
checked against a plain-Python fold of the bytes and against msprobe itself."""
import os

import numpy as np
import torch

from ts_core import PrecisionDebugger, build_config, compare

from ..conftest import load_dump, require
from ..msprobe_ref import msprobe_json, run_msprobe
from .models import make

MASK = (1 << 64) - 1


def python_xor(raw: bytes) -> int:
    """The definition, byte by byte: little-endian 8-byte words, the last one zero-padded."""
    raw = raw + b"\0" * (-len(raw) % 8)
    acc = 0
    for i in range(0, len(raw), 8):
        acc ^= int.from_bytes(raw[i:i + 8], "little")
    return acc


def expected(t: torch.Tensor):
    if t.numel() == 0:
        return None
    if t.dim() == 0:
        v = t.item()
        return v if isinstance(v, float) else f"0x{int(v) & MASK:016x}"
    b = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return f"0x{python_xor(b):016x}"


def _tensors():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 5, generator=g)
    return {
        "odd_bytes_f32": a,                                       # 60 bytes: a padded tail word
        "transposed": a.t(),                                      # non-contiguous
        "bf16": a.to(torch.bfloat16),
        "f16_7": torch.randn(7, generator=g).half(),
        "f64": torch.randn(4, 3, generator=g, dtype=torch.float64),
        "int64": torch.arange(-5, 6),
        "int32": torch.arange(9, dtype=torch.int32) * -3,
        "bool": torch.tensor([True, False, True]),
        "uint8": torch.arange(13, dtype=torch.uint8),
        "scalar_f32": torch.tensor(2.5),
        "scalar_i64": torch.tensor(-7),
        "empty": torch.empty(0, 4),
    }


def _run(dump_root, fn, **kw):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0], summary_mode="xor", **kw)
    dbg.start()
    fn()
    dbg.stop()
    dbg.close()
    return load_dump(os.path.join(dump_root, "step0", "rank"))


def test_each_tensor_gets_the_xor_of_its_bytes_and_no_statistics(dump_root):
    ts = _tensors()
    dump = _run(dump_root, lambda: [torch.clone(t) for t in ts.values()])
    recs = [dump["data"][f"Torch.clone.{i}.forward"] for i in range(len(ts))]
    for (name, t), rec in zip(ts.items(), recs):
        summary = rec["input_args"][0]
        assert summary["md5"] == expected(t), name
        assert rec["output"][0]["md5"] == expected(t), name        # a clone has the same bytes
        assert not {"Max", "Min", "Mean", "Norm"} & set(summary), name
        assert list(summary) == ["type", "dtype", "shape", "md5", "requires_grad"]     # msprobe's order
    assert dump["data"]["Torch.clone.0.forward"]["input_args"][0]["md5"] != \
        dump["data"]["Torch.clone.4.forward"]["input_args"][0]["md5"]


def test_a_single_flipped_bit_changes_the_checksum(dump_root):
    a = torch.randn(64, generator=torch.Generator().manual_seed(1))
    b = a.clone()
    b.view(torch.int32)[17] ^= 1 << 3
    dump = _run(dump_root, lambda: (torch.abs(a), torch.abs(b)))
    xa = dump["data"]["Torch.abs.0.forward"]["input_args"][0]["md5"]
    xb = dump["data"]["Torch.abs.1.forward"]["input_args"][0]["md5"]
    assert int(xa, 16) ^ int(xb, 16) == (1 << 3) << (32 * (17 % 2))


def test_training_step_backward_and_parameter_grads_carry_xor(dump_root):
    model, x = make("mlp")
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0], summary_mode="xor")
    dbg.start(model)
    model(x).pow(2).mean().backward()
    dbg.stop()
    dbg.close()
    data = load_dump(os.path.join(dump_root, "step0", "rank"))["data"]
    grad = data["Module.fc2.Linear.parameters_grad.0"]["weight"][0]
    assert grad["md5"] == expected(model.fc2.weight.grad)
    back = data["Module.fc1.Linear.backward.0"]
    assert all(s["md5"].startswith("0x") and "Max" not in s for s in back["input"] + back["output"])


@require("msprobe")
def test_same_checksums_as_msprobe(tmp_path):
    """msprobe 26.2.0 run on the same tensors in its own process: identical md5 fields."""
    ts = _tensors()
    torch.save(ts, tmp_path / "tensors.pt")
    root = run_msprobe({"task": "statistics", "rank": [], "step": [], "level": "L1",
                        "risk_level": "ALL",       # msprobe skips "low-risk" APIs such as clone by default
                        "statistics": {"summary_mode": "xor"}},
                       "ts = torch.load(sys.argv[1])\n"
                       "d.start()\n"
                       "for t in ts.values(): torch.clone(t)\n"
                       "d.stop(); d.step()\n", tmp_path, [str(tmp_path / "tensors.pt")])
    theirs = msprobe_json(root)["data"]
    ours = _run(str(tmp_path / "ours"), lambda: [torch.clone(t) for t in ts.values()])["data"]
    assert set(theirs) == set(ours)
    for key, rec in theirs.items():
        for field in ("input_args", "output"):
            assert [s.get("md5") for s in rec[field] if isinstance(s, dict)] == \
                [s.get("md5") for s in ours[key][field] if isinstance(s, dict)], key


def test_compare_treats_xor_as_equal_or_not(tmp_path):
    """Two runs, the second with one op changed: the xor rows of that op and everything after
    it are 'bitwise different (xor)', the rest 'bitwise equal (xor)'."""
    roots = []
    for run, scale in (("a", 1.0), ("b", 1.0 + 2 ** -20)):
        root = str(tmp_path / run)
        model, x = make("mlp")
        dbg = PrecisionDebugger(dump_path=root, level="L1", step=[0], summary_mode="xor")
        dbg.start(model)
        torch.nn.functional.relu(model.fc1(x) * scale).sum()
        dbg.stop()
        dbg.close()
        roots.append(root)
    result = compare(roots[0], roots[1], verbose=False)
    rows = {r.name: r for r in result.rows}
    assert rows["Functional.linear.0.forward.output.0"].reason == "bitwise equal (xor)"
    assert rows["Tensor.__mul__.0.forward.output.0"].reason == "bitwise different (xor)"
    assert rows["Tensor.__mul__.0.forward.output.0"].verdict == "error"
    assert result.first_divergence.key == "Tensor.__mul__.0.forward"


def test_xor_checksums_of_two_kinds_are_never_compared(tmp_path):
    """A crc32 (md5 mode) and an xor checksum of the same tensor are not 'different'."""
    roots = []
    for run, mode in (("a", "md5"), ("b", "xor")):
        root = str(tmp_path / run)
        dbg = PrecisionDebugger(dump_path=root, level="L1", step=[0], summary_mode=mode)
        dbg.start()
        torch.abs(torch.arange(10.0))
        dbg.stop()
        dbg.close()
        roots.append(root)
    result = compare(roots[0], roots[1], verbose=False)
    assert all(r.md5_equal is None for r in result.rows)


def test_xor_in_tensor_task_saves_files_and_checksums(dump_root):
    cfg = build_config(task="tensor", summary_mode="xor")
    assert cfg.summary_mode == "xor"
    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="L1", step=[0], summary_mode="xor")
    a = torch.randn(4, 5)
    dbg.start()
    torch.abs(a)
    dbg.stop()
    dbg.close()
    rank = os.path.join(dump_root, "step0", "rank")
    summary = load_dump(rank)["data"]["Torch.abs.0.forward"]["output"][0]
    saved = np.load(os.path.join(rank, "dump_tensor_data", summary["data_name"]))
    assert summary["md5"] == f"0x{python_xor(saved.tobytes()):016x}"
