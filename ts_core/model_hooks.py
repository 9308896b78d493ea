"""Forward hooks an integration puts on the user's model (the step window of the HF Trainer
callback, token windows): registered here so that ``torch.compile`` never traces them.

A hook on a compiled model's root would otherwise be traced by dynamo with the rest of the
forward: a hook that starts or stops collection runs the debugger's whole lifecycle on fake
tensors and crashes the compile. These run at a graph break at the model's edge, on the real
tensors (measured: the compiled program between the edges is unchanged, bit for bit, also under
bf16 autocast; docs/distributed-and-compiled.md). Under ``fullgraph=True`` they cannot run and
are skipped.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, List, Optional


def _outside_graph(model: Any) -> Optional[Callable]:
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(model, torch.nn.Module):
        return None
    from .backends.torch.compiled import outside_graph

    return lambda fn: outside_graph(fn, graph_breaks=True)


def forward_hooks(model: Any, pre: Optional[Callable] = None, post: Optional[Callable] = None, *,
                  on: Any = None, pre_with_kwargs: bool = False, prepend: bool = False,
                  always_call: bool = True) -> List[Any]:
    """Register `pre` (a forward pre-hook) on `model` and `post` (a forward hook) on `on`
    (default: `model`); returns their removable handles."""
    wrap = _outside_graph(model) or (lambda fn: fn)
    handles = []
    if pre is not None:
        kw = {"with_kwargs": True} if pre_with_kwargs else {}
        if prepend:
            kw["prepend"] = True
        handles.append(model.register_forward_pre_hook(wrap(pre), **kw))
    if post is not None:
        handles.append((on if on is not None else model).register_forward_hook(wrap(post), always_call=always_call))
    return handles
