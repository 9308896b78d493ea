"""Mode ``shadow`` of torch.compile (``TSPROBE_COMPILE=shadow``): module-level records of a
compiled model without touching the compiled program.

The compiled call itself runs as without tsprobe (module hooks are invisible to dynamo, as in
mode ``boundaries``). Two hooks on the root model (a client of its hook owner, model_hooks.py)
break the graph only at its edges (measured: the compiled graph and its numbers unchanged, bf16
included): they capture the compiled call's
real inputs and, after it, re-run the root's ``forward`` eagerly on them (an eager shadow: the
module hooks record it as in an eager run; it runs on copies of the buffers and a forked RNG
state, its inputs are detached so its graph is its own). When backward brings the gradients of the compiled
call's outputs, the shadow graph is run backward with them (``torch.autograd.grad`` towards the
parameters: nothing is accumulated into ``.grad``), which writes the modules' backward records.

What the records are: an eager computation on the compiled run's inputs and parameters, the
compiled run's output gradients; not the compiled kernels' own intermediate values. Costs one
more forward and backward of the model, and the shadow's activations until backward.
"""
from __future__ import annotations

from typing import Any, List, Optional

import torch

from ...model_hooks import ModelHook
from ..structure import leaves
from . import compiled


def _tensors(obj: Any) -> List[torch.Tensor]:
    return leaves(obj, lambda v: isinstance(v, torch.Tensor), [])


def _detached(obj: Any) -> Any:
    """`obj` with each tensor detached (a leaf that requires grad where it did)."""
    def one(t: torch.Tensor) -> torch.Tensor:
        d = t.detach()
        return d.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() else d
    return torch.utils._pytree.tree_map_only(torch.Tensor, one, obj)


class EagerShadow(ModelHook):
    """The root hooks of mode ``shadow`` on one model, a client of its hook owner
    (``model_hooks.py``: one owner per model); `gate.active` says when to record. At the model's
    edge (``compile_mode`` None): while dynamo traces, the owner's torch access puts a graph break
    there (or nothing, under fullgraph); an eager call of an uncompiled root does nothing here
    (its modules record themselves)."""

    compile_mode = None

    def __init__(self, model: torch.nn.Module, gate: Any):
        self.model = compiled.unwrap(model)
        self.root_is_compiled = model is not self.model   # hooks on the compiled wrapper: outside dynamo
        self.gate = gate
        self.inputs: Optional[tuple] = None

    def pre_forward(self, ctx: Any, module: Any, args: tuple, kwargs: dict) -> None:
        if self._compiled_call():
            self._pre(module, args, kwargs)
        return None

    def post_forward(self, ctx: Any, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if self._compiled_call():
            self._post(module, args, kwargs, output)
        return None

    def _compiled_call(self) -> bool:
        """Is this (eager) call of the root hooks that of a compiled call? ``torch.compile(model)``
        runs the root's hooks outside dynamo, inside its OptimizedModule's call;
        ``model.compile()`` compiles in place."""
        if self.root_is_compiled or getattr(self.model, "_compiled_call_impl", None) is not None:
            return True
        if not compiled.dynamo_loaded():
            return False
        from torch._dynamo import eval_frame

        in_optimized = getattr(eval_frame, "_is_in_optimized_module", None)
        return bool(in_optimized is not None and in_optimized())

    def _pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        self.inputs = (args, kwargs) if self.gate.active else None
        return None

    def _post(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        inputs, self.inputs = self.inputs, None
        if inputs is None or not self.gate.active:
            return None
        model = self.model
        grad = torch.is_grad_enabled()
        params = [p for p in model.parameters() if p.requires_grad] if grad else []
        s_args, s_kwargs = _detached(inputs)
        # The shadow works on copies of the buffers (BatchNorm's running statistics): the real
        # ones keep their values and their version counters (the compiled graph saved them).
        swapped = []
        for m in model.modules():
            for name, buf in m._buffers.items():
                if buf is not None:
                    swapped.append((m, name, buf))
                    m._buffers[name] = buf.detach().clone()
        try:
            # the shadow's random ops (dropout) draw from forked streams: the CPU's and, on a GPU,
            # those of the model's devices (devices=[] forks the CPU's alone: a CUDA dropout in the
            # shadow would move the training's next random numbers)
            cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
            with torch.random.fork_rng(devices=cuda):
                shadow = model.forward(*s_args, **s_kwargs)
        finally:
            for m, name, buf in swapped:
                m._buffers[name] = buf
        if not params:
            return None
        outs = [t for t in _tensors(output) if t.requires_grad]
        shadows = [t for t in _tensors(shadow) if t.requires_grad]
        if not outs or len(outs) != len(shadows):
            return None
        leaves_in = [t for t in _tensors((s_args, s_kwargs)) if t.requires_grad]

        def backward(grads: List[Optional[torch.Tensor]]) -> None:
            pairs = [(s, g) for s, g in zip(shadows, grads) if g is not None]
            if pairs:
                torch.autograd.grad([s for s, _ in pairs], params + leaves_in, [g for _, g in pairs],
                                    allow_unused=True)
            return None
        torch.autograd.graph.register_multi_grad_hook(outs, backward)
        return None
