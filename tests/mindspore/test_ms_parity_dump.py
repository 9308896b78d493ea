"""msprobe's dump options on MindSpore PyNative: task structure, summary_mode xor, async_dump,
tensor_list, module_dump, the dump_enable hot switch and the diff-only dump (msprobe offers the
last four, and xor, for PyTorch only)."""
import json
import os

import numpy as np
import pytest

from ts_core import PrecisionDebugger, module_dump, module_dump_end

from ..conftest import load_dump, load_json, require, tensor_summaries
from .lazy import helpers, ms, ops

pytestmark = require("mindspore")
MASK = (1 << 64) - 1


def _train(dbg, net, x, steps=1, model_arg=True):
    for _ in range(steps):
        dbg.start(net if model_arg else None)
        ms.value_and_grad(lambda v: net(v).sum(), None, net.trainable_params())(x)
        dbg.stop()
        dbg.step()


def _net_and_x():
    return helpers.seeded(helpers.Outer), helpers.tensor((3, 4), seed=0)


def _summaries(obj):
    return tensor_summaries(obj, "mindspore.Tensor")


def _python_xor(raw: bytes) -> str:
    raw = raw + b"\0" * (-len(raw) % 8)
    acc = 0
    for i in range(0, len(raw), 8):
        acc ^= int.from_bytes(raw[i:i + 8], "little")
    return f"0x{acc:016x}"


def test_structure_records_hierarchy_and_shapes_without_values(tmp_path):
    roots = {}
    for task in ("structure", "statistics"):
        net, x = _net_and_x()
        dbg = PrecisionDebugger(dump_path=str(tmp_path / task), task=task, level="mix", step=[0],
                                framework="mindspore")
        _train(dbg, net, x)
        dbg.close()
        roots[task] = helpers.rank_dir(str(tmp_path / task))
    s, f = load_dump(roots["structure"]), load_dump(roots["statistics"])
    assert s["task"] == "structure" and list(s["data"]) == list(f["data"])
    assert load_json(roots["structure"], "construct.json") == load_json(roots["statistics"], "construct.json")
    pairs = list(zip(_summaries(s["data"]), _summaries(f["data"])))
    assert len(pairs) > 10
    for a, b in pairs:
        assert a == {k: b[k] for k in ("type", "dtype", "shape", "requires_grad")}


def test_xor_checksums_of_mindspore_tensors(dump_root):
    a = helpers.tensor((3, 5), seed=1)
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0], summary_mode="xor", framework="mindspore")
    dbg.start()
    ops.relu(a)
    ops.neg(ms.Tensor(np.arange(-6, 5, dtype=np.int32)))
    b16 = a.astype(ms.bfloat16)
    b16.astype(ms.float32)                        # a bfloat16 input (no CPU abs kernel for it)
    ops.abs(ms.Tensor(np.float32(2.5)))
    dbg.stop()
    dbg.close()
    data = load_dump(helpers.rank_dir(dump_root))["data"]
    relu = data["Functional.relu.0.forward"]
    assert relu["input_args"][0]["md5"] == _python_xor(a.asnumpy().tobytes())
    assert relu["output"][0]["md5"] == _python_xor(np.maximum(a.asnumpy(), 0).tobytes())
    assert "Max" not in relu["output"][0]
    neg = data["Functional.neg.0.forward"]["output"][0]
    assert neg["md5"] == _python_xor((-np.arange(-6, 5, dtype=np.int32)).tobytes())
    bf16 = data["Tensor.astype.1.forward"]["input_args"][0]
    u = a.asnumpy().view(np.uint32).astype(np.uint64)            # float32 -> bfloat16, round to nearest even
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    assert bf16["dtype"] == "BFloat16" and bf16["md5"] == _python_xor(bits.tobytes())
    assert data["Functional.abs.0.forward"]["output"][0]["md5"] == 2.5        # a 0-d tensor: its value


def test_async_dump_gives_the_same_dump(tmp_path):
    dumps = []
    for name, extra in (("sync", {}), ("async", {"async_dump": True})):
        net, x = _net_and_x()
        dbg = PrecisionDebugger(dump_path=str(tmp_path / name), task="tensor", level="mix", step=[0],
                                framework="mindspore", summary_mode="md5", **extra)
        _train(dbg, net, x)
        dbg.close()
        rank = helpers.rank_dir(str(tmp_path / name))
        dump = load_dump(rank)
        dump.pop("dump_data_dir")
        files = sorted(os.listdir(os.path.join(rank, "dump_tensor_data")))
        dumps.append((dump, {f: np.load(os.path.join(rank, "dump_tensor_data", f)) for f in files}))
    (da, fa), (db, fb) = dumps
    assert da == db and sorted(fa) == sorted(fb) and len(fa) > 10
    for f in fa:
        np.testing.assert_array_equal(fa[f], fb[f])


def test_tensor_list_saves_listed_cells_and_apis(dump_root):
    net, x = _net_and_x()
    dbg = PrecisionDebugger(dump_path=dump_root, level="mix", step=[0], framework="mindspore",
                            tensor_list=["head", "matmul"])
    _train(dbg, net, x)
    dbg.close()
    rank = helpers.rank_dir(dump_root)
    data = load_dump(rank)["data"]
    for key, rec in data.items():
        names = [s["data_name"] for s in _summaries(rec) if "data_name" in s]
        assert bool(names) == ("head" in key or "matmul" in key), key
        for n in names:
            assert os.path.isfile(os.path.join(rank, "dump_tensor_data", n))
    weight = data["Cell.head.Dense.forward.0"]["parameters"]["weight"]
    np.testing.assert_array_equal(np.load(os.path.join(rank, "dump_tensor_data", weight["data_name"])),
                                  net.head.weight.asnumpy())


def test_module_dump_records_one_cell_as_a_whole(dump_root):
    net, x = _net_and_x()
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0], framework="mindspore")
    dbg.start()
    module_dump(net.encoder, "Enc")
    h = net.encoder(x)
    module_dump_end()
    ops.relu(h)
    dbg.stop()
    dbg.close()
    data = load_dump(helpers.rank_dir(dump_root))["data"]
    assert list(data) == ["Cell.Enc.SequentialCell.forward.0", "Functional.relu.0.forward"]
    out = data["Cell.Enc.SequentialCell.forward.0"]["output"][0]
    assert out["Max"] == pytest.approx(float(h.asnumpy().max()))


def test_dump_enable_switches_on_between_steps(tmp_path):
    path, dump = str(tmp_path / "c.json"), str(tmp_path / "dump")

    def write(enable):
        st = os.stat(path) if os.path.exists(path) else None
        with open(path, "w") as f:
            json.dump({"task": "statistics", "dump_path": dump, "level": "L1", "framework": "mindspore",
                       "dump_enable": enable}, f)
        if st is not None:
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))

    write(False)
    net, x = _net_and_x()
    dbg = PrecisionDebugger(config_path=path)
    _train(dbg, net, x, steps=2)
    write(True)
    _train(dbg, net, x, steps=1)
    write(False)
    _train(dbg, net, x, steps=1)
    dbg.close()
    assert os.listdir(dump) == ["step2"]
    assert "Mint.matmul.0.forward" in load_dump(os.path.join(dump, "step2", "rank"))["data"]


def test_diff_dump_saves_the_op_that_changed(tmp_path):
    bench = str(tmp_path / "bench")
    roots = {}
    for name, scale, extra in (("bench", 1.0, dict(task="statistics", summary_mode="md5")),
                               ("new", 1.0 + 2 ** -20, dict(task="tensor", bench_path=bench))):
        net, x = _net_and_x()
        dbg = PrecisionDebugger(dump_path=str(tmp_path / name), level="L1", step=[0], framework="mindspore", **extra)
        dbg.start()
        h = ops.relu(x)
        h = h * scale
        ops.abs(h)
        dbg.stop()
        dbg.close()
        roots[name] = helpers.rank_dir(str(tmp_path / name))
    files = sorted(os.listdir(os.path.join(roots["new"], "dump_tensor_data")))
    assert files == ["Tensor.__mul__.0.forward.input.0.npy", "Tensor.__mul__.0.forward.output.0.npy"]
