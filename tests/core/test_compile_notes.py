"""A dump is never empty in silence (issue 37): a model compiled as a whole by torch.compile,
recorded in the default compile mode ``boundaries``, has nothing inside it recorded. The step end
says so in a warning naming the option that records it (``compile_mode: shadow``), dump.json
carries the same note, and compare repeats it. Real torch.compile with inductor (the "eager"
backend runs the graph's torch functions as Python calls, which the API wrappers then partly
record), compiled once per run.
"""
from __future__ import annotations

import os
import warnings

import pytest

torch = pytest.importorskip("torch")

from ts_core import PrecisionDebugger  # noqa: E402
from ts_core.compare import compare  # noqa: E402

from ..conftest import load_dump  # noqa: E402
from .test_wrapped_names import Net  # noqa: E402


def run(path, level: str, compiled: bool, mode: str = ""):
    """Two steps, step 0 and 1 dumped; returns the warnings and step 0's dump.json."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    if compiled:
        model = torch.compile(model)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    dbg = PrecisionDebugger(dump_path=str(path), level=level, step=[0, 1],
                            **({"compile_mode": mode} if mode else {}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            dbg.start(model)
            model(x).pow(2).mean().backward()
            dbg.stop()
            dbg.step()
        dbg.close()
    told = [str(w.message) for w in caught if "compile" in str(w.message)]
    return told, load_dump(os.path.join(str(path), "step0", "rank"))


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_model_compiled_as_a_whole_is_noted_in_the_warning_the_dump_and_compare(tmp_path, level):
    told, dump = run(tmp_path / "compiled", level, compiled=True)
    assert len(told) == 1 and "compile_mode 'shadow'" in told[0]        # once per debugger, not per step
    # no module inside; the region itself is recorded at its boundary (test_compile_region.py)
    assert [k for k in dump["data"] if k.startswith("Module.") and ".forward." in k] == ["Module.Net.forward.0"]
    assert len(dump["notes"]) == 1 and "compiled as a whole" in dump["notes"][0] and "Net" in dump["notes"][0]
    step1 = load_dump(os.path.join(str(tmp_path / "compiled"), "step1", "rank"))
    assert step1["notes"] == dump["notes"]                              # every step's dump says it
    run(tmp_path / "eager", level, compiled=False)
    r = compare(str(tmp_path / "eager"), str(tmp_path / "compiled"), verbose=False)
    pair = r.pairs[0]
    assert any(w.startswith("target dump: the model Net ran compiled as a whole") for w in pair.warnings)
    assert "a divergence may lie inside that region" in pair.note


def test_an_eager_model_and_shadow_mode_get_no_note(tmp_path):
    told, dump = run(tmp_path / "eager", "mix", compiled=False)
    assert not told and "notes" not in dump
    told, dump = run(tmp_path / "shadow", "mix", compiled=True, mode="shadow")
    assert not told and "notes" not in dump
    assert any(k.startswith("Module.blocks.0.fc.Linear.forward") for k in dump["data"])   # shadow records inside
