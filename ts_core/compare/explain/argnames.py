"""Names of the positional arguments of the ops whose arguments the diagnosis quotes (the dump
records ``Functional.layer_norm``'s eps as ``input.4``; people call it eps)."""
from __future__ import annotations

from typing import Dict, Tuple

POSITIONAL: Dict[str, Tuple[str, ...]] = {
    "layer_norm": ("input", "normalized_shape", "weight", "bias", "eps"),
    "rms_norm": ("input", "normalized_shape", "weight", "eps"),
    "group_norm": ("input", "num_groups", "weight", "bias", "eps"),
    "batch_norm": ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
    "instance_norm": ("input", "running_mean", "running_var", "weight", "bias", "use_input_stats", "momentum",
                      "eps"),
    "softmax": ("input", "dim"), "log_softmax": ("input", "dim"),
    "mean": ("input", "dim", "keepdim"), "sum": ("input", "dim", "keepdim"), "amax": ("input", "dim", "keepdim"),
    "cumsum": ("input", "dim"),
    "gelu": ("input", "approximate"),
    "pad": ("input", "pad", "mode", "value"),
    "conv1d": ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
    "conv2d": ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
    "conv3d": ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
    "linear": ("input", "weight", "bias"),
    "dropout": ("input", "p", "training", "inplace"),
    "interpolate": ("input", "size", "scale_factor", "mode", "align_corners"),
    "mse_loss": ("input", "target", "size_average", "reduce", "reduction"),
    "cross_entropy": ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction"),
}


def op_short(name: str) -> str:
    """``Functional.layer_norm`` -> ``layer_norm``; ``Tensor.__add__`` -> ``add``; ``Tensor.add_`` -> ``add``."""
    s = name.rsplit(".", 1)[-1]
    return s.strip("_") if s.startswith("__") else s.rstrip("_")


def arg_label(op_name: str, arg: str) -> str:
    """``input.4`` of ``Functional.layer_norm`` -> ``eps``; ``input.approximate`` -> ``approximate``;
    anything unknown stays as recorded."""
    head, _, rest = arg.partition(".")
    if head != "input" or not rest:
        return arg
    if not rest.split(".")[0].isdigit():
        return rest
    names = POSITIONAL.get(op_short(op_name))
    head_i, _, tail = rest.partition(".")
    i = int(head_i)
    if not names or i >= len(names):
        return arg
    return names[i] + "".join(f"[{p}]" for p in tail.split(".") if p)     # dim=(1, 3): dim[0], dim[1]
