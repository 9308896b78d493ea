"""Statistics in dump.json equal numpy's on the saved .npy files; md5 is the CRC-32 of the data;
summaries carry MindSpore's own dtype names."""
import os
import zlib

import numpy as np
import pytest

from ts_core import PrecisionDebugger

from ..conftest import load_dump, require, tensor_summaries
from .lazy import helpers, mint, ms, ops

pytestmark = require("mindspore")


def _summaries(obj):
    return tensor_summaries(obj, "mindspore.Tensor")


def _run_mixed_dtypes():
    a = helpers.tensor((4, 5), seed=1)
    ops.relu(a)                                    # float32
    mint.add(a.astype(ms.float16), 1.5)            # float16 (+ a Python float)
    ops.abs(a.astype(ms.float64))                  # float64
    ops.neg(ms.Tensor(np.arange(-6, 6, dtype=np.int32).reshape(3, 4)))   # int32
    ops.logical_not(a > 0)                         # bool
    ops.square(a.astype(ms.bfloat16).astype(ms.float32))    # bfloat16 input of astype
    return a


def test_statistics_equal_numpy_on_saved_npy(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, task="tensor", level="L1", step=[0], framework="mindspore")
    dbg.start()
    _run_mixed_dtypes()
    dbg.stop()
    dbg.close()
    rank = helpers.rank_dir(dump_root)
    dump = load_dump(rank)
    assert dump["framework"] == "mindspore" and dump["task"] == "tensor"
    data = dump["data"]
    for key in ("Functional.relu.0.forward", "Mint.add.0.forward", "Functional.abs.0.forward",
                "Functional.neg.0.forward", "Functional.logical_not.0.forward", "Tensor.astype.0.forward"):
        assert key in data, sorted(data)
    seen = set()
    for s in _summaries(data):
        arr = helpers.npy(rank, s)
        seen.add(s["dtype"])
        assert s["shape"] == list(arr.shape)
        f = arr.astype(np.float64)
        assert s["Max"] == pytest.approx(f.max(), rel=0, abs=0)
        assert s["Min"] == pytest.approx(f.min(), rel=0, abs=0)
        assert s["Mean"] == pytest.approx(f.mean(), rel=1e-6, abs=1e-7)
        assert s["Norm"] == pytest.approx(np.linalg.norm(f.ravel()), rel=1e-6)
        if s["dtype"] in ("Int32", "Bool"):
            assert type(s["Max"]) is (int if s["dtype"] == "Int32" else bool)
    assert {"Float32", "Float16", "Float64", "Int32", "Bool", "BFloat16"} <= seen
    # non-tensor arguments keep their value
    assert data["Mint.add.0.forward"]["input_args"][1] == {"type": "float", "value": 1.5}


def test_md5_is_crc32_of_the_data_and_empty_tensors_have_null_stats(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0], summary_mode="md5",
                           framework="mindspore")
    dbg.start()
    a = helpers.tensor((3, 7), seed=2)
    ops.relu(a)
    ops.relu(ms.Tensor(np.zeros((0, 3), np.float32)))
    dbg.stop()
    dbg.close()
    data = load_dump(helpers.rank_dir(dump_root))["data"]
    s = data["Functional.relu.0.forward"]["input_args"][0]
    assert s["md5"] == f"{zlib.crc32(a.asnumpy().tobytes()):08x}"
    out = data["Functional.relu.0.forward"]["output"][0]
    assert out["md5"] == f"{zlib.crc32(np.maximum(a.asnumpy(), 0).tobytes()):08x}"
    empty = data["Functional.relu.1.forward"]["input_args"][0]
    assert empty["shape"] == [0, 3] and empty["Max"] is None and empty["Norm"] is None
    assert not os.path.exists(os.path.join(helpers.rank_dir(dump_root), "dump_tensor_data"))


def test_stats_of_a_summary_and_dtype_arguments(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0], framework="mindspore")
    dbg.start()
    a = helpers.tensor((2, 3), seed=3)
    ops.cast(a, ms.float16)
    ops.sum(ms.Tensor(np.float32(4.0)))      # 0-d tensor
    dbg.stop()
    dbg.close()
    data = load_dump(helpers.rank_dir(dump_root))["data"]
    cast = data["Functional.cast.0.forward"]
    assert cast["input_args"][1] == {"type": "mindspore.dtype", "value": "Float16"}
    assert cast["output"][0]["dtype"] == "Float16"
    zero_d = data["Functional.sum.0.forward"]["input_args"][0]
    assert zero_d["shape"] == [] and zero_d["Max"] == zero_d["Min"] == zero_d["Norm"] == 4.0
