"""Where msprobe (26.2, PyTorch) records a value differently from tsprobe in the same run, so
that a same-run pair of an msprobe and a tsprobe dump compares clean and each such place is
counted and said in one line, never reported as a finding. Measured on tiny GPT-2, Llama and
BERT LMs, one training step (tests/compare/test_msprobe_interop.py):

- *inner-node gradients*: msprobe reads an API's input gradients from a hook on its output's
  ``grad_fn``. For a composite API that node is an inner one: ``F.cross_entropy``'s is
  ``NllLossBackward``, so msprobe records the gradient with respect to ``log_softmax``'s output,
  not the logits (same shape, other values); the next backward record downstream (the logits'
  producer) agrees on both sides. Those input gradients are not compared;
- *keyword inputs*: a module called with keyword tensors (``hidden_states=``, transformers 5)
  gets no input gradient from torch's full backward hook: msprobe writes ``output: []`` where
  tsprobe records the gradient of each grad-requiring input;
- *in-place checksums*: msprobe's ``md5`` of an in-place API's target (``p.add_(g)``: the
  parameter) is taken after the op ran (mostly equal to the output's), while its statistics are
  of the value before; that checksum is dropped;
- *gradients that reach a module output from inside it only*: a module returning a tensor that
  it also uses itself (BERT's attention probabilities) gets ``null`` in msprobe's backward
  ``input`` (nothing reached it from outside); tsprobe records that tensor's gradient. Not
  compared (``msprobe_pairs.unreached``);
- *module backward hooks* (levels mix and L0): torch's full backward hooks sum a tensor's
  gradient contributions in another order, so msprobe's gradients differ from a run without it
  in the last bits (15 of 21 parameter gradients of the tiny Llama, none at L1): checksums of
  values computed from the backward pass on are not compared with another tool's, their
  statistics are;
- *calls msprobe does not record* (``msprobe_api.py``): counted apart by the pipeline.
"""
from __future__ import annotations

from typing import Any, Dict, List

from ...dumpfmt import BACKWARD, is_tensor_summary, parse_key
from ...dumpfmt.records import flatten

# API -> the inner node msprobe hooks: composite functionals in msprobe's list whose output's
# grad_fn does not take the call's input, while the gradient it passes on has the input's shape
# (so no shape check can tell; checked with torch 2.13's autograd graph). Composites whose
# inner gradient has another shape or count (kl_div, normalize, cosine_similarity, 3-D linear)
# are left unplaced by autograd_order.py's shape rule instead.
INNER_NODE_APIS = {
    "cross_entropy": "NllLossBackward: the gradient with respect to log_softmax's output, not the logits",
    "l1_loss": "MeanBackward: the gradient with respect to |input - target|",
    "softmin": "SoftmaxBackward: the gradient with respect to -input",
    "poisson_nll_loss": "MeanBackward: the gradient with respect to the elementwise loss",
    "hinge_embedding_loss": "MeanBackward: the gradient with respect to the elementwise loss",
    "margin_ranking_loss": "MeanBackward: the gradient with respect to the clamped margin",
    "gaussian_nll_loss": "MeanBackward: the gradient with respect to the elementwise loss",
}


def inner_node_records(data: Dict[str, Any]) -> Dict[str, str]:
    """Backward API keys of an msprobe dump whose input gradients were taken at an inner node -> why."""
    out = {}
    for key, record in data.items():
        info = parse_key(key)
        why = INNER_NODE_APIS.get(info.api_name) if info.kind == "api" and info.direction == BACKWARD else None
        if why and isinstance(record, dict) and record.get("output"):
            out[key] = why
    return out


def keyword_input_modules(data: Dict[str, Any]) -> List[str]:
    """Module backward keys with ``output: []`` whose forward took grad-requiring tensors as keywords."""
    out = []
    for key, record in data.items():
        info = parse_key(key)
        if info.kind != "module" or info.direction != BACKWARD or not isinstance(record, dict) or record.get("output"):
            continue
        forward = data.get(info.forward_key)
        kwargs = forward.get("input_kwargs") if isinstance(forward, dict) else None
        if any(is_tensor_summary(leaf) and leaf.get("requires_grad") for _, leaf in flatten(kwargs, "")):
            out.append(key)
    return out


def drop_inplace_checksums(data: Dict[str, Any]) -> int:
    """Drop msprobe's checksum of an in-place API's target (``p`` of ``p.add_(g)``): it is taken
    after the op ran (on the tiny Llama: 18 of 21 equal the output's, 1 matches neither the value
    before nor after), while the statistics are of the value before. Returns how many; mutates `data`."""
    n = 0
    for key, record in data.items():
        info = parse_key(key)
        name = info.api_name
        if info.kind != "api" or info.direction == BACKWARD or not isinstance(record, dict) \
                or not (name.endswith("_") and not name.endswith("__") or name.startswith("__i")):
            continue
        args = record.get("input_args") or []
        if args and is_tensor_summary(args[0]) and args[0].get("md5") is not None:
            args[0] = {k: v for k, v in args[0].items() if k != "md5"}
            n += 1
    return n


def drop_checksums_from_backward(data: Dict[str, Any]) -> int:
    """Drop every checksum of the records from the first backward record on (msprobe's mix/L0
    gradients are not bit-identical to a run without it); returns how many. Mutates `data`."""
    n, started = 0, False
    for key in list(data):
        record = data[key]
        started = started or parse_key(key).direction == BACKWARD
        if not started or not isinstance(record, dict):
            continue
        new, dropped = _without_md5(record)
        if dropped:
            data[key], n = new, n + dropped
    return n


def _without_md5(obj: Any):
    if isinstance(obj, dict):
        if is_tensor_summary(obj):
            return ({k: v for k, v in obj.items() if k != "md5"}, 1) if "md5" in obj else (obj, 0)
        pairs = {k: _without_md5(v) for k, v in obj.items()}
        return {k: v for k, (v, _) in pairs.items()}, sum(d for _, d in pairs.values())
    if isinstance(obj, list):
        pairs = [_without_md5(v) for v in obj]
        return [v for v, _ in pairs], sum(d for _, d in pairs)
    return obj, 0


__all__ = ["INNER_NODE_APIS", "drop_checksums_from_backward", "drop_inplace_checksums", "inner_node_records",
           "keyword_input_modules"]
