"""What a localisation case is and where its bug lives, as plain data.

A *case* is one (pair kind, model family, variant, level): a golden program and a target
program that differ by one injected bug (or by nothing that changes the math: a clean
variant). Its expected place is written here by hand, from where the bug was put, never from
what the compare tool prints: the module path(s) whose code holds the bug and, for levels that
record API calls, the op name(s) that introduce the error. Op names are written as *concepts*
(``"linear"``) that expand to the key names both frameworks use (``Functional.linear``,
``Primitive.*.MatMul``, ...), or as literal fnmatch patterns over a key's name (a key without
its call counter and direction, e.g. ``Tensor.__mul__``).
"""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Dict, Optional, Tuple

LEVELS = ("L0", "L1", "mix")
PAIRS = ("torch-torch", "torch-ms")
TASKS = ("tensor", "statistics")

# Bug kinds (the injected one-line mistakes) and clean kinds (no math change). Each family
# says which of them it carries and where.
BUG_KINDS: Dict[str, str] = {
    "transposed_weight": "a weight copied with the wrong layout (transposed / permuted blocks)",
    "perturbed_weight": "one weight element changed",
    "cancelled_weight_row": "a constant added to one weight row fed by a LayerNorm: the output does not change",
    "wrong_eps": "a normalisation epsilon changed",
    "missing_scale": "a scale factor dropped (attention 1/sqrt(d), router renormalisation, ...)",
    "wrong_scale": "a scale factor with the wrong value",
    "gelu_tanh": "GELU with the tanh approximation instead of the exact erf form",
    "padding_mode": "a convolution's padding mode changed (zeros -> reflect/replicate)",
    "wrong_axis": "a reduction or softmax over the wrong axis",
    "dropped_residual": "a residual connection left out",
    "swapped_operands": "the operands of a non-commutative op exchanged",
    "custom_backward": "a custom autograd backward that computes the wrong gradient",
    "bf16_op": "one op run in bfloat16 (autocast / a cast) while the rest is float32",
    "off_by_one": "an index, position or mask boundary off by one",
    "wrong_reduction": "a loss reduced by sum where mean was meant (a constant factor)",
    "silu_approx": "hard SiLU (hardswish) where SiLU was meant",
    "perturbed_input": "one model input element changed (a data pipeline difference)",
    "nondeterministic": "a random op (dropout) not seeded alike: golden differs from its own rerun",
    "wrong_mask": "an attention mask that lets each token see the next one",
    "kv_offset": "positions offset as if a KV cache of one token were there",
    "rope_theta": "a rotary embedding with another base (rope_theta 500000 instead of 10000)",
    "label_smoothing": "a cross-entropy with label smoothing where golden has none",
    "untied_weights": "an LM head that keeps its own copy of the token embedding (weight tying broken)",
    "loss_scale": "gradients unscaled by another factor than the loss was scaled with (fp16 loss scale)",
    "clip_value": "gradients clipped by value where golden clips their total norm",
}
# The cause the diagnosis (compare/explain/diagnosis.py) should name first for a bug kind; kinds
# not listed have no cause hypothesis of their own (their diagnosis is reported, not scored).
EXPECTED_CAUSE: Dict[str, Tuple[str, ...]] = {
    "transposed_weight": ("transposed_weight",),
    "perturbed_weight": ("parameter_differs",),
    "cancelled_weight_row": ("parameter_differs",),
    "wrong_eps": ("norm_eps",),
    "missing_scale": ("constant_scale",),
    "wrong_scale": ("constant_scale",),
    "wrong_reduction": ("constant_scale",),
    "gelu_tanh": ("activation_approx",),
    "silu_approx": ("activation_approx",),
    "padding_mode": ("padding_border",),
    "wrong_axis": ("reduction_axis",),
    "dropped_residual": ("dropped_residual",),
    "bf16_op": ("precision",),
    "perturbed_input": ("input_differs",),
    "nondeterministic": ("nondeterminism",),
    "wrong_mask": ("argument_differs",),
    "kv_offset": ("extra_call", "argument_differs"),    # the queries get a position table of their own
    "rope_theta": ("input_differs", "parameter_differs"),
    "label_smoothing": ("argument_differs",),
    "loss_scale": ("constant_scale",),
}
HIGH_CONFIDENCE = 0.8      # a clean pair must get no cause at or above this

CLEAN_KINDS: Dict[str, str] = {
    "same": "the same program run twice",
    "noop": "extra no-op calls (.contiguous(), .view(), .clone(), .float() on float32)",
    "decomp": "the same op computed through a different decomposition",
    "reorder": "independent ops run in another order",
    "noise": "a mathematically equal computation in another order (float rounding only)",
    "port": "a faithful MindSpore port (torch<->MindSpore pairs)",
    "port_cells": "a faithful MindSpore port through MindSpore's loss Cells (nn.MSELoss, ...) instead of its functions",
}

# Concepts -> fnmatch patterns over key names, torch and MindSpore vocabulary together.
_T = "Tensor.__{0}__ Tensor.__r{0}__ Tensor.__i{0}__ Tensor.{0} Tensor.{0}_ Torch.{0} Functional.{0} Mint.{0}"
OP_CONCEPTS: Dict[str, Tuple[str, ...]] = {
    "linear": ("Functional.linear", "Functional.dense", "MintFunctional.linear", "Primitive.*.MatMul",
               "Primitive.*.BiasAdd", "Primitive.*.Dense"),
    "matmul": ("Torch.matmul", "Tensor.matmul", "Tensor.__matmul__", "Tensor.__rmatmul__", "Torch.bmm", "Tensor.bmm",
               "Functional.matmul", "Mint.matmul", "Mint.bmm", "Functional.bmm", "Primitive.*.MatMul",
               "Primitive.*.BatchMatMul"),
    "layer_norm": ("Functional.layer_norm", "MintFunctional.layer_norm", "Primitive.*.LayerNorm*"),
    "batch_norm": ("Functional.batch_norm", "MintFunctional.batch_norm", "Primitive.*.BatchNorm*"),
    "conv": ("Functional.conv2d", "Torch.conv2d", "Functional.conv_transpose2d", "Torch.conv_transpose2d",
             "Primitive.*.Conv2D*", "Primitive.*.Conv2DTranspose", "Primitive.*.Conv2DBackpropInput",
             "Primitive.*.BiasAdd", "Functional.conv2d_transpose"),
    "pad": ("Functional.pad", "Torch.constant_pad_nd", "MintFunctional.pad", "Primitive.*.Pad*",
            "Primitive.*.MirrorPad", "Primitive.*.ReflectionPad*", "Primitive.*.ReplicationPad*"),
    "gelu": ("Functional.gelu", "MintFunctional.gelu", "Primitive.*.GeLU", "Primitive.*.FastGeLU", "Functional.fast_gelu"),
    "silu": ("Functional.silu", "MintFunctional.silu", "Primitive.*.SiLU", "Functional.hardswish",
             "MintFunctional.hardswish", "Primitive.*.HSwish"),
    "dropout": ("Functional.dropout", "Torch.dropout", "MintFunctional.dropout", "Primitive.*.Dropout*"),
    "loss": ("Functional.mse_loss", "Functional.cross_entropy", "Functional.smooth_l1_loss", "Functional.kl_div",
             "Functional.nll_loss", "Functional.log_softmax"),
    "sigmoid": ("Torch.sigmoid", "Tensor.sigmoid", "Functional.sigmoid", "Mint.sigmoid", "Primitive.*.Sigmoid"),
    "tanh": ("Torch.tanh", "Tensor.tanh", "Functional.tanh", "Mint.tanh", "Primitive.*.Tanh"),
    "relu": ("Torch.relu", "Tensor.relu", "Functional.relu", "Functional.relu_", "Torch.relu_", "Tensor.relu_",
             "Mint.relu", "MintFunctional.relu", "Primitive.*.ReLU"),
    "softmax": ("Functional.softmax", "Torch.softmax", "Tensor.softmax", "Mint.softmax", "MintFunctional.softmax",
                "Primitive.*.Softmax"),
    "mul": tuple(_T.format("mul").split()) + ("Primitive.*.Mul",),
    "div": tuple(_T.format("truediv").split()) + ("Torch.div", "Tensor.div", "Tensor.div_", "Functional.div",
                                                   "Mint.div", "Primitive.*.Div", "Primitive.*.RealDiv"),
    "add": tuple(_T.format("add").split()) + ("Primitive.*.Add",),
    "sub": tuple(_T.format("sub").split()) + ("Torch.rsub", "Primitive.*.Sub"),
    "neg": ("Tensor.__neg__", "Torch.neg", "Tensor.neg", "Functional.neg", "Primitive.*.Neg"),
    "pow": ("Tensor.pow", "Tensor.__pow__", "Torch.pow", "Functional.pow", "Mint.pow", "Primitive.*.Pow",
            "Primitive.*.Square", "Functional.square"),
    "mean": ("Tensor.mean", "Torch.mean", "Functional.mean", "Mint.mean", "Primitive.*.ReduceMean"),
    "sum": ("Tensor.sum", "Torch.sum", "Functional.sum", "Mint.sum", "Primitive.*.ReduceSum"),
    "rsqrt": ("Torch.rsqrt", "Tensor.rsqrt", "Functional.rsqrt", "Mint.rsqrt", "Primitive.*.Rsqrt"),
    "embedding": ("Functional.embedding", "MintFunctional.embedding", "Primitive.*.Gather", "Functional.gather"),
    "index": ("Tensor.__getitem__", "Tensor.__setitem__", "Tensor.narrow", "Torch.narrow", "Tensor.select",
              "Torch.index_select", "Primitive.*.StridedSlice", "Functional.gather", "Primitive.*.Gather"),
    "cat": ("Torch.cat", "Torch.concat", "Functional.cat", "Functional.concat", "Mint.cat", "Primitive.*.Concat"),
    "rotary": ("Torch.cos", "Torch.sin", "Tensor.cos", "Tensor.sin", "Functional.cos", "Functional.sin",
               "Primitive.*.Cos", "Primitive.*.Sin", "Torch.outer", "Torch.arange", "Tensor.__getitem__"),
    "mask": ("Tensor.masked_fill", "Tensor.masked_fill_", "Torch.masked_fill", "Functional.masked_fill",
             "Primitive.*.MaskedFill", "Torch.where", "Functional.where", "Torch.triu", "Tensor.triu",
             "Functional.triu", "Torch.tril", "Functional.tril", "Tensor.__lt__", "Tensor.__ge__", "Tensor.__gt__",
             "Tensor.__le__", "Tensor.__eq__"),
    "topk": ("Torch.topk", "Tensor.topk", "Functional.topk", "Mint.topk", "Primitive.*.TopK"),
    "clamp": ("Torch.clamp", "Tensor.clamp", "Tensor.clamp_", "Torch.clip", "Tensor.clip", "Functional.clamp",
              "Primitive.*.ClipByValue"),
    "downcast": ("Tensor.to", "Tensor.bfloat16", "Tensor.half", "Tensor.type", "Tensor.astype", "Functional.cast",
                 "Primitive.*.Cast"),
    "upsample": ("Functional.interpolate", "Functional.upsample", "Functional.upsample_nearest",
                 "MintFunctional.interpolate", "Functional.interpolate", "Primitive.*.ResizeNearestNeighbor*",
                 "Primitive.*.UpsampleNearest*"),
    "lstm": ("Torch.lstm", "VF.lstm", "Functional.lstm", "Primitive.*.LSTM", "Primitive.*.DynamicRNN"),
    "gru": ("Torch.gru", "VF.gru", "Functional.gru", "Primitive.*.GRU*", "Primitive.*.DynamicGRU*"),
    "sdpa": ("Functional.scaled_dot_product_attention", "MintFunctional.scaled_dot_product_attention"),
}


def expand_ops(ops: Tuple[str, ...]) -> Tuple[str, ...]:
    """Concept names -> their patterns; anything else is taken as a pattern already."""
    out = []
    for op in ops:
        out.extend(OP_CONCEPTS.get(op, (op,)))
    return tuple(dict.fromkeys(out))


def op_matches(name: str, ops: Tuple[str, ...]) -> bool:
    """Does a key name (no counter, no direction) match one of the expected ops?"""
    return any(fnmatchcase(name, pattern) for pattern in expand_ops(ops))


OUTSIDE = None      # a module "path" for calls made outside the model (the training loop's own ops)


@dataclass(frozen=True)
class Place:
    """Where a bug lives. ``modules``: acceptable module paths, relative to the family's model
    ("" is the model's own forward). ``ops``: acceptable ops (concepts or patterns) for levels
    that record API calls. ``param``: the bug is a parameter value, so at mix the record of
    the module holding the parameter is an acceptable answer as well as the op consuming it.
    ``direction``: where the error is first computed (forward or backward)."""

    modules: Tuple[str, ...]
    ops: Tuple[str, ...] = ()
    param: bool = False
    direction: str = "forward"
    note: str = ""


def P(modules, ops=(), **kw) -> Place:
    """Short constructor: P("attn.q", "linear") or P(("attn", "attn.o"), ("mul", "softmax"))."""
    mods = (modules,) if isinstance(modules, str) or modules is OUTSIDE else tuple(modules)
    ops_t = (ops,) if isinstance(ops, str) else tuple(ops)
    return Place(mods, ops_t, **kw)


@dataclass(frozen=True)
class WeightEdit:
    """A bug made by editing one parameter array (applied in numpy, so the torch target and the
    MindSpore port receive the same edit). ``param``: the torch state_dict name relative to the
    family model; ``how``: transpose (last two axes) | perturb (one element) | cancel_row
    (a constant added to one row) | swap_blocks (first two quarter-blocks of axis 0: LSTM gates)."""

    param: str
    how: str


@dataclass
class Case:
    pair: str                  # torch-torch | torch-ms
    family: str
    variant: str               # a bug kind or "clean_<kind>"
    level: str
    place: Optional[Place]     # None for a clean pair
    task: str = "tensor"

    @property
    def clean(self) -> bool:
        return self.place is None

    @property
    def id(self) -> str:
        return f"{self.pair}/{self.family}/{self.variant}/{self.level}/{self.task}"
