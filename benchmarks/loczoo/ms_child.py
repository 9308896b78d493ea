"""Dump the MindSpore side of the torch<->MindSpore cases, in a child process of its own.

MindSpore is never imported into the process that runs the torch cases (it slows torch down
and, with both loaded, framework detection gets ambiguous); this child imports MindSpore and
numpy only, never torch: weights and inputs arrive as .npz files written by the parent.

    python -m loczoo.ms_child JOBS.json

JOBS.json: {"jobs": [{"id", "family", "variant", "level", "task", "dump_path", "weights",
"inputs", "classes", "edit": [param, how] | null}, ...]}. For each job it prints one line
``DONE {"id", "rank_dir", "signature" (npz path)}`` or ``FAILED {"id", "error"}``.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from functools import lru_cache
from typing import Dict

import numpy as np
import yaml

from .arrays import apply_edit, mse_target
from .spec import WeightEdit


@lru_cache(maxsize=1)
def _mapping() -> Dict[str, Dict[str, str]]:
    import ts_core.backends as backends

    path = os.path.join(os.path.dirname(backends.__file__), "mindspore", "torch_mapping.yaml")
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f).get("parameters", {}) or {}


def copy_weights(net, state: Dict[str, np.ndarray], classes: Dict[str, str]) -> Dict[int, str]:
    """Torch state_dict arrays -> the port's Parameters (renamed per torch class through
    torch_mapping.yaml: LayerNorm weight -> gamma, ...). Returns {id(Parameter): torch name}."""
    from mindspore import Tensor

    rename = _mapping()
    cells = dict(net.cells_and_names())
    names: Dict[int, str] = {}
    for key, array in state.items():
        path, attr = key.rsplit(".", 1) if "." in key else ("", key)
        if attr == "num_batches_tracked":
            continue
        if path not in cells:
            raise KeyError(f"the port has no cell {path!r} for torch parameter {key}")
        ms_attr = rename.get(classes.get(path, ""), {}).get(attr, attr)
        param = getattr(cells[path], ms_attr, None)
        if param is None:
            raise KeyError(f"the port's cell {path!r} has no parameter {ms_attr!r} (torch {key})")
        if tuple(param.shape) != tuple(array.shape):
            raise ValueError(f"{key}: torch shape {array.shape}, port shape {tuple(param.shape)}")
        param.set_data(Tensor(np.ascontiguousarray(array)))
        names[id(param)] = key
    return names


def run_job(job: dict) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    from ts_core import PrecisionDebugger

    from . import ms_zoo

    net = ms_zoo.make(job["family"], job["variant"])
    model = ms_zoo.Harness(net)
    with np.load(job["weights"]) as z:
        state = {k: z[k] for k in z.files}
    edit = WeightEdit(*job["edit"]) if job.get("edit") else None
    names = copy_weights(net, apply_edit(state, edit), job["classes"])
    sig = {f"param:{k}": np.asarray(v) for k, v in apply_edit(state, edit).items()}
    with np.load(job["inputs"]) as z:
        inputs = [Tensor(z[f"arr_{i}"]) for i in range(len(z.files))]
    params = model.trainable_params()

    def loss_fn(*xs):
        out = model(*xs)
        if job.get("loss") == "output":         # the model computes its loss itself
            return out, out
        diff = out - Tensor(mse_target(out.shape))
        return (diff * diff).mean(), out

    grad_fn = ms.value_and_grad(loss_fn, None, params, has_aux=True)
    dbg = PrecisionDebugger(dump_path=job["dump_path"], task=job["task"], level=job["level"], step=[0],
                            framework="mindspore")
    try:
        dbg.start(model)
        (loss, out), grads = grad_fn(*inputs)
        dbg.stop()
        dbg.step()
    finally:
        dbg.close()
    sig["loss:"] = np.array(loss.asnumpy())
    sig["out:"] = out.asnumpy()
    for p, g in zip(params, grads):
        if id(p) in names:
            sig[f"grad:{names[id(p)]}"] = g.asnumpy()
    sig_path = os.path.join(job["dump_path"], "signature.npz")
    np.savez(sig_path, **sig)
    return {"id": job["id"], "rank_dir": os.path.join(job["dump_path"], "step0", "rank"), "signature": sig_path}


def main(spec_path: str) -> int:
    import mindspore as ms
    from mindspore import Tensor

    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:                      # numpy 2: the first Tensor-float op raises SystemError once (ENVIRONMENT.md)
        (Tensor(np.ones(1, np.float32)) * 1.5).asnumpy()
    except SystemError:
        pass
    with open(spec_path, encoding="utf-8") as f:
        jobs = json.load(f)["jobs"]
    for job in jobs:
        try:
            print("DONE " + json.dumps(run_job(job)), flush=True)
        except Exception as e:  # one broken port must not hide the others' results
            print("FAILED " + json.dumps({"id": job["id"], "error": f"{type(e).__name__}: {e}",
                                          "trace": traceback.format_exc()[-2000:]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
