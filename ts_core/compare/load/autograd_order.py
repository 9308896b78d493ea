"""msprobe's backward records read in tsprobe's order.

A backward record's ``output`` holds the gradients of the call's inputs. tsprobe writes them in
the forward call's argument order, one per grad-requiring tensor input. msprobe (26.2) reads them
from a hook on the output's ``grad_fn``, so they come in autograd's order of that node's inputs
(docs/msprobe-format.md §4). For most ops the two orders agree (conv, layer_norm, 2-D matmul,
embedding, element-wise ops). They differ for:

- ``F.linear`` of a 2-D input: addmm's ``(bias, input, weight^T)``, or mm's ``(input, weight^T)``
  without a bias: the weight's gradient is recorded transposed;
- a call whose result autograd reshaped (``linear``/``matmul`` of a 3-D input): the one value is
  the gradient of an internal 2-D result, no input of the call at all.

Values paired by position would then compare a bias gradient with an input gradient. ``reorder``
rewrites msprobe's records into tsprobe's order; a record whose gradients cannot be placed keeps
none of them and is listed as *unplaced*: its input gradients are not compared (the gradients the
call received, ``input``, still are).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

from ...dumpfmt import BACKWARD, is_tensor_summary, parse_key
from ...dumpfmt.dtypes import is_exact
from ...dumpfmt.records import flatten
from .msprobe_conventions import drop_inplace_checksums, inner_node_records, keyword_input_modules

_PROC = re.compile(r"^proc\d+$")


@dataclass
class Reordered:
    """A dump's records with msprobe's backward gradients in tsprobe's order."""

    data: Dict[str, Any]
    transposed: Set[str] = field(default_factory=set)    # data_names whose file holds the value transposed
    unplaced: Set[str] = field(default_factory=set)      # backward keys whose input gradients were dropped
    msprobe: bool = False
    inner: Dict[str, str] = field(default_factory=dict)   # of unplaced: taken at an inner autograd node -> why
    keyword_modules: List[str] = field(default_factory=list)   # of unplaced: a module's keyword inputs
    inplace_checksums: int = 0                            # in-place inputs' checksums msprobe took after the op
    unreached: int = 0                                    # module output gradients msprobe wrote null (compare counts)


def _is_float(leaf: dict) -> bool:
    return not is_exact(leaf.get("dtype"))


def _grad_inputs(forward: dict) -> Optional[List[dict]]:
    """The forward call's tensor inputs that get a gradient, in argument order; None when the
    record does not say which require one."""
    leaves = [leaf for section in ("input_args", "input_kwargs") for _, leaf in flatten(forward.get(section), "")
              if is_tensor_summary(leaf)]
    if any(not isinstance(leaf.get("requires_grad"), bool) for leaf in leaves):
        return None
    return [leaf for leaf in leaves if leaf["requires_grad"] and _is_float(leaf)]


def _shape(leaf: Optional[dict]) -> Optional[list]:
    return list(leaf["shape"]) if is_tensor_summary(leaf) and isinstance(leaf.get("shape"), list) else None


def _fits(got: Optional[dict], want: Optional[dict], transposed: bool = False) -> bool:
    """Is `got` (None: no gradient) a gradient for the input `want` (None: no such input)?"""
    if got is None or want is None:
        return got is None or (want is not None and not want.get("requires_grad"))
    s = _shape(want)
    return s is not None and _shape(got) == (s[::-1] if transposed else s)


def _linear(forward: dict, grads: list) -> Optional[List[Tuple[Optional[dict], bool]]]:
    """addmm/mm's order of ``F.linear(x, W, b)`` on a 2-D x: (gradient, transposed) per input
    in argument order, or None when `grads` is not in that order."""
    args = [leaf for _, leaf in flatten(forward.get("input_args"), "")]
    kwargs = forward.get("input_kwargs") or {}
    x, w = (args + [None, None])[:2]
    b = args[2] if len(args) > 2 else kwargs.get("bias")
    if not (is_tensor_summary(x) and is_tensor_summary(w)) or len(_shape(x) or []) != 2:
        return None
    if is_tensor_summary(b):
        if len(grads) != 3 or not (_fits(grads[0], b) and _fits(grads[1], x) and _fits(grads[2], w, True)):
            return None
        by_input = [(grads[1], False), (grads[2], True), (grads[0], False)]
        inputs = [x, w, b]
    else:
        if len(grads) != 2 or not (_fits(grads[0], x) and _fits(grads[1], w, True)):
            return None
        by_input = [(grads[0], False), (grads[1], True)]
        inputs = [x, w]
    return [g for g, leaf in zip(by_input, inputs) if leaf.get("requires_grad") and _is_float(leaf)]


def _argument_order(forward: dict, grads: list) -> bool:
    """Are the recorded gradients one per grad-requiring input, in argument order?"""
    want = _grad_inputs(forward)
    got = [g for g in grads if g is not None]
    return want is not None and len(got) == len(want) and all(_shape(g) == _shape(w) for g, w in zip(got, want))


def _transposed_leaf(leaf: dict, transposed: Set[str]) -> dict:
    out = dict(leaf, shape=_shape(leaf)[::-1])
    out.pop("md5", None)            # a checksum of the transposed bytes says nothing about these
    if leaf.get("data_name"):
        transposed.add(str(leaf["data_name"]))
    return out


def _backward_api(data: Dict[str, Any]):
    for key, record in data.items():
        info = parse_key(key)
        if info.kind != "api" or info.direction != BACKWARD or not isinstance(record, dict):
            continue
        forward = data.get(info.forward_key)
        grads = record.get("output")
        if isinstance(forward, dict) and isinstance(grads, list):
            yield key, info, record, forward, grads


def written_by_msprobe(path: Path, rank: str, data: Dict[str, Any]) -> bool:
    """msprobe's own signs: a ``proc<PID>`` rank folder, ``.pt`` tensor files, ``indent=1`` JSON,
    or a linear gradient recorded in addmm's order."""
    if _PROC.match(rank or ""):
        return True
    try:
        with open(path, "rb") as f:
            if f.read(3) == b'{\n ':
                return True
    except OSError:
        pass
    for key, info, record, forward, grads in _backward_api(data):
        if any(is_tensor_summary(g) and str(g.get("data_name", "")).endswith(".pt") for g in grads):
            return True
        if info.api_name == "linear" and _linear(forward, grads) is not None and not _argument_order(forward, grads):
            return True
    return False


def reorder(path: Path, rank: str, framework: str, data: Dict[str, Any]) -> Reordered:
    """`data` with msprobe's backward gradients in tsprobe's order (unchanged for tsprobe's own
    dumps and for MindSpore)."""
    if framework not in ("", "pytorch") or not written_by_msprobe(path, rank, data):
        return Reordered(data)
    out = Reordered(dict(data), msprobe=True)
    for key, info, record, forward, grads in _backward_api(data):
        placed = _linear(forward, grads) if info.api_name == "linear" else None
        if placed is not None:
            new = [_transposed_leaf(g, out.transposed) if t and g is not None else g for g, t in placed]
        elif _argument_order(forward, grads):
            new = [g for g in grads if g is not None]
        else:
            new = []
            out.unplaced.add(key)
        if new != grads:
            out.data[key] = dict(record, output=new)
    out.inner = inner_node_records(out.data)         # msprobe_conventions.py: the other recording conventions
    for key in out.inner:
        out.data[key] = dict(out.data[key], output=[])
    out.keyword_modules = keyword_input_modules(out.data)
    out.unplaced |= set(out.inner) | set(out.keyword_modules)
    out.inplace_checksums = drop_inplace_checksums(out.data)
    return out


__all__ = ["Reordered", "reorder", "written_by_msprobe"]
