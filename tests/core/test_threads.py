"""Calls made on other threads while a step is collected are recorded once, in that step."""
import os
import threading

import torch

from ts_core import PrecisionDebugger

from ..conftest import load_dump


def test_calls_on_a_worker_thread_are_recorded_once_in_the_current_step(dump_root):
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0, 1])
    for step in range(2):
        dbg.start()
        done = threading.Event()

        def worker():                    # e.g. a data-loading or pinning thread
            for _ in range(20):
                torch.sigmoid(torch.ones(3) * step)
            done.set()

        t = threading.Thread(target=worker)
        t.start()
        for _ in range(20):
            torch.tanh(torch.ones(3))
        t.join()
        assert done.is_set()
        dbg.stop()
        dbg.step()
    dbg.close()
    for step in range(2):
        data = load_dump(os.path.join(dump_root, f"step{step}", "rank"))["data"]
        sig = sorted(k for k in data if k.startswith("Torch.sigmoid"))
        assert sig == sorted(f"Torch.sigmoid.{i}.forward" for i in range(20))
        assert len([k for k in data if k.startswith("Torch.tanh")]) == 20
        # the worker's values belong to this step: sigmoid(1 * step)
        assert data["Torch.sigmoid.0.forward"]["input_args"][0]["Max"] == float(step)


def test_backward_on_the_autograd_engine_is_recorded_once(dump_root):
    w = torch.randn(4, 4, requires_grad=True)
    dbg = PrecisionDebugger(dump_path=dump_root, level="L1", step=[0])
    dbg.start()
    loss = torch.tanh(torch.ones(2, 4) @ w).sum()
    dbg.stop()                       # stop before backward (msprobe's documented pattern)
    loss.backward()
    dbg.step()
    dbg.close()
    data = load_dump(os.path.join(dump_root, "step0", "rank"))["data"]
    assert [k for k in data if k.endswith("backward")].count("Torch.tanh.0.backward") == 1
    assert "Tensor.__matmul__.0.backward" in data and "Tensor.sum.0.backward" in data
