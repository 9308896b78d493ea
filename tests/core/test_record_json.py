"""Record encoding (``dumpfmt.record_json``): the fast encoder must write exactly the values the
stdlib writes, and NaN/Inf must stay NaN/Infinity in dump.json (msgspec alone would write null)."""
import json
import math
import os
import random
import struct

import pytest
import torch

from ts_core import PrecisionDebugger
from ts_core.dumpfmt import jsonio, record_json

from ..conftest import load_dump


def _doubles(n, seed=0):
    rnd = random.Random(seed)
    out = [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 1e-05, 1e16, 123456789.0]
    out += [struct.unpack("<d", struct.pack("<Q", rnd.getrandbits(64)))[0] for _ in range(n)]
    out += [float(struct.unpack("<f", struct.pack("<I", rnd.getrandbits(32)))[0]) for _ in range(n)]  # float32 values
    return [x for x in out if math.isfinite(x)]


def test_fast_encoding_round_trips_every_finite_double_like_the_stdlib():
    values = _doubles(5000)
    record = {"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": v,
                              "Min": -v, "Mean": v / 3, "Norm": abs(v), "requires_grad": i % 2 == 0}
                             for i, v in enumerate(values)],
              "input_kwargs": {"dim": {"type": "int", "value": -(2**63)}, "keep": {"type": "bool", "value": True},
                               "mask": None, "name": {"type": "str", "value": "é\"\\\n"}},
              "output": [{"type": "int", "value": 2**63 - 1}, (1, 2)]}
    fast = json.loads(record_json(record))
    std = json.loads(json.dumps(record))
    assert fast == std
    got = [s["Max"] for s in fast["input_args"]]
    assert all(type(g) is float and g == v and math.copysign(1, g) == math.copysign(1, v)
               for g, v in zip(got, values))


def test_what_msgspec_refuses_behaves_as_the_stdlib_does():
    assert json.loads(record_json({1: 2, "a": [1.5]})) == {"1": 2, "a": [1.5]}
    assert json.loads(record_json({"big": 2**70})) == {"big": 2**70}
    with pytest.raises(TypeError):
        record_json({"x": object()})


def test_without_msgspec_the_stdlib_writes_the_same_values(monkeypatch):
    record = {"output": [{"Max": v} for v in _doubles(200, seed=1)]}
    fast = json.loads(record_json(record))
    monkeypatch.setattr(jsonio, "_fast_encode", None)
    assert json.loads(record_json(record)) == fast


def test_nan_and_inf_reach_dump_json_as_nan_and_infinity(tmp_path):
    """A NaN tensor, an -inf scalar argument, then finite calls in the same step and the next one."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1", step=[0, 1])
    x = torch.tensor([1.0, float("nan"), 2.0])
    mask = torch.tensor([True, False, True])
    y = torch.arange(6, dtype=torch.float32)
    for step in (0, 1):
        dbg.start()
        if step == 0:
            torch.abs(x)
            torch.masked_fill(y[:3], mask, float("-inf"))      # -> [-inf, 1, -inf]
        torch.relu(y)
        dbg.stop()
        dbg.step()
    dbg.close()
    first = load_dump(os.path.join(str(tmp_path), "step0", "rank"))["data"]
    s = first["Torch.abs.0.forward"]["input_args"][0]
    assert math.isnan(s["Max"]) and math.isnan(s["Mean"])
    fill = first["Torch.masked_fill.0.forward"]
    assert fill["input_args"][2] == {"type": "float", "value": float("-inf")}
    out = fill["output"][0]
    assert out["Min"] == float("-inf") and out["Max"] == 1.0 and out["Mean"] == float("-inf")
    relu = first["Torch.relu.0.forward"]["output"][0]
    assert (relu["Max"], relu["Min"], relu["Mean"]) == (5.0, 0.0, 2.5)
    assert relu["Norm"] == pytest.approx(math.sqrt(sum(i * i for i in range(6))), rel=1e-12)
    with open(os.path.join(str(tmp_path), "step0", "rank", "dump.json")) as f:
        text = f.read()
    assert "NaN" in text and "-Infinity" in text and "null, \"Mean\"" not in text
    second = load_dump(os.path.join(str(tmp_path), "step1", "rank"))["data"]
    assert second["Torch.relu.0.forward"]["output"][0]["Max"] == 5.0
