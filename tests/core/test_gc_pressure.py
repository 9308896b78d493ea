"""What the collector keeps alive while a step runs.

Record dicts held until a periodic flush outlive Python's young-generation collections and are
promoted towards a full collection of the training process's whole heap (torch and transformers
hold ~450k objects: ~0.5 s each). A record whose statistics are already on the host is encoded
at once, so nothing of it but its JSON text stays in memory (and the few summaries the adapter
keeps to hand out again, ``SHARED_SUMMARIES``)."""
import gc

import torch

from ts_core import PrecisionDebugger
from ts_core.backends.torch.tensors import SHARED_SUMMARIES


def _live_summaries() -> list:
    return [o for o in gc.get_objects() if type(o) is dict and "Max" in o and "type" in o]


def _started(tmp_path, level: str):
    """(model, input, debugger) with collection started. First collects what earlier tests left
    in reference cycles (a closed debugger's object graph may hold its last summaries until the
    cyclic collector runs): only what this test's collector keeps alive may count."""
    gc.collect()
    model, x = _model(), torch.randn(4, 16)
    dbg = PrecisionDebugger(task="statistics", dump_path=str(tmp_path), level=level)
    dbg.start(model)
    return model, x, dbg


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
                                 for _ in range(8)])


def test_records_of_host_statistics_are_not_held_as_dicts(tmp_path):
    model, x, dbg = _started(tmp_path, "mix")
    try:
        model(x).sum().backward()
        held = _live_summaries()
        # what stays is the parameters' gradients, written as parameters_grad at the step end,
        # and at most the last few summaries made (the adapter may hand them out again)
        grads = [s for s in held if not s["requires_grad"] and tuple(s["shape"]) in {(16, 16), (16,)}]
        assert len(held) - len(grads) <= SHARED_SUMMARIES, held[:3]
        assert len(held) <= 2 * 3 * 8 + SHARED_SUMMARIES
    finally:
        dbg.stop()
        dbg.step()
    rows = [r for r in (tmp_path / "step0" / "rank").glob("dump.json")]
    assert rows, "the step's dump was written"


def test_forward_records_leave_no_summary_dict_behind(tmp_path):
    model, x, dbg = _started(tmp_path, "L1")
    try:
        with torch.no_grad():
            model(x)
        assert len(_live_summaries()) <= SHARED_SUMMARIES      # of ~50 records' ~150 summaries
    finally:
        dbg.stop()
        dbg.step()
