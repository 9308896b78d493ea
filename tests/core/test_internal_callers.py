"""API calls made directly by framework machinery (the backend's ``internal_dirs``: for torch,
``torch/distributed``) are run but not recorded, and do not use up a call number; the same API
called by the user's code, also from a function the machinery calls back, is recorded."""
from __future__ import annotations

import importlib.util
import os
import sys

import torch

from ts_core import PrecisionDebugger
from ts_core.backends.torch import TorchBackend

from ..conftest import load_dump

MACHINERY = '''
import torch

def unpack(x):                      # what FSDP2's hooks do to its buffers
    return torch.relu(x.view(-1)).view_as(x)

def call_back(fn, x):               # machinery calling the user's code back
    return fn(x)
'''


def test_calls_of_framework_machinery_are_run_not_recorded(tmp_path, monkeypatch):
    folder = tmp_path / "framework"
    folder.mkdir()
    (folder / "machinery.py").write_text(MACHINERY)
    spec = importlib.util.spec_from_file_location("machinery", folder / "machinery.py")
    machinery = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(machinery)
    monkeypatch.setattr(TorchBackend, "internal_dirs", TorchBackend.internal_dirs + (str(folder),))

    x = torch.randn(3, 4)
    with PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics", level="L1", step=[0]) as dbg:
        dbg.start()
        unpacked = machinery.unpack(x)                       # machinery: relu, view, view_as
        mine = torch.relu(x)                                 # the user's
        called_back = machinery.call_back(lambda t: torch.sigmoid(t), x)    # the user's, via machinery
        dbg.stop()
        dbg.step()
    data = load_dump(os.path.join(tmp_path, "dump", "step0", "rank"))["data"]
    assert sorted(data) == ["Torch.relu.0.forward", "Torch.sigmoid.0.forward"]
    assert data["Torch.relu.0.forward"]["output"][0]["Max"] == mine.max().item()
    assert torch.equal(unpacked, torch.relu(x)) and torch.equal(called_back, torch.sigmoid(x))
    sys.modules.pop("machinery", None)
