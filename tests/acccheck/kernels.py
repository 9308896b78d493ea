"""Custom "kernels" for the acc-check tests: one faithful, two deliberately inaccurate.

Registered with ``register_custom_api(kernels, NAME)``, their records are keyed
``tests.acccheck.kernels.NAME``: acc-check imports them from there, or grades them against a
reference (``--reference tests.acccheck.kernels.NAME=torch.nn.functional.gelu``).
"""
import torch


def tanh_gelu(x):
    """GELU, tanh approximation (what torch.nn.functional.gelu(approximate="tanh") computes),
    in float32 inside as a fused kernel would: faithful."""
    y = x.float()
    return (0.5 * y * (1.0 + torch.tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)))).to(x.dtype)


def wrong_gelu(x):
    """The same kernel with a wrong constant (0.75 instead of sqrt(2/pi) = 0.7979)."""
    y = x.float()
    return (0.5 * y * (1.0 + torch.tanh(0.75 * (y + 0.044715 * y * y * y)))).to(x.dtype)


def layer_norm(x, weight, bias, eps=1e-5):
    """The reference for fp8_layer_norm: the same signature, torch's layer norm."""
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)


def fp8_layer_norm(x, weight, bias, eps=1e-5):
    """A layer norm that rounds its input through float8 first: lower precision than its dtype."""
    x8 = x.to(torch.float8_e4m3fn).to(x.dtype)
    return torch.nn.functional.layer_norm(x8, x.shape[-1:], weight, bias, eps)


def row_sum_sq(x):
    """Sum of squares over the last dimension, accumulated one element at a time in x's dtype."""
    acc = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for i in range(x.shape[-1]):
        acc = acc + x[..., i] * x[..., i]
    return acc
