"""The least Python a statistics dump can cost: a measuring stick for tsprobe's own work.

``MinimalRecorder`` writes what a statistics (or md5) dump holds, per step: at L1 a forward
record for every call of tsprobe's API list (the statistics of each tensor argument before the
call and of each output after it), a backward record per call whose output needs a gradient
(the gradients a hook on the output's node sees); at L0 a forward record per module call (its
inputs, outputs and own parameters), a backward record from a hook on its output's node and a
``parameters_grad`` record per module with parameters; mix both; the stack id of each
forward record, and dump.json / stack.json / construct.json in ``step{N}/rank/``. It uses
tsprobe's own C parts (the statistics kernel, the CRC-32, the raw frame walker) and msgspec, and
reuses statistics and summaries as tsprobe does, so what it costs beyond the kernels' floor
is the Python a recorder of this output cannot avoid: one wrapper per call, the torch attribute
reads per tensor, one dict per summary and record, one JSON encoding per record, one autograd
hook per grad-requiring call, and the step's files.

It is not a tool: no scope, list, ranks or steps selection, no module or caller filter, no
in-place or aliasing care (an in-place call's inputs are simply summarised before it runs), no
crash journal, no non-finite fallback beyond torch's own statistics, no gradients of inputs
apart from what one hook on the output's node sees (tsprobe sums each input's contributions
exactly), no DTensor, compile or distributed care. Everything it leaves out only makes it
cheaper, so its cost is a lower bound for tsprobe's. ``benchmarks/overhead.py --tools
tsprobe,minimal`` runs it on the same GPT-2 step.
"""
from __future__ import annotations

import ctypes
import json
import os
import traceback
import weakref
from typing import Any, Dict, List, Optional

import msgspec
import torch

from ts_core import native
from ts_core.backends.torch.api_hooks import PREFIXES, _NAMESPACES, load_api_list
from ts_core.backends.torch.tensors import _NATIVE_CODES as _CODES

_SCALARS = (int, float, bool, str, type(None))


class MinimalRecorder:
    """``start(model)`` / ``stop()`` / ``step()``, as PrecisionDebugger; `level` L0, L1 or mix."""

    def __init__(self, dump_path: str, md5: bool = False, level: str = "L1"):
        self.dump_path = dump_path
        self.md5 = md5
        self.level = level
        self.hooked: set = set()                  # ids of the models whose modules are hooked
        self.step_no = 0
        self.active = False
        self.depth = 0
        self.row = native.Stats().row
        self.walk = native.frame_walker()
        self.encode = msgspec.json.Encoder().encode
        self.saved: List[tuple] = []
        self.handles: List[Any] = []
        if level != "L0":
            self._patch()
        self._reset()

    def _reset(self) -> None:
        self.counts: Dict[str, int] = {}
        self.data: Dict[str, bytes] = {}
        self.stack_of: Dict[bytes, int] = {}      # raw stack -> id
        self.stacks: Dict[int, list] = {}         # id -> [keys, frames]
        self.recent: Dict[Any, tuple] = {}        # (address, numel, dtype) or id -> (owner, version, row, crc)
        self.shared: Dict[int, tuple] = {}        # id(tensor) -> (owner, version, shape, summary): the last 8
        self.open: List[tuple] = []               # modules running: (keys, input summaries)
        self.param_grads: Dict[str, dict] = {}    # parameters_grad key -> {name: summary}

    # -- patching ---------------------------------------------------------------------------
    def _patch(self) -> None:
        for section, names in load_api_list().items():
            owner = torch.Tensor if section == "tensor" else __import__(_NAMESPACES[section], fromlist=["_"])
            for name in names:
                orig = getattr(owner, name, None)
                if callable(orig):
                    self.saved.append((owner, name, orig))
                    setattr(owner, name, self._wrap(orig, f"{PREFIXES[section]}.{name}"))

    def restore(self) -> None:
        for owner, name, orig in reversed(self.saved):
            setattr(owner, name, orig)
        self.saved.clear()
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _hook_modules(self, model: Any) -> None:
        for path, mod in model.named_modules():
            if not path:
                continue
            prefix = f"Module.{path}.{type(mod).__name__}"
            self.handles.append(mod.register_forward_pre_hook(self._module_pre(prefix), with_kwargs=True))
            self.handles.append(mod.register_forward_hook(self._module_post(mod)))
            for name, p in mod.named_parameters(recurse=False):
                self.handles.append(p.register_post_accumulate_grad_hook(
                    self._param_grad(f"{prefix}.parameters_grad.0", name)))

    def _module_pre(self, prefix: str) -> Any:
        def pre(module, args, kwargs):
            if self.active:
                n = self.counts.get(prefix, 0)
                self.counts[prefix] = n + 1
                summary = self._summary
                self.open.append((f"{prefix}.forward.{n}", f"{prefix}.backward.{n}",
                                  [summary(a) for a in args], {k: summary(v) for k, v in kwargs.items()}))
        return pre

    def _module_post(self, mod: Any) -> Any:
        def post(module, args, out):
            if self.active and self.open:
                key, bkey, inputs, kw = self.open.pop()
                outs = out if isinstance(out, (list, tuple)) else (out,)
                summary = self._summary
                rec = {"input_args": inputs, "input_kwargs": kw, "output": [summary(o) for o in outs]}
                params = mod._parameters
                if params:
                    rec["parameters"] = {k: summary(p) for k, p in params.items() if p is not None}
                self.data[key] = self.encode(rec)
                self._stack(key)
                self._hook_backward(outs, bkey)
        return post

    def _param_grad(self, key: str, name: str) -> Any:
        def hook(p):
            if self.active:
                self.param_grads.setdefault(key, {})[name] = self._summary(p.grad)
        return hook

    def _wrap(self, orig: Any, base: str) -> Any:
        rec = self

        def wrapper(*args, **kwargs):
            if rec.depth or not rec.active:
                return orig(*args, **kwargs)
            rec.depth += 1
            try:
                return rec._call(orig, base, args, kwargs)
            finally:
                rec.depth -= 1
        return wrapper

    # -- one call -----------------------------------------------------------------------------
    def _call(self, orig: Any, base: str, args: tuple, kwargs: dict) -> Any:
        n = self.counts.get(base, 0)
        self.counts[base] = n + 1
        key = f"{base}.{n}"
        summary = self._summary
        rec = {"input_args": [summary(a) for a in args],
               "input_kwargs": {k: summary(v) for k, v in kwargs.items()}}
        out = orig(*args, **kwargs)
        outs = out if isinstance(out, (list, tuple)) else (out,)
        rec["output"] = [summary(o) for o in outs]
        self.data[key + ".forward"] = self.encode(rec)
        self._stack(key + ".forward")
        self._hook_backward(outs, key + ".backward")
        return out

    def _hook_backward(self, outs: tuple, key: str) -> None:
        for o in outs:
            if isinstance(o, torch.Tensor) and o.grad_fn is not None:
                o.grad_fn.register_hook(self._backward_hook(key))
                return

    def _backward_hook(self, key: str) -> Any:
        def hook(grad_inputs, grad_outputs):
            self.depth += 1
            try:
                self.data[key] = self.encode({"input": [self._summary(g) for g in grad_outputs],
                                              "output": [self._summary(g) for g in grad_inputs]})
            finally:
                self.depth -= 1
        return hook

    def _summary(self, v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            if isinstance(v, _SCALARS):
                return {"type": type(v).__name__, "value": v}
            if isinstance(v, (list, tuple)):
                return [self._summary(x) for x in v]
            return {"type": type(v).__name__}
        version = v._version
        kept = self.shared.get(id(v))          # the same tensor unchanged since its summary
        if kept is not None and kept[0]() is v and kept[1] == version and kept[2] == v.shape and \
                kept[3]["requires_grad"] is v.requires_grad:
            return kept[3]
        address, n = v.data_ptr(), v.numel()
        out = {"type": "torch.Tensor", "dtype": str(v.dtype), "shape": list(v.shape),
               "requires_grad": v.requires_grad}
        contiguous = v.is_contiguous()
        key = (address, n, v.dtype) if contiguous else id(v)
        hit = self.recent.get(key)          # the same bytes unchanged (this tensor, or a view of them)
        owner = hit[0]() if hit is not None and hit[1] == version else None
        if owner is not None and owner.data_ptr() == address and (owner is v or owner._version == version):
            row, crc = hit[2], hit[3]
        else:
            t = v if contiguous else v.contiguous()
            code = _CODES.get(v.dtype)
            row = self.row(t.data_ptr(), n, code) if code is not None and n and v.is_cpu else None
            if row is None and n:
                f = t.detach().double()
                row = (f.max().item(), f.min().item(), f.mean().item(), f.norm().item())
            crc = None
            if self.md5 and n and v.is_cpu:
                crc = native.crc32_hex((ctypes.c_ubyte * (n * t.element_size())).from_address(t.data_ptr()))
            if address:
                self.recent[key] = (weakref.ref(v), version, row, crc)
        if row is not None:
            out["Max"], out["Min"], out["Mean"], out["Norm"] = row
        if crc is not None:
            out["md5"] = crc
        # a few dicts to hand out again, not the step's: dicts alive for long are promoted
        # towards the interpreter's full collections (as tsprobe's SHARED_SUMMARIES)
        self.shared[id(v)] = (weakref.ref(v), version, v.shape, out)
        if len(self.shared) > 8:
            del self.shared[next(iter(self.shared))]
        return out

    def _stack(self, key: str) -> None:
        raw = self.walk()
        sid = self.stack_of.get(raw)
        if sid is None:
            sid = self.stack_of[raw] = len(self.stack_of)
            frames = [f"File {f.filename}, line {f.lineno}, in {f.name}, \n {f.line}"
                      for f in traceback.extract_stack()[-30:-3]]
            self.stacks[sid] = [[], frames]
        self.stacks[sid][0].append(key)

    # -- steps ----------------------------------------------------------------------------------
    def start(self, model: Optional[Any] = None) -> None:
        if self.level != "L1" and model is not None and id(model) not in self.hooked:
            self.hooked.add(id(model))
            self._hook_modules(model)
        self.active = True

    def stop(self) -> None:
        self.active = False
        folder = os.path.join(self.dump_path, f"step{self.step_no}", "rank")
        os.makedirs(folder, exist_ok=True)
        for key, grads in self.param_grads.items():
            self.data[key] = self.encode(grads)
        data = b",".join(b'"%s":%s' % (k.encode(), v) for k, v in self.data.items())
        _write(os.path.join(folder, "dump.json"),
               b'{"task":"statistics","level":"%s","dump_data_dir":null,"data":{%s}}' % (self.level.encode(), data))
        _write(os.path.join(folder, "stack.json"),
               json.dumps({str(i): v for i, v in self.stacks.items()}).encode())
        _write(os.path.join(folder, "construct.json"), json.dumps({k: None for k in self.data}).encode())

    def step(self) -> None:
        self.step_no += 1
        self._reset()


def _write(path: str, data: bytes) -> None:
    """Written whole, then renamed into place (a reader never sees half a file)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _interleaved(level: str, summary: str, rounds: int) -> str:
    """tsprobe, this recorder and no recorder on one GPT-2 4x256 model, their steps interleaved
    in this process: the three see the same machine state, which separate processes do not (the
    no-tool step moves 5-10% from one process to the next here). Both recorders' wrappers stay
    installed throughout: an inactive one costs a pass-through per call in every column."""
    import gc
    import statistics
    import tempfile
    import time

    from overhead import gpt2_workload
    from ts_core import PrecisionDebugger

    model, opt, data = gpt2_workload()
    os.environ["TSPROBE_QUIET"] = "1"
    folder = tempfile.mkdtemp(prefix="tsminimal_")
    tsprobe = PrecisionDebugger(dump_path=os.path.join(folder, "tsprobe"), level=level, step=[], task="statistics",
                                summary_mode=summary)

    def step(recorder: Any) -> float:
        t0 = time.process_time()
        if recorder is not None:
            recorder.start(model)
        model(input_ids=data, labels=data).loss.backward()
        opt.step()
        opt.zero_grad()
        if recorder is not None:
            recorder.stop()
            recorder.step()
        return (time.process_time() - t0) * 1e3

    step(tsprobe)                   # tsprobe's wrappers first, this recorder's around them
    recorders = {"no recorder": None, "tsprobe": tsprobe,
                 "minimal": MinimalRecorder(os.path.join(folder, "minimal"), md5=summary == "md5", level=level)}
    for r in recorders.values():
        step(r)
    gc.collect()
    times: Dict[str, List[float]] = {k: [] for k in recorders}
    for _ in range(rounds):
        for k, r in recorders.items():
            times[k].append(step(r))
    recorders["minimal"].restore()      # neither recorder stays installed for the next mode
    tsprobe.close()
    import shutil
    shutil.rmtree(folder, ignore_errors=True)
    base = statistics.median(times["no recorder"])
    cells = [f"{statistics.median(times[k]) / base:.3f}x (+{statistics.median(times[k]) - base:.1f} ms)"
             for k in ("tsprobe", "minimal")]
    return f"| {summary} {level} | {base:.1f} ms | " + " | ".join(cells) + " |"


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="tsprobe against the minimal recorder, steps interleaved in one "
                                            "process (median step CPU time against no recorder)")
    p.add_argument("--modes", default="statistics L0,statistics L1,statistics mix,md5 L1")
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    print("| mode | no recorder | tsprobe | minimal recorder |\n|---|---|---|---|")
    for mode in args.modes.split(","):
        summary, level = mode.split()
        print(_interleaved(level, summary, args.rounds), flush=True)
