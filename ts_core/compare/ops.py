"""What tsprobe knows about ops, as data: what a call does to values by its op name, which ops
compute the same kind of thing, and the torch <-> MindSpore vocabulary.

One home for op knowledge: alignment (``align/``) and the first-divergence walk (``explain/``)
read these sets; the vocabulary file ``backends/mindspore/torch_mapping.yaml`` (its header
documents every section) is read only through ``load_mapping``.
"""
from __future__ import annotations

import os
from typing import Dict, Optional

# What a call does to values, by the lower-cased op name (``reshape`` of ``Tensor.reshape``,
# ``Primitive.reshape.Reshape``; ``to`` of ``Tensor.to``).
QUERY_OPS = frozenset("""shape size dim numel ndim rank dynamicshape tensorshape __len__ is_contiguous
is_floating_point is_complex get_device element_size nelement stride data_ptr""".split())
VIEW_OPS = frozenset("""view reshape flatten unflatten squeeze unsqueeze expand expand_as broadcast_to view_as
reshape_as contiguous transpose permute t swapaxes swapdims movedim moveaxis clone detach copy identity ravel
expanddims broadcastto flatten_ alias atleast_1d atleast_2d atleast_3d squeeze_ unsqueeze_ transpose_ t_ mt
adjoint numpy tensor_copy""".split())
SHAPE_CONST_OPS = frozenset("zeros_like ones_like empty_like".split())    # values from the input's shape only
CAST_OPS = frozenset("to float double half bfloat16 type type_as astype cast cpu cuda npu".split())
# Ops whose outputs hold only values of their inputs, selected, split or joined (their gradients
# too): no arithmetic, so they cannot introduce an error. msprobe's default risk level leaves
# several of them out of its dumps.
MOVE_OPS = frozenset("""split chunk unbind tensor_split split_with_sizes cat concat concatenate stack hstack vstack
dstack __getitem__ getitem narrow select slice stridedslice flip roll""".split())

STRUCTURAL_OPS = QUERY_OPS | VIEW_OPS | MOVE_OPS | SHAPE_CONST_OPS

# Ops the diagnosis reads by kind (``explain/diagnosis.py``), by the lower-cased op name.
# Random ops: their output depends on a generator's stream (acc-check's ``random_apis`` list,
# less the allocators whose output is uninitialised memory rather than random numbers).
RANDOM_OPS = frozenset("""dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout rand rand_like
randn randn_like randint randint_like randperm normal normal_ bernoulli bernoulli_ multinomial uniform_ exponential_
random_ cauchy_ log_normal_ geometric_ rrelu rrelu_ gumbel_softmax poisson native_dropout""".split())
ADD_OPS = frozenset("add radd iadd add_ __add__ __radd__ __iadd__ biasadd".split())
SUB_OPS = frozenset("sub rsub isub sub_ __sub__ __rsub__ __isub__".split())
MUL_OPS = frozenset("mul rmul imul mul_ __mul__ __rmul__ __imul__".split())
DIV_OPS = frozenset("div truediv rdiv itruediv div_ __truediv__ __rtruediv__ __itruediv__ __div__ realdiv".split())
CLAMP_OPS = frozenset("clamp clamp_min clamp_ clip maximum".split())
# Words in an op or module name that mark an activation, and a normalisation (word -> the
# statistic it normalises by: rms, layer, batch, or "" for one the refit does not know).
ACTIVATION_WORDS = ("gelu", "silu", "swish", "relu", "sigmoid", "tanh", "elu", "mish", "softplus", "hardswish",
                    "act")
NORM_WORDS = (("rms", "rms"), ("layernorm", "layer"), ("layer_norm", "layer"), ("batchnorm", "batch"),
              ("batch_norm", "batch"), ("groupnorm", ""), ("group_norm", ""), ("instancenorm", ""), ("norm", ""))


def is_random(op: str) -> bool:
    """``Functional.dropout`` / ``Torch.bernoulli`` / ``Tensor.uniform_``: a random op."""
    return op.rsplit(".", 1)[-1].lower() in RANDOM_OPS or "dropout" in op.lower()

# Ops of another name (another framework's, a fused form) that compute the same kind of thing:
# alignment scores a pair of one family as related ops.
_FAMILY = {"biasadd": "add", "realdiv": "div", "truediv": "div", "mm": "matmul", "bmm": "matmul",
           "batchmatmul": "matmul", "dense": "linear", "addmm": "linear", "fastgelu": "gelu",
           "reducesum": "sum", "reducemean": "mean", "concat": "cat", "square": "pow",
           "scaleddotproductattention": "attention", "flashattentionscore": "attention",
           "softmaxcrossentropywithlogits": "crossentropy", "sparsesoftmaxcrossentropywithlogits": "crossentropy"}


def op_family(op: str) -> str:
    """``__rmul__``/``mul_``/``Mul`` -> ``mul``; ``BiasAdd`` -> ``add``: ops that compute the same kind of thing."""
    core = op.lower()
    if core.startswith("__") and core.endswith("__") and len(core) > 5 and core[2] in "ri" \
            and core[3:-2] in ("add", "sub", "mul", "div", "truediv", "matmul", "pow", "and", "or", "xor", "mod"):
        core = core[3:-2]
    core = core.strip("_").replace("_", "")
    return _FAMILY.get(core, core)


MAPPING_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "backends", "mindspore", "torch_mapping.yaml")
_cache: Dict[str, dict] = {}


def load_mapping(path: Optional[str] = None) -> dict:
    """The torch <-> MindSpore vocabulary (``torch_mapping.yaml``, or a user's file), read once."""
    import yaml

    path = path or MAPPING_PATH
    if path not in _cache:
        with open(path, encoding="utf-8") as f:
            _cache[path] = yaml.safe_load(f) or {}
    return _cache[path]
